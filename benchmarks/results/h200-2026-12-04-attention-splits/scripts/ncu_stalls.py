import csv, gzip, sys, collections
rows = list(csv.reader(gzip.open(sys.argv[1], 'rt')))
which = int(sys.argv[2]) if len(sys.argv) > 2 else 0
# split sections
secs = []; cur = None
for r in rows:
    if r and r[0] == "Kernel Name":
        cur = [r[1], None, []]; secs.append(cur)
    elif r and r[0] == "Address":
        cur[1] = r
    elif cur is not None:
        cur[2].append(r)
name, hdr, data = secs[which]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot = collections.Counter(); ins = []
for r in data:
    if len(r) < len(hdr): continue
    s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    st = {k: int(r[ix[k]] or 0) for k in stalls}
    ins.append((r[ix['Source']].strip(), s, st, int(r[ix['Instructions Executed']] or 0)))
    tot.update(st)
T = sum(x[1] for x in ins)
print(name, "samples", T, "instrs", len(ins), "executed", sum(x[3] for x in ins))
for k, v in tot.most_common(10): print(f"  {k:24s} {100*v/T:5.1f}%")
top = sorted(range(len(ins)), key=lambda i: -ins[i][1])[:int(sys.argv[3]) if len(sys.argv) > 3 else 30]
for i in sorted(top):
    src, s, st, ex = ins[i]
    main = sorted(st.items(), key=lambda kv: -kv[1])[:2]
    print(f"{i:5d} {100*s/T:5.1f}% ex={ex:7d} {src[:58]:58s} {[(k[6:], round(100*v/T,1)) for k, v in main]}")
