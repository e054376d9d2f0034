#!/usr/bin/env python3
"""Offload-ratio tuner (same as ``odc-pp tune-offload``), e.g.

    python tools/tune_offload.py --preset h100 --num-layers 32 --hidden-size 4096 \
        --num-attention-heads 32 --seq-length 4096 --pp 4 --num-microbatches 16
"""

import sys

from odc_pp.training.tune_offload_command import main

if __name__ == "__main__":
    sys.exit(main())
