"""Offline sm_90 compile of split_select_kernel at several SLICE / R_P2 / REG_N; ptxas -v spills and registers."""
import os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tp_runtime.ops.topk_select import split_select_kernel as fn, RANK_N

PTR = {"score_ptr": "*fp32", "hist_ptr": "*i32", "part_ptr": "*i32", "cnt_ptr": "*i32", "cand_ptr": "*i32",
       "nv_ptr": "*i64", "out_ptr": "*i64"}

def build(const, maxnreg):
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in const:
            sig[n] = "constexpr"
        elif n in PTR:
            sig[n] = PTR[n]; attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "i32"
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()}, attrs=attrs)
    opts = {"num_warps": 8}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    args = [ptxas, "-v", "-arch=sm_90a", f.name, "-o", "/dev/null"] + ([f"--maxrregcount={maxnreg}"] if maxnreg else [])
    r = subprocess.run(args, capture_output=True, text=True)
    return " ".join(l.strip() for l in r.stderr.splitlines() if "Used" in l or "spill" in l)

for slice_, reg_n in [(2048, 2048), (512, 2048)]:
    runs = -(-9236 // slice_)
    min_n = min(1024, reg_n)
    const = dict(SLICE=slice_, R_P2=triton.next_power_of_2(runs), K_P2=512, RANK_N=RANK_N, MIN_N=min_n,
                 LEVELS=(reg_n // min_n).bit_length(), HI_BITS=12, LO_BITS=8, LO_PASSES=3, CHUNK=slice_,
                 SORT_SIZES=3, PDL=True)
    for mr in (72,):
        print(slice_, reg_n, mr, build(const, mr), flush=True)
