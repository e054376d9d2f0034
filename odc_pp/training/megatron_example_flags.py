"""Answers to the flags of Megatron-LM's ``examples/`` launch scripts (GPT, Llama, Mixtral,
Megatron-FSDP, ModelOpt post-training, gpt-oss) beyond the first table in
:mod:`.megatron_flags`: what pretrain_gpt.py does with each one. tests/data/megatron_scripts
holds the scripts' flags; tests/unit/training/test_megatron_scripts.py checks every one is
answered.
"""

from __future__ import annotations

import os

from .megatron_flag_kinds import (PastedFlag, at_value, honoured, maps_value, noop,
                                  rejected)

__all__ = ["EXAMPLE_FLAGS", "PREFIX_FLAGS", "NATIVE_VALUES", "FP8_REFUSAL"]

FP8_REFUSAL = ("bf16 only; Transformer Engine FP8 is not supported: drop the --fp8-* flags "
               "and keep --bf16 (e.g. DTYPE=bf16 in train_llama3_8b_h100_fp8.sh)")
_MOE = ("mixture of experts is not supported (dense GPT models only): drop the MoE flags "
        "or train with Megatron-LM")
_FSDP = ("Megatron-FSDP tuning: ODC already shards parameters, gradients and optimizer "
         "state over the data-parallel ranks (--dp-mode odc); nothing to set")
_RAMPUP = ("a stepped batch-size schedule is not implemented: use --rampup-batch-size "
           "START INCREMENT SAMPLES (Megatron's linear ramp-up) or drop it")
_HF_DATASET = ("maps to --data-path: the dataset's local JSONL file, one-document samples "
               "through the tokenizer's chat template ('messages' or ShareGPT "
               "'conversations' records, as Hugging Face SFT sets store them; only assistant "
               "turns scored). Nothing is downloaded")


def _local_jsonl(value: str) -> str | None:
    """Why ``--finetune-hf-dataset VALUE`` cannot be read here, or None."""
    if value.endswith((".jsonl", ".json")) and os.path.isfile(value):
        return None
    return ("odc-pp reads Hugging Face datasets from a local JSONL file and downloads "
            "nothing: save the split with datasets' Dataset.to_json(FILE.jsonl) (or "
            "huggingface-cli download a JSONL dataset) and give that file")


_TRACE = ("odc-pp writes its own per-rank trace of F, B, W and communication with --trace "
          "FILE; under nsys the whole run is captured")

EXAMPLE_FLAGS: dict[str, PastedFlag] = {
    # model shape and numerics
    "--use-mcore-models": honoured("odc-pp always builds megatron-core models"),
    "--rotary-percent": at_value(
        ("1.0",), "RoPE rotates the whole head dimension, as at --rotary-percent 1.0",
        "partial rotary embeddings are not supported: use --rotary-percent 1.0"),
    "--use-rotary-position-embeddings": PastedFlag(
        takes_value=False, action="mapped", message="maps to --position-embedding-type rope",
        replacement=("--position-embedding-type", "rope")),
    "--rope-type": at_value(("rope",), "plain RoPE (Llama-3 scaling: --use-rope-scaling)",
                            "--rope-type takes 'rope' here (YaRN is not supported)"),
    # --attention-dropout, --hidden-dropout: odc-pp's own flags (native, Megatron's 0.1)
    "--padded-vocab-size": maps_value(
        "--vocab-size", "the embedding rows of the model: maps to --vocab-size"),
    # --apply-layernorm-1p, --decoupled-lr, --decoupled-min-lr: odc-pp's own flags (native)
    "--attention-softmax-in-fp32": honoured(
        "attention softmax runs in fp32 (megatron-core's default; sdpa kernels accumulate "
        "in fp32)"),
    "--softmax-type": at_value(("vanilla",), "the standard softmax",
                               "--softmax-type takes 'vanilla' here (no attention sinks)"),
    "--window-size": rejected("sliding-window attention is not supported: drop it",
                              takes_value=True),
    "--window-attn-skip-freq": rejected("sliding-window attention is not supported: drop it",
                                        takes_value=True),
    "--quick-geglu": rejected("gpt-oss's quick GeGLU is not supported: use --swiglu or GeLU"),
    "--glu-linear-offset": rejected("gpt-oss's GLU offset is not supported: drop it",
                                    takes_value=True),
    "--activation-func-clamp-value": rejected(
        "activation clamping (gpt-oss) is not supported: drop it", takes_value=True),
    "--enable-gpt-oss": rejected("gpt-oss models are not supported (dense GPT only)"),
    # precision and kernels
    "--cross-entropy-loss-fusion": noop(
        "the same loss; on CUDA odc-pp fuses the output layer with it "
        "(--fused-cross-entropy auto) unless tensor parallelism splits the vocabulary"),
    "--no-bias-swiglu-fusion": noop(
        "odc-pp's SwiGLU always saves only its input, as the fused one; the values and "
        "gradients are those of the unfused form"),
    "--disable-bf16-reduced-precision-matmul": rejected(
        "odc-pp leaves torch's bf16 matmul reduction setting at its default: drop the flag"),
    "--cuda-graph-impl": noop("odc-pp does not capture CUDA graphs", takes_value=True),
    "--use-precision-aware-optimizer": noop(
        "AdamW keeps fp32 master weights and moments per owned shard (the precision-aware "
        "optimizer's default dtypes)"),
    "--manual-gc": noop("Python's garbage collector stays automatic"),
    "--empty-unused-memory-level": noop(
        "the CUDA cache is not emptied between iterations (for fragmentation set "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)", takes_value=True),
    "--no-check-for-nan-in-loss-and-grad": noop(
        "odc-pp always checks: a non-finite loss stops the job, non-finite gradients skip "
        "the step (--max-skipped-steps)"),
    # optimizer and schedule
    "--step-batch-size-schedule": rejected(_RAMPUP, takes_value=True),
    # parallelism
    "--expert-model-parallel-size": at_value(("1",), "a dense model has no experts", _MOE),
    "--expert-tensor-parallel-size": noop("a dense model has no expert layers",
                                          takes_value=True),
    "--num-experts": rejected(_MOE, takes_value=True),
    "--use-megatron-fsdp": honoured(
        "parameters, gradients and optimizer state are sharded by ODC (--dp-mode odc)"),
    "--data-parallel-sharding-strategy": noop(_FSDP, takes_value=True),
    "--outer-dp-sharding-strategy": noop(_FSDP, takes_value=True),
    "--num-distributed-optimizer-instances": at_value(
        ("1",), "one optimizer instance", "one distributed-optimizer instance only: drop it"),
    "--use-nccl-ub": noop("NCCL user buffers are not registered"),
    "--init-model-with-meta-device": noop(
        "each rank builds only its own pipeline stage's layers"),
    "--distributed-config-file": rejected(
        "no distributed config file: give the layout with flags", takes_value=True),
    # data
    "--data-cache-path": noop("odc-pp builds its sample index in memory; no cache",
                              takes_value=True),
    "--num-workers": noop("samples are read in the training process", takes_value=True),
    "--no-mmap-bin-files": noop("indexed .bin files are memory-mapped either way"),
    "--no-create-attention-mask-in-dataloader": honoured(
        "the data loader builds no attention mask (attention is causal)"),
    "--tiktoken-pattern": noop("used only by Megatron's TikTokenizer", takes_value=True),
    "--finetune-hf-dataset": maps_value("--data-path", _HF_DATASET, check=_local_jsonl),
    # checkpoints, export, logging
    "--ckpt-format": at_value(
        ("torch_dist",), "--load reads Megatron torch_dist checkpoints; --save writes "
        "odc-pp's format (tools/export_megatron.py writes torch_dist)",
        "--ckpt-format takes torch_dist here"),
    "--auto-detect-ckpt-format": honoured("--load detects Megatron torch_dist and odc-pp "
                                          "checkpoints"),
    "--no-load-optim": rejected("no optimizer-less resume: use --finetune (weights only)",
                                implied_by="--finetune"),
    "--no-load-rng": rejected("no RNG-less resume: use --finetune (weights only)",
                              implied_by="--finetune"),
    "--export-te-mcore-model": noop("a ModelOpt export option: odc-pp exports with "
                                    "tools/export_megatron.py / tools/export_hf.py"),
    "--export-force-local-attention": noop("a ModelOpt export option: odc-pp builds local "
                                           "attention"),
    "--logging-level": noop("odc-pp's log has one level", takes_value=True),
    "--profile": PastedFlag(takes_value=False, action="mapped", message=(
        f"maps to --trace profile_trace.json (unless --trace is given): {_TRACE}"),
        replacement=("--trace", "profile_trace.json")),
    "--use-pytorch-profiler": PastedFlag(takes_value=False, action="mapped", message=(
        f"maps to --trace profile_trace.json (unless --trace is given): {_TRACE}"),
        replacement=("--trace", "profile_trace.json")),
    "--profile-step-start": noop("the --trace covers every iteration", takes_value=True),
    "--profile-step-end": noop("the --trace covers every iteration", takes_value=True),
    "--profile-ranks": noop("the --trace has one track per rank, every rank",
                            takes_value=True),
    "--record-memory-history": noop("no CUDA memory history: use pretrain_gpt.py "
                                    "--dry-run for the memory plan"),
    "--memory-snapshot-path": noop("no CUDA memory history is recorded", takes_value=True),
}

PREFIX_FLAGS: dict[str, PastedFlag] = {
    "--fp8-": rejected(FP8_REFUSAL),
    "--fp4-": rejected("bf16 only; Transformer Engine FP4 is not supported: drop the "
                       "--fp4-* flags and keep --bf16"),
    "--moe-": rejected(_MOE),
    "--fsdp-": noop(_FSDP),
    "--megatron-fsdp-": noop(_FSDP),
}
"""Families of flags answered by their prefix; a value after them (the next token when it
is not a flag) is taken with them."""

NATIVE_VALUES: dict[tuple[str, str], tuple[tuple[str, ...], str, str | None]] = {
    ("--tokenizer-type", "NullTokenizer"): (
        (), "Megatron's NullTokenizer: dropped, --mock-data's ids are synthetic and "
        "--vocab-size gives the vocabulary", "--mock-data"),
    ("--attention-backend", "fused"): (
        ("--attention-backend", "auto"), "Transformer Engine's fused attention is not used: "
        "--attention-backend auto (sdpa, flash attention on CUDA)", None),
    ("--attention-backend", "flash"): (
        ("--attention-backend", "auto"), "--attention-backend auto (sdpa, flash attention on "
        "CUDA)", None),
    ("--attention-backend", "unfused"): (
        ("--attention-backend", "host"), "--attention-backend host (megatron's unfused math "
        "with an explicit mask)", None),
    ("--attention-backend", "local"): (
        ("--attention-backend", "host"), "--attention-backend host (megatron's local "
        "DotProductAttention)", None),
}
"""Megatron values of odc-pp's own flags: (the tokens that replace flag and value, the
note, a flag the answer needs in the same command line -- without it the value is rejected
with the note)."""
