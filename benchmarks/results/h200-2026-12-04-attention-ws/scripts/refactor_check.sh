#!/usr/bin/env bash
# The Gluon attention tests and the attention PDL tests on the final commit (after the shared-helper refactor).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$OUT/refactor_check; mkdir -p $R
{ nvidia-smi -L; md5sum tp_runtime/ops/sparse_attention*.py; } > $R/env.txt 2>&1
timeout -k 10 -s INT 200 python3 -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_attention_wgmma_gpu.py \
  "tests/test_pdl_gpu.py::test_sparse_attention" > $R/pytest.log 2>&1
echo "rc=$?" >> $R/env.txt
tail -3 $R/pytest.log
