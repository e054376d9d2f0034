# shellcheck shell=bash
# Sourced by the GPU launch scripts: torchrun variables with defaults, and the data the
# job needs (see pretrain_gpt_zb_odc.sh for what each variable means).
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
PP=${PP:-4}
# CUDA symmetric memory (ODC) reaches only the GPUs of one host: across hosts ODC runs
# inside each host and one all-reduce per minibatch crosses hosts (--dp-mode hierarchical);
# --dp-mode odc raises for CUDA tensors when the group spans hosts.
if [ "$NNODES" -gt 1 ]; then
    DP_MODE=${DP_MODE:-hierarchical}
else
    DP_MODE=${DP_MODE:-odc}
fi
DATA_PATH=${DATA_PATH:?set DATA_PATH to an indexed-dataset prefix or a .jsonl file}
# DATA_PATH may list several prefixes (blended), separated by spaces
# shellcheck disable=SC2034  # used by the scripts that source this file
read -r -a DATA_PATHS <<< "$DATA_PATH"
TOKENIZER=${TOKENIZER:?set TOKENIZER to a local Hugging Face tokenizer directory}
