#!/usr/bin/env bash
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/diag; mkdir -p $R
{ nvidia-smi -L; python3 -c 'import torch, triton; print(torch.__version__, torch.version.cuda, triton.__version__)'; md5sum tp_runtime/ops/sparse_attention*.py; } > $R/env.txt 2>&1
timeout -k 10 480 python3 bench_tmp/diag/diag.py base,nofence,nodec,noload,nomma,dec,tl,tl_c 128/4096/4/64,128/4096/128/64,256/4096/4/64,128/4096/4/8 > $R/diag.log 2>&1
echo "rc=$?" >> $R/diag.log
cat $R/diag.log
