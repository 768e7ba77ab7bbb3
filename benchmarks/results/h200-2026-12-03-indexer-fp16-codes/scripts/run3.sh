#!/usr/bin/env bash
# The whole GPU suite on the final commit, then check with FP8 caches on Flash layers if time is left.
set -u
T0=$(date +%s); R=$OUT/gpu_suite
ONLY_PYTEST=1 PYTEST_WORKERS=16 timeout 520 bash benchmarks/gpu_checks.sh $R > /dev/null 2>&1
echo "suite rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
el=$(( $(date +%s) - T0 ))
[ $el -lt 470 ] && SKIP_PYTEST=1 CHECKS="flash_tp1_full_kv_fp8" timeout $(( 560 - el )) bash benchmarks/gpu_checks.sh $R > /dev/null 2>&1
echo "check rc=$? $(( $(date +%s) - T0 )) s" >> $R/env.txt
tail -25 $R/pytest_gpu.log; cat $R/env.txt; cat $R/checks.log 2>/dev/null | tail -5
cd $OUT && tar czf gpu_suite.tgz gpu_suite && rm -rf gpu_suite
