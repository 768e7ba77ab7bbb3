"""Offline sm_90 compile of the look-back split_select_kernel: ptxas -v and PTX size."""
import os, subprocess, tempfile, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tp_runtime.ops.topk_select import split_select_kernel as fn, RANK_N
PTR = {"score_ptr": "*fp32", "hist_ptr": "*i32", "cand_ptr": "*i32", "nv_ptr": "*i64", "out_ptr": "*i64"}
for slice_ in (512, 2048):
    runs = -(-9236 // slice_)
    const = dict(SLICE=slice_, R_P2=triton.next_power_of_2(runs), RANK_N=RANK_N, MIN_N=1024, LEVELS=2, HI_BITS=12,
                 LO_BITS=8, LO_PASSES=3, CHUNK=slice_, SORT_SIZES=3, PDL=True)
    sig, attrs = {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in const: sig[n] = "constexpr"
        elif n in PTR: sig[n] = PTR[n]; attrs[(i,)] = [["tt.divisibility", 16]]
        else: sig[n] = "i32"
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in const.items()}, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "maxnreg": 72})
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    r = subprocess.run([ptxas, "-v", "-arch=sm_90a", f.name, "-o", "/tmp/lb.cubin", "--maxrregcount=72"],
                       capture_output=True, text=True)
    sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "cuobjdump"), "-sass", "/tmp/lb.cubin"],
                          capture_output=True, text=True).stdout
    n_sass = sum(1 for l in sass.splitlines() if l.strip().startswith("/*") and "*/" in l and ";" in l)
    print(slice_, "SASS", n_sass, " ".join(l.strip() for l in r.stderr.splitlines() if "Used" in l or "spill" in l),
          flush=True)
