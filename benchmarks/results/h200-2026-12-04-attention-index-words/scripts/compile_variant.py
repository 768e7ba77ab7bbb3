"""Offline sm_90 compile of a WS variant module file; prints spills and SASS op counts of the loader."""
import importlib.util, os, re, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

path = sys.argv[1]
spec = importlib.util.spec_from_file_location("wsvar", path); m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
fn = m._ws_kernel
names = fn.arg_names
ptr_types = {"q_ptr": "*bf16", "kv_ptr": "*u8", "win_ptr": "*u8", "in_step_ptr": "*u8", "step_row_ptr": "*i32",
             "ring_row_ptr": "*i32", "valid_ptr": "*u8", "comp_ptr": "*u8", "slot_ptr": "*i64", "picks_ptr": "*i32",
             "n_done_ptr": "*i64", "sink_ptr": "*fp32", "cis_ptr": "*fp32", "out_ptr": "*bf16", "dbg": "*i64"}
const = dict(W=128, D=512, DR=64, HAS_COMP=True, HAS_PICKS=True, PDL=True, num_warps=4)
sig, attrs = {}, {}
for i, n in enumerate(names):
    if n in const:
        sig[n] = "constexpr"
    elif n in ptr_types:
        sig[n] = ptr_types[n]; attrs[(i,)] = [["tt.divisibility", 16]]
    elif n == "qk_scale":
        sig[n] = "fp32"
    else:
        sig[n] = "i32"
        if n.startswith("s") and n != "H":
            attrs[(i,)] = [["tt.divisibility", 16]]
src = GluonASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in const.items()}, attrs=attrs)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
base = os.path.splitext(path)[0]
open(base + ".ptx", "w").write(k.asm["ptx"])
open(base + ".cubin", "wb").write(k.asm["cubin"])
print("shared", k.metadata.shared, "regs?", getattr(k, "n_regs", None))
bin_ = "/work/tritonpkg/triton/backends/nvidia/bin"
sass = subprocess.run([f"{bin_}/cuobjdump", "-sass", base + ".cubin"], capture_output=True, text=True).stdout
open(base + ".sass", "w").write(sass)
ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
from collections import Counter
c = Counter(o.split(".")[0] for o in ops)
print("total SASS", len(ops), {k: c[k] for k in ["PRMT", "LOP3", "HMUL2", "SHF", "IMAD", "LDG", "STS", "LDS", "MEMBAR", "FENCE", "STL", "LDL", "LDGSTS", "BAR"] if c[k]})
