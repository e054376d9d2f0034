#!/usr/bin/env python3
"""Megatron-LM's script name for odc-pp's training entry point, ``python -m odc_pp.train``
(:mod:`odc_pp.train`): the same flags, the same exit status. Launch like Megatron-LM, e.g.
on CPU with 4 processes (pp=2 x dp=2):

    python -m torch.distributed.run --standalone --nproc-per-node 4 pretrain_gpt.py \
        --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \
        --pipeline-model-parallel-size 2 --pipeline-schedule zbv --dp-mode odc \
        --load-balance lb-mini --mock-data --vocab-size 128 --global-batch-size 16 \
        --train-iters 50 --lr 3e-3

``python pretrain_gpt.py --help`` lists every flag; see examples/ for launch scripts.
Exit status: 0 done, 2 bad flags, 1 a failure on some rank (the message names it).
"""

import sys

from odc_pp.train import main

if __name__ == "__main__":
    sys.exit(main())
