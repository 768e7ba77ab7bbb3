"""`torchrun --nproc-per-node N -m tp_runtime.serving CONFIG [key=value ...]`: serve-bench at tp = N."""

import sys

from tp_runtime.serving.sweep import main

sys.exit(main())
