#!/usr/bin/env bash
# Quickstart on a laptop / CI box: no GPU, 4 CPU processes talking gloo.
#
#   bash examples/quickstart_cpu.sh            # pp=2 (ZB-V) x dp=2 (ODC, LB-Mini), 50 iterations
#   ITERS=10 bash examples/quickstart_cpu.sh   # shorter
#
# Trains a tiny megatron-core GPT (4 layers, hidden 64) on the built-in synthetic corpus
# (long-tailed lengths, deterministic from --seed), logs loss / tokens per second / idle
# time per rank, writes JSON logs and an atomic checkpoint under ${OUT:-out/quickstart}.
# Run it again to resume from that checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/quickstart}
ITERS=${ITERS:-50}
mkdir -p "$OUT"

exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 4 pretrain_gpt.py \
    --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \
    --max-position-embeddings 128 \
    --micro-batch-size 2 --global-batch-size 16 \
    --pipeline-model-parallel-size 2 --pipeline-schedule zbv \
    --dp-mode odc --load-balance lb-mini \
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 \
    --weight-decay 0.01 --clip-grad 1.0 \
    --train-iters "$ITERS" --log-interval 5 --log-json "$OUT/train.jsonl" \
    --mock-data --vocab-size 128 --seed 1234 \
    --save "$OUT/checkpoints" --load "$OUT/checkpoints" --save-interval 25 \
    "$@"
