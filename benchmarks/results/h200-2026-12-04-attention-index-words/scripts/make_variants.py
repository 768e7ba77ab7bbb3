"""Write diagnostic / candidate variants of ops/sparse_attention_ws_wgmma.py into OUT_DIR."""
import re, sys
from pathlib import Path

src = Path(sys.argv[1]).read_text()
out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)


def sub(text, old, new, count=1):
    assert text.count(old) >= 1, old
    return text.replace(old, new, count)


# cheap decode: 4 ALU + 2 mul an output word
DEC = '''
_DECODE_ASM = _const("""{
.reg .b32 a, b, c;
mov.b32 c, 0x88008800;
prmt.b32 a, $2, 0, 0x4140;
shl.b32 a, a, 4;
prmt.b32 b, $2, 0, 0x9484;
lop3.b32 a, b, a, c, 0x64;
mul.rn.bf16x2 a, a, $3;
mul.rn.bf16x2 $0, a, $4;
prmt.b32 a, $2, 0, 0x4342;
shl.b32 a, a, 4;
prmt.b32 b, $2, 0, 0xB4A4;
lop3.b32 a, b, a, c, 0x64;
mul.rn.bf16x2 a, a, $3;
mul.rn.bf16x2 $1, a, $4;
}""")
'''
dec = re.sub(r'\n_DECODE_ASM = _const\(.*?\+ "\}"\)\n', DEC, src, flags=re.S)
assert dec != src
dec = sub(dec, '''    s2 = (v << 7) | (v << 23)  # 2^(v - 127) twice, as bf16 bits
    lo, hi = gl.inline_asm_elementwise(_DECODE_ASM, "=r,=r,r,r", [codes, s2[:, :, None] + gl.zeros_like(codes)],
                                       dtype=(gl.int32, gl.int32), is_pure=True, pack=1)''',
'''    f1 = gl.minimum(v, 134) + 120
    f1 = (f1 << 7) | (f1 << 23)
    f2 = gl.maximum(v, 134) - 7
    f2 = (f2 << 7) | (f2 << 23)
    zero = gl.zeros_like(codes)
    lo, hi = gl.inline_asm_elementwise(_DECODE_ASM, "=r,=r,r,r,r", [codes, f1[:, :, None] + zero, f2[:, :, None] + zero],
                                       dtype=(gl.int32, gl.int32), is_pure=True, pack=1)''')
(out / "v_dec.py").write_text(dec)
(out / "v_base.py").write_text(src)

nof = sub(src, '''        fence_async_shared()
        gl.thread_barrier()  # the whole tile stored before the softmax warpgroup is told''',
'''        gl.thread_barrier()  # the whole tile stored before the softmax warpgroup is told''')
(out / "v_nofence.py").write_text(nof)

nod = sub(src, '''    lo, hi = gl.inline_asm_elementwise(_DECODE_ASM, "=r,=r,r,r", [codes, s2[:, :, None] + gl.zeros_like(codes)],
                                       dtype=(gl.int32, gl.int32), is_pure=True, pack=1)''',
'''    lo, hi = codes, codes + s2[:, :, None]''')
(out / "v_nodec.py").write_text(nod)

# timeline: clock64 stamps into DBG [T, 16] int64
tl = src
tl = sub(tl, "out_ptr, s_out, H, C, qk_scale,\n    W: gl.constexpr", "out_ptr, s_out, H, C, qk_scale, dbg,\n    W: gl.constexpr")
tl = sub(tl, "*kernel_args(q, kv, win, ring, comp, slot, picks, n_done, sink, cis_r, out, n_comp, qk_scale),",
         "*kernel_args(q, kv, win, ring, comp, slot, picks, n_done, sink, cis_r, out, n_comp, qk_scale), DBG,")
tl = sub(tl, "HALF = _const(256)", "DBG = None\nHALF = _const(256)")
tl += '''

@gjit
def _clk():
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gjit
def _clk32():
    return gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gjit
def _gtime():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gjit
def _smid():
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
'''
tl = sub(tl, "    t = gl.program_id(0)\n    gl_pdl_wait(PDL)", "    t = gl.program_id(0)\n    gl.store(dbg + t * 16 + 0, _clk())\n    gl.store(dbg + t * 16 + 12, _gtime())\n    gl.store(dbg + t * 16 + 14, _smid().to(gl.int64))\n    gl_pdl_wait(PDL)")
# roles get dbg, t
tl = sub(tl, "(_softmax_role, (q_ptr,", "(_softmax_role, (dbg, q_ptr,")
tl = sub(tl, "(_values_role, (cis_ptr,", "(_values_role, (dbg, cis_ptr,")
tl = sub(tl, "(_loader_role, (kv_ptr,", "(_loader_role, (dbg, kv_ptr,")
tl = sub(tl, "def _softmax_role(q_ptr,", "def _softmax_role(dbg, q_ptr,")
tl = sub(tl, "def _values_role(cis_ptr,", "def _values_role(dbg, cis_ptr,")
tl = sub(tl, "def _loader_role(kv_ptr,", "def _loader_role(dbg, kv_ptr,")
tl = sub(tl, "    gl.thread_barrier()  # the whole of q stored before the first MMA reads it\n",
         "    gl.thread_barrier()  # the whole of q stored before the first MMA reads it\n    gl.store(dbg + t * 16 + 1, _clk())\n    wready = t * 0\n")
tl = sub(tl, "        mbarrier.wait(bars.index(s), (i // SLOTS) & 1)  # ready[s]: tile i decoded\n",
         "        c0 = _clk32()\n        mbarrier.wait(bars.index(s), (i // SLOTS) & 1)  # ready[s]: tile i decoded\n        wready += _clk32() - c0\n        if i == 0:\n            gl.store(dbg + t * 16 + 2, _clk())\n")
tl = sub(tl, "    gl_pdl_trigger(PDL)\n    mbarrier.wait(bars.index(2 * SLOTS + 1), (n_tiles + 1) & 1)",
         "    gl.store(dbg + t * 16 + 3, _clk())\n    gl.store(dbg + t * 16 + 10, wready.to(gl.int64))\n    gl_pdl_trigger(PDL)\n    mbarrier.wait(bars.index(2 * SLOTS + 1), (n_tiles + 1) & 1)")
tl = sub(tl, """    _store_half(o, gl.convert_layout(den, gl.SliceLayout(1, o_l)), 0, t, cis_ptr, s_cis, out_ptr, s_out, H, D, DR,
                False)
""", """    _store_half(o, gl.convert_layout(den, gl.SliceLayout(1, o_l)), 0, t, cis_ptr, s_cis, out_ptr, s_out, H, D, DR,
                False)
    gl.store(dbg + t * 16 + 4, _clk())
    gl.store(dbg + t * 16 + 13, _gtime())
""")
tl = sub(tl, "    _store_half(o, den, HALF, t, cis_ptr, s_cis, out_ptr, s_out, H, D, DR, True)\n",
         "    _store_half(o, den, HALF, t, cis_ptr, s_cis, out_ptr, s_out, H, D, DR, True)\n    gl.store(dbg + t * 16 + 9, _clk())\n")
tl = sub(tl, "    comp_base = comp_ptr + gl.multiple_of(gl.load(slot_ptr + t) * sc_slot, 16)\n",
         "    gl.store(dbg + t * 16 + 5, _clk())\n    comp_base = comp_ptr + gl.multiple_of(gl.load(slot_ptr + t) * sc_slot, 16)\n")
tl = sub(tl, "    for j in range(n_tiles):\n        s = j % SLOTS\n        more = j + 1 < n_tiles\n",
         "    gl.store(dbg + t * 16 + 6, _clk())\n    wfree = (t * 0).to(gl.int64)\n    for j in range(n_tiles):\n        s = j % SLOTS\n        more = j + 1 < n_tiles\n")
tl = sub(tl, "                mbarrier.wait(bars.index(SLOTS + s), ((j // SLOTS) & 1) ^ 1, pred=j >= SLOTS)  # free[s]\n",
         "                mbarrier.wait(bars.index(SLOTS + s), ((j // SLOTS) & 1) ^ 1, pred=j >= SLOTS)  # free[s]\n")
tl = sub(tl, "        mbarrier.arrive(bars.index(s))  # ready[s]\n        cur = nxt\n",
         "        mbarrier.arrive(bars.index(s))  # ready[s]\n        if j == 0:\n            gl.store(dbg + t * 16 + 7, _clk())\n        cur = nxt\n    gl.store(dbg + t * 16 + 8, _clk())\n    gl.store(dbg + t * 16 + 11, wfree)\n")
(out / "v_tl.py").write_text(tl)
print("ok")

nol = sub(src, '''    codes = gl.load(p32[:, None, None] + ((b % 7) * 16)[None, :, None] + w[None, None, :],
                    mask=(b < 7)[None, :, None] & live)''', '''    codes = ((v & 0x7F).to(gl.int32))[:, None, None] + (b * 16)[None, :, None] + w[None, None, :]''')
nol = sub(nol, '''    rope = gl.load(rp[:, None] + gl.arange(0, 32, layout=gl.SliceLayout(0, rope_l))[None, :], mask=live)
    scales = gl.load((ptr + NOPE + 2 * ROPE).to(gl.pointer_type(gl.uint64)), mask=live)''',
'''    rope = (rp.to(gl.int64) & 0).to(gl.int32)[:, None] + gl.arange(0, 32, layout=gl.SliceLayout(0, rope_l))[None, :]
    scales = (v & 0).to(gl.uint64) | 0x7F7F7F7F7F7F7F7F''')
(out / "v_noload.py").write_text(nol)

nom = sub(src, "        sc = warpgroup_mma(q_smem, k_tile.permute((1, 0)), s_zero, use_acc=False)\n",
          "        sc = s_zero + 1.0\n")
nom = sub(nom, "        o = warpgroup_mma(p_smem, k_tile.slice(0, HALF, 1), o)\n", "")
nom = sub(nom, "        o = warpgroup_mma(p_smem, k_bufs.index(s).slice(HALF, HALF, 1), o)\n", "")
(out / "v_nomma.py").write_text(nom)
