#!/usr/bin/env bash
# Long sequences on memory-tight GPUs: the offload schedule moves saved activations of
# the chosen model chunks to host memory after their forward and reloads them before
# their backward; --recompute-lgd recomputes layernorm/GeLU/dropout outputs.
#
# Pick the chunks and recompute with the tuner first, e.g.
#   odc-pp tune-offload --preset h100 --num-layers 32 --hidden-size 4096 \
#       --num-attention-heads 32 --seq-length 16384 --pp 4 --num-microbatches 16 \
#       --memory-budget-gb 70
# and paste its "best:" flags into OFFLOAD_ARGS below.
#
# Variables as in pretrain_gpt_zb_odc.sh: GPUS_PER_NODE NNODES NODE_RANK MASTER_ADDR
# MASTER_PORT DATA_PATH TOKENIZER CKPT PP DP_MODE (hierarchical across nodes).
set -euo pipefail
cd "$(dirname "$0")/.."
source examples/_cluster_env.sh
CKPT=${CKPT:-checkpoints/gpt_offload}
OFFLOAD_ARGS=(--pipeline-schedule offload --cpu-offload --offload-chunks 0 --recompute-lgd)

exec torchrun --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 \
    --seq-length 16384 --max-position-embeddings 16384 \
    --pipeline-model-parallel-size "$PP" "${OFFLOAD_ARGS[@]}" \
    --dp-mode "$DP_MODE" --load-balance lb-mini --max-tokens-per-microbatch 16384 \
    --micro-batch-size 1 --global-batch-size 256 --bf16 \
    --lr 2e-5 --min-lr 2e-6 --lr-warmup-iters 20 --weight-decay 0.1 --clip-grad 1.0 \
    --train-iters 1000 --seed 1234 \
    --data-path "${DATA_PATHS[@]}" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER" \
    --save "$CKPT" --load "$CKPT" --save-interval 100 --log-interval 10 \
    --log-json "$CKPT/train.jsonl" "$@"
