#!/usr/bin/env bash
# Multi-node GPU SFT of Llama-3-8B: Hugging Face checkpoint in, Hugging Face checkpoint out.
#
# Run once per node with the usual torchrun variables (examples/_cluster_env.sh):
#   GPUS_PER_NODE NNODES NODE_RANK MASTER_ADDR MASTER_PORT  as for torchrun
#   HF_MODEL   local HF directory of Meta-Llama-3-8B(-Instruct): config.json, safetensors,
#              tokenizer (nothing is downloaded)
#   DATA_PATH  SFT data: pre-tokenized JSONL ({"input_ids", "loss_mask"}) or chat JSONL
#              ({"messages": [...]}: the tokenizer's chat template, loss on assistant turns)
#   TOKENIZER  tokenizer directory (default: HF_MODEL)
#   CKPT       odc-pp checkpoint directory (resumed when it holds one: it wins over HF_MODEL)
#   TP         tensor-parallel size inside a node (default 1; >1 adds --sequence-parallel)
#   PP         pipeline-parallel size (default 4); dp = NNODES * GPUS_PER_NODE / (TP * PP)
#   HF_OUT     where node 0 exports the fine-tuned model (default $CKPT/hf)
#
# Architecture flags come from $HF_MODEL/config.json (32 layers, hidden 4096, GQA 8 groups,
# RoPE theta 500000, SwiGLU, RMSNorm); a flag that contradicts it fails at once. Each rank
# reads only the safetensors tensors of its own pipeline chunks. Attention runs through
# torch's scaled_dot_product_attention (flash / memory-efficient) on CUDA. Across hosts the
# data-parallel mode is hierarchical (ODC inside a node, collectives between nodes).
set -euo pipefail
cd "$(dirname "$0")/.."
HF_MODEL=${HF_MODEL:?set HF_MODEL to a local Hugging Face Llama-3-8B directory}
TOKENIZER=${TOKENIZER:-$HF_MODEL}
export TOKENIZER
source examples/_cluster_env.sh
CKPT=${CKPT:-checkpoints/sft_llama3_8b}
HF_OUT=${HF_OUT:-$CKPT/hf}
DP_MODE=odc
if [[ "$NNODES" -gt 1 ]]; then DP_MODE=hierarchical; fi

DISTRIBUTED_ARGS=(--nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK"
                  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
MODEL_ARGS=(--hf-checkpoint "$HF_MODEL" --seq-length 4096 --bf16)
TP=${TP:-1}
SP_ARGS=()
if [[ "$TP" -gt 1 ]]; then SP_ARGS=(--sequence-parallel); fi
PARALLEL_ARGS=(--pipeline-model-parallel-size "$PP" --tensor-model-parallel-size "$TP"
               "${SP_ARGS[@]}"
               --pipeline-schedule zbv --num-model-chunks 2
               --enable-optimizer-post-validation
               --dp-mode "$DP_MODE" --load-balance lb-mini
               --max-tokens-per-microbatch 16384 --pack-sequences)
TRAIN_ARGS=(--micro-batch-size 1 --global-batch-size 128
            --lr 1e-5 --min-lr 1e-6 --lr-decay-style cosine --lr-warmup-iters 20
            --weight-decay 0.0 --clip-grad 1.0 --train-iters 1000 --seed 1234)
DATA_ARGS=(--data-path $DATA_PATH --tokenizer-type HuggingFaceTokenizer
           --tokenizer-model "$TOKENIZER")
OUTPUT_ARGS=(--save "$CKPT" --load "$CKPT" --save-interval 200 --log-interval 10
             --log-json "$CKPT/train.jsonl" --distributed-timeout-minutes 10)

torchrun "${DISTRIBUTED_ARGS[@]}" pretrain_gpt.py "${MODEL_ARGS[@]}" \
    "${PARALLEL_ARGS[@]}" "${TRAIN_ARGS[@]}" "${DATA_ARGS[@]}" "${OUTPUT_ARGS[@]}" "$@"

if [[ "$NODE_RANK" == 0 ]]; then  # --save must be shared storage (every rank wrote into it)
    PYTHONPATH=. python tools/export_hf.py --load "$CKPT" --output "$HF_OUT" \
        --max-shard-size 5GB --dtype bfloat16 --copy-tokenizer-from "$TOKENIZER"
fi
