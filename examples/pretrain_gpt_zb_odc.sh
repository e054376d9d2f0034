#!/usr/bin/env bash
# Multi-node GPU training: zero-bubble pipeline (ZB-V) x ODC sharded data parallelism.
#
# Run once per node with the usual torchrun variables:
#   GPUS_PER_NODE  GPUs on each node (default 8)
#   NNODES         number of nodes (default 1)
#   NODE_RANK      this node's index 0..NNODES-1 (default 0)
#   MASTER_ADDR    address of node 0 (default localhost)
#   MASTER_PORT    a free port on node 0 (default 6000)
#   DATA_PATH      indexed-dataset prefix(es) made by tools/preprocess_data.py, or .jsonl
#   TOKENIZER      local Hugging Face tokenizer directory
#   CKPT           checkpoint directory (resumed when it has one)
#   PP             pipeline-parallel size (default 4); dp = NNODES*GPUS_PER_NODE/PP
#   DP_MODE        data-parallel engine (default: odc on one node, hierarchical on several:
#                  ODC among each node's GPUs through CUDA IPC, one all-reduce per
#                  minibatch across nodes; odc over several nodes raises for CUDA tensors)
#
# Ranks are laid out rank = dp_rank * PP + pp_rank: keep PP <= GPUS_PER_NODE so each
# pipeline stays inside a node (NVLink) and only ODC traffic crosses nodes. Variable-length
# post-training data: --max-tokens-per-microbatch packs microbatches by tokens and
# --load-balance lb-mini gives data-parallel replicas equal work per minibatch.
set -euo pipefail
cd "$(dirname "$0")/.."
source examples/_cluster_env.sh
CKPT=${CKPT:-checkpoints/gpt_zb_odc}

DISTRIBUTED_ARGS=(--nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK"
                  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
MODEL_ARGS=(--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008
            --seq-length 4096 --max-position-embeddings 4096)
PARALLEL_ARGS=(--pipeline-model-parallel-size "$PP" --tensor-model-parallel-size 1
               --pipeline-schedule zbv --num-model-chunks 2
               --enable-optimizer-post-validation
               --dp-mode "$DP_MODE" --load-balance lb-mini --max-tokens-per-microbatch 16384)
TRAIN_ARGS=(--micro-batch-size 1 --global-batch-size 512 --bf16
            --lr 2e-5 --min-lr 2e-6 --lr-decay-style cosine --lr-warmup-iters 50
            --weight-decay 0.1 --clip-grad 1.0 --train-iters 2000 --seed 1234)
DATA_ARGS=(--data-path "${DATA_PATHS[@]}" --tokenizer-type HuggingFaceTokenizer
           --tokenizer-model "$TOKENIZER")
OUTPUT_ARGS=(--save "$CKPT" --load "$CKPT" --save-interval 200 --log-interval 10
             --log-json "$CKPT/train.jsonl" --tensorboard-dir "$CKPT/tensorboard"
             --distributed-timeout-minutes 10)

exec torchrun "${DISTRIBUTED_ARGS[@]}" pretrain_gpt.py "${MODEL_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" "${TRAIN_ARGS[@]}" "${DATA_ARGS[@]}" "${OUTPUT_ARGS[@]}" "$@"
