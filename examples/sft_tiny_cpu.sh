#!/usr/bin/env bash
# Supervised fine-tuning of a Hugging Face model on CPU, end to end, with nothing downloaded:
#
#   bash examples/sft_tiny_cpu.sh              # 20 iterations, pp=2 (ZB-V) x dp=2 (ODC)
#   PACK=1 bash examples/sft_tiny_cpu.sh       # with --pack-sequences
#
# 1. builds a tiny random Llama (4 layers, hidden 64, GQA, Llama-3 RoPE) with transformers
#    and save_pretrained (HF in: config.json + safetensors) under ${OUT:-out/sft_tiny};
# 2. writes pre-tokenized SFT data, {"input_ids": [...], "loss_mask": [...]} per line
#    (L ids, L - 1 mask entries; the predictions of prompt tokens masked). Ids are checked
#    against the model's vocabulary (264, the checkpoint's config); the default byte-level
#    tokenizer only supplies the padding id (257). With a real model pass its tokenizer
#    (--tokenizer-model DIR) so that padding uses the model's own id;
# 3. fine-tunes it with pretrain_gpt.py --hf-checkpoint on 4 CPU processes (gloo);
# 4. exports the checkpoint with tools/export_hf.py (HF out) and reloads it with
#    transformers.AutoModelForCausalLM.from_pretrained.
# Needs transformers (pip install -e .[test]). The pre-tokenized JSONL reader is part of
# odc_pp.data (issue 12 item 4).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/sft_tiny}
ITERS=${ITERS:-20}
mkdir -p "$OUT"

"$PYTHON" - "$OUT" <<'PY'
import json, os, random, sys
import torch, transformers
out = sys.argv[1]
if not os.path.isfile(os.path.join(out, "hf", "config.json")):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=264, hidden_size=64, intermediate_size=172, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rope_theta=500000.0, tie_word_embeddings=False, torch_dtype="float32",
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    transformers.LlamaForCausalLM(config).save_pretrained(os.path.join(out, "hf"))
rng = random.Random(0)
with open(os.path.join(out, "sft.jsonl"), "w") as handle:
    for _ in range(256):
        prompt = [rng.randrange(1, 256) for _ in range(rng.randint(4, 40))]
        start, stride = rng.randrange(1, 256), rng.choice((1, 3, 7))
        answer = [(start + stride * i) % 255 + 1 for i in range(rng.randint(4, 60))]
        # L ids train L - 1 predictions: loss_mask[i] weighs the prediction of ids[i + 1]
        handle.write(json.dumps({"input_ids": prompt + answer,
                                 "loss_mask": [0] * (len(prompt) - 1) + [1] * len(answer)})
                     + "\n")
print(f"tiny Llama in {out}/hf, 256 pre-tokenized samples in {out}/sft.jsonl")
PY

PACK_ARGS=()
if [[ "${PACK:-0}" == 1 ]]; then PACK_ARGS=(--pack-sequences); fi
rm -rf "$OUT/checkpoints" "$OUT/hf_out"
"$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 4 pretrain_gpt.py \
    --hf-checkpoint "$OUT/hf" --data-path "$OUT/sft.jsonl" --seq-length 128 \
    --micro-batch-size 2 --global-batch-size 16 --max-tokens-per-microbatch 256 \
    --pipeline-model-parallel-size 2 --pipeline-schedule zbv \
    --dp-mode odc --load-balance lb-mini "${PACK_ARGS[@]}" \
    --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 1.0 \
    --train-iters "$ITERS" --log-interval 5 --log-json "$OUT/train.jsonl" --seed 1234 \
    --save "$OUT/checkpoints" --no-progress-bar "$@"

PYTHONPATH=. "$PYTHON" tools/export_hf.py --load "$OUT/checkpoints" --output "$OUT/hf_out"
"$PYTHON" -c "import sys, transformers; m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]); print('reloaded with transformers:', type(m).__name__, sum(p.numel() for p in m.parameters()), 'parameters')" "$OUT/hf_out"
