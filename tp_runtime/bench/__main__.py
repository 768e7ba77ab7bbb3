"""`torchrun --nproc-per-node N -m tp_runtime.bench SWEEP [key=value ...]`: the sweep's points of tp = N."""

import sys

from tp_runtime.bench.sweep import main

sys.exit(main())
