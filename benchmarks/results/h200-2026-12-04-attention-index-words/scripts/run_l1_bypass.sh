#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/r5; mkdir -p $R
{ nvidia-smi -L; md5sum tp_runtime/ops/sparse_attention*.py bench_tmp/diag/v_*.py; } > $R/env.txt 2>&1
timeout -k 10 150 python3 bench_tmp/diag/diag.py lw,go,cg,cv 128/4096/4/64,128/4096/128/64,256/4096/4/64 > $R/diag.log 2>&1
echo "diag rc=$?" >> $R/env.txt; cat $R/diag.log
cd $OUT && tar czf r5.tgz r5 && rm -rf r5
