# Sourced by the GPU launch scripts: torchrun variables with defaults, and the data the
# job needs (see pretrain_gpt_zb_odc.sh for what each variable means).
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
PP=${PP:-4}
DATA_PATH=${DATA_PATH:?set DATA_PATH to an indexed-dataset prefix or a .jsonl file}
TOKENIZER=${TOKENIZER:?set TOKENIZER to a local Hugging Face tokenizer directory}
