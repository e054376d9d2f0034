"""Megatron-style command-line arguments, backed by validated dataclasses in sections.

:class:`TrainingArgs` holds one dataclass per section (model, parallel, schedule,
optimizer, data, checkpoint, logging, run). Every field of a section is a flag, named as in
Megatron-LM: ``model.num_layers`` -> ``--num-layers``; its docstring is the flag's help
(``--help`` lists the flags by section). Validation of combinations happens in
``TrainingArgs.__post_init__`` and raises one ``ValueError`` that names the flags to change.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.util
import inspect
import math
import sys
import textwrap
from dataclasses import dataclass, field

from odc_pp.data.planner import LOAD_BALANCE_MODES
from odc_pp.data.tokenizers import tokenizer_type_for
from odc_pp.schedule.generators.families import FAMILIES, FAMILY_NAMES, family

from .context_split import context_parallel_problems
from .megatron_flags import translate_all as translate_megatron_flags
from .rampup import rampup_of, rampup_problems
from .megatron_semantics import (length_conflicts, megatron_tolerances, resolve_lengths,
                                 unknown_lines)
from .sample_construction import (SAMPLE_CONSTRUCTIONS, sample_construction_note,
                                  sample_construction_problems)

__all__ = ["TrainingArgs", "ModelArgs", "ParallelArgs", "ScheduleArgs", "OptimizerArgs",
           "DataArgs", "CheckpointArgs", "LoggingArgs", "RunArgs", "SECTION_OF", "parse_args",
           "parse_args_with_notes", "args_from_flags", "build_parser", "DP_MODES",
           "LOAD_BALANCE", "loss_scale_config"]

DP_MODES = ("odc", "collective", "hierarchical")
LOAD_BALANCE = LOAD_BALANCE_MODES
CHOICES = {
    "pipeline_schedule": FAMILY_NAMES,
    "dp_mode": DP_MODES,
    "load_balance": LOAD_BALANCE,
    "lr_decay_style": ("constant", "linear", "cosine"),
    "tokenizer_type": ("ByteLevelTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer"),
    "sample_construction": SAMPLE_CONSTRUCTIONS,
    "normalization": ("LayerNorm", "RMSNorm"),
    "position_embedding_type": ("learned_absolute", "rope"),
    "attention_backend": ("auto", "host", "sdpa"),
    "recompute_method": (None, "uniform", "block"),
    "exit_signal": ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"),
    "packed_attention": ("auto", "varlen", "flex", "dense"),
}


@dataclass(kw_only=True)
class ModelArgs:
    """The transformer's shape and numerics."""

    num_layers: int = 4
    """Transformer layers."""
    hidden_size: int = 64
    """Hidden size."""
    num_attention_heads: int = 4
    """Attention heads."""
    ffn_hidden_size: int | None = None
    """MLP hidden size (default 4 * hidden size)."""
    seq_length: int = 128
    """Longest sample in tokens (shorter samples are not padded beyond their microbatch)."""
    max_position_embeddings: int | None = None
    """Position-embedding table size (default: seq length)."""
    vocab_size: int | None = None
    """Embedding rows of the model. Needed with --mock-data; with --data-path it replaces the
    tokenizer's padded vocabulary (it must hold the tokenizer's ids) and bounds
    pre-tokenized input_ids; --hf-checkpoint sets it from config.json."""
    make_vocab_size_divisible_by: int = 8
    """Pad the tokenizer's vocabulary to a multiple of this."""
    recompute_lgd: bool = False
    """Recompute norm/activation/dropout outputs in backward instead of saving them."""
    recompute_full: bool = False
    """Full activation recompute (Megatron's --recompute-granularity full, which maps
    here): F keeps only the input of each recomputed layer group, B re-runs its forward
    and computes the input gradients, W uses what B recomputed. Needs --recompute-method
    and --recompute-num-layers."""
    recompute_method: str | None = None
    """With --recompute-full: uniform (every layer of a stage, in groups of
    --recompute-num-layers, each group keeping only its input) or block (only the first
    --recompute-num-layers layers of each stage, one by one)."""
    recompute_num_layers: int | None = None
    """With --recompute-full: the group size (uniform) or the number of recomputed layers
    per stage (block)."""
    bf16: bool = False
    """Compute in bfloat16 (fp32 master weights)."""
    fp16: bool = False
    """Compute in float16 (fp32 master weights) with Megatron's loss scaling: dynamic
    (--initial-loss-scale, --min-loss-scale, --loss-scale-window, --hysteresis) unless
    --loss-scale fixes it; a step whose gradients overflow on any rank is skipped."""
    hf_checkpoint: str | None = None
    """Local Hugging Face model directory (config.json + safetensors; Llama, Qwen2, Qwen3,
    Mistral): its architecture and weights. Shape flags may be omitted; a contradicting
    one is an error. With --load, a checkpoint found there wins."""
    normalization: str = "LayerNorm"
    """Norm of the layers: LayerNorm or RMSNorm."""
    norm_epsilon: float = 1e-5
    """Epsilon of the norms."""
    apply_layernorm_1p: bool = False
    """Zero-centred norm weights, as Megatron's: every norm (layer, final, q/k; LayerNorm
    or RMSNorm) stores its weight starting at 0 and scales by 1 + weight. Checkpoints keep
    the stored (zero-centred) values; Hugging Face import/export adds/subtracts 1."""
    init_method_std: float = 0.02
    """Standard deviation of the normal initialisation of the weights (output projections:
    divided by sqrt(2 x --num-layers), as megatron-core)."""
    swiglu: bool = False
    """SwiGLU MLP (silu(gate) * up) instead of GeLU."""
    group_query_attention: bool = False
    """Grouped-query attention (with --num-query-groups)."""
    num_query_groups: int | None = None
    """Key/value heads under --group-query-attention."""
    kv_channels: int | None = None
    """Head dimension (default hidden size / heads)."""
    position_embedding_type: str = "learned_absolute"
    """Positions: learned_absolute or rope."""
    rotary_base: float = 10000.0
    """RoPE base (Hugging Face rope_theta)."""
    use_rope_scaling: bool = False
    """Llama-3 RoPE scaling (low/high frequency factors 1 and 4, original context 8192;
    --hf-checkpoint takes them from its config)."""
    rope_scaling_factor: float = 8.0
    """Llama-3 RoPE scaling factor."""
    disable_bias_linear: bool = False
    """No biases in the linear layers."""
    add_qkv_bias: bool = False
    """A bias in the qkv projection even with --disable-bias-linear (Qwen2)."""
    qk_layernorm: bool = False
    """Normalise queries and keys per head (Qwen3)."""
    untie_embeddings: bool = False
    """Train the input embedding and the output layer as two independent weights
    (Megatron's --untie-embeddings-and-output-weights). Without it the model is tied, as
    Megatron's is by default (with --hf-checkpoint: as its config says), on every layout:
    across stages the two copies' gradients are summed before each step, as Megatron
    does. Untying a tied --hf-checkpoint model makes a different model (export then
    writes them tied only while they are bitwise equal)."""
    attention_backend: str = "auto"
    """Core attention: auto (sdpa on CUDA, host on CPU), host (megatron's math with an
    explicit mask) or sdpa (torch scaled_dot_product_attention)."""
    packed_attention: str = "auto"
    """Kernel of the sdpa attention for --pack-sequences rows: auto (varlen flash attention
    on CUDA in bf16, else FlexAttention on CUDA, else a dense mask), varlen, flex or dense
    (docs/gpu.md)."""

    @property
    def compute_dtype(self) -> str:
        """The parameters' compute dtype: bfloat16 (--bf16), float16 (--fp16) or float32."""
        return "bfloat16" if self.bf16 else "float16" if self.fp16 else "float32"


@dataclass(kw_only=True)
class ParallelArgs:
    """How processes are laid out and how data parallelism runs."""

    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel size (pp); data-parallel size is world size / (pp x tp)."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel size (tp): megatron-core's column/row-parallel layers, vocab-parallel
    embedding and cross entropy; ranks are laid out tp fastest, then pp, then dp."""
    context_parallel_size: int = 1
    """Context-parallel size (cp): every layer's sequence split over cp ranks (Megatron's
    causal load balance, ring or all-to-all attention, docs/context_parallel.md); ranks
    are laid out tp fastest, then cp, then pp, then dp, and gradients are summed over
    dp x cp. Microbatches are padded to a multiple of 2 x cp."""
    cp_comm_type: str = "p2p"
    """Context-parallel attention: p2p (ring attention) or a2a (all-to-all, Ulysses;
    heads divisible by --context-parallel-size). Megatron's allgather and a2a+p2p are
    accepted at --context-parallel-size 1 only (nothing to do there)."""
    sequence_parallel: bool = False
    """Split the activations outside the tensor-parallel regions (norms, dropout, the
    pipeline's point-to-point tensors) along the sequence over the tp ranks; needs tp > 1.
    Microbatches are padded to a multiple of tp."""
    keep_sp_input_for_w: bool = False
    """Sequence parallelism: keep each column-parallel linear's all-gathered input from B
    until its deferred weight gradient (W), instead of gathering it again in W. Saves one
    all-gather per linear in W for tp times the bytes of its input held until W."""
    dp_mode: str = "odc"
    """Data-parallel engine: odc (one-sided sharded), collective (all-reduce), hierarchical."""
    dp_ranks_per_host: int | None = None
    """hierarchical: data-parallel ranks per host (default: local processes / (pp x tp),
    the model copies one host holds)."""
    nondeterministic_dp: bool = False
    """Let ODC add gradients in arrival order (faster; resume no longer bit-exact)."""
    distributed_timeout_minutes: float = 5.0
    """Longest wait on a peer before the job fails."""

    def ranks_per_host(self, local_world_size: int) -> int:
        """hierarchical: data-parallel ranks per host -- --dp-ranks-per-host, or the
        host's processes / (pp x tp)."""
        copy = self.pipeline_model_parallel_size * self.tensor_model_parallel_size
        return self.dp_ranks_per_host or max(1, local_world_size // copy)


@dataclass(kw_only=True)
class ScheduleArgs:
    """The pipeline schedule and what it may hold in memory."""

    pipeline_schedule: str = "1f1b"
    """Pipeline schedule."""
    num_model_chunks: int | None = None
    """Model chunks per pipeline rank (default 2 for V schedules and interleaved, else 1)."""
    memory_limit: float | None = None
    """Activation-memory limit per rank, in microbatch-chunk activations (zb-auto, zb-h2, zbv, v-half, v-min, offload)."""
    cpu_offload: bool = False
    """Offload saved activations to host memory (schedule 'offload')."""
    offload_chunks: list[int] | None = None
    """Local model chunks whose activations are offloaded (default: all)."""
    enable_optimizer_post_validation: bool = False
    """Zero-bubble optimizer post-validation (step speculatively, roll back on inf/nan or clip)."""
    cost_model: str | None = None
    """JSON file of a CostModel for schedule generation (default: measured/uniform)."""
    profile_iters: int = 2
    """zb-auto: iterations profiled (the first one as warm-up when > 1) before re-planning
    the schedule from the measured per-stage costs; 0 keeps the initial plan."""


@dataclass(kw_only=True)
class OptimizerArgs:
    """AdamW, learning-rate schedule, clipping and skipped steps."""

    lr: float = 1e-3
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of decay."""
    decoupled_lr: float | None = None
    """Peak learning rate of the embedding and output-layer weights (Megatron's
    is_embedding_or_output_parameter; tied: the shared weight), with the warmup and decay
    of --lr; default: they take --lr."""
    decoupled_min_lr: float | None = None
    """With --decoupled-lr: their rate at the end of decay (default --min-lr)."""
    lr_decay_style: str = "cosine"
    """Decay after warmup."""
    lr_warmup_iters: int = 0
    """Linear warmup iterations."""
    lr_decay_iters: int | None = None
    """Decay length (default: --train-iters)."""
    lr_warmup_samples: int | None = None
    """Megatron's warmup in samples instead of --lr-warmup-iters: samples / global batch
    iterations (rounded up)."""
    lr_decay_samples: int | None = None
    """Megatron's decay length in samples instead of --lr-decay-iters: samples / global
    batch iterations (rounded up)."""
    lr_warmup_fraction: float | None = None
    """Megatron's warmup as a fraction of the decay length (--lr-decay-iters, default
    --train-iters) instead of --lr-warmup-iters (rounded up)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    clip_grad: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    max_skipped_steps: int = 10
    """Stop (exit 3) after this many consecutive skipped optimizer steps (inf/nan
    gradients); a non-finite loss stops the job at once. With --fp16's dynamic loss scale
    only skips at --min-loss-scale count (the others lower the scale, as Megatron)."""
    loss_scale: float | None = None
    """--fp16: a constant loss scale (default: dynamic scaling)."""
    initial_loss_scale: float = 2.0 ** 32
    """--fp16: the dynamic loss scale's start."""
    min_loss_scale: float = 1.0
    """--fp16: the dynamic loss scale's floor."""
    loss_scale_window: int = 1000
    """--fp16: steps without overflow before the dynamic loss scale doubles."""
    hysteresis: int = 2
    """--fp16: overflowing steps in a row before the dynamic loss scale halves (then
    every further one halves it until a raise)."""


@dataclass(kw_only=True)
class DataArgs:
    """Samples, batches and their assignment to replicas and microbatches."""

    micro_batch_size: int = 1
    """Samples per microbatch."""
    global_batch_size: int | None = None
    """Samples per iteration, over all data-parallel ranks (default, as in Megatron:
    --micro-batch-size x the data-parallel size)."""
    rampup_batch_size: list[int] | None = None
    """START INCREMENT SAMPLES: Megatron's batch ramp-up -- the global batch starts at
    START and grows by INCREMENT every SAMPLES / ((--global-batch-size - START) /
    INCREMENT) consumed samples up to --global-batch-size; each size must divide by
    --micro-batch-size x data-parallel size. --train-samples counts the ramp's iterations
    and the learning rate follows the consumed samples, as Megatron."""
    max_tokens_per_microbatch: int | None = None
    """Cap microbatches by tokens instead of --micro-batch-size: padded tokens (count x
    longest), or with --pack-sequences the packed row's length."""
    pack_sequences: bool = False
    """Pack each microbatch's samples back to back into one row (per-sample positions, no
    attention across samples, no padding); the row holds at most
    --max-tokens-per-microbatch (default --micro-batch-size x --seq-length) tokens, and
    --load-balance lb-mini balances the packed rows by their attention-aware cost. On by
    default with --load-balance lb-mini (the ODC paper's setting; see docs/planner.md)."""
    no_pack_sequences: bool = False
    """With --load-balance lb-mini: padded rows instead of the default packing (lb-mini
    then groups similar lengths, at most --micro-batch-size samples per microbatch unless
    --max-tokens-per-microbatch caps count x longest)."""
    sample_cost_model: str | None = None
    """JSON file {"a": s/token^2, "b": s/token, "c": s/row} of measured costs (written by
    benchmarks/bench_planner_validation.py --measure from the profiler) that every
    load-balance mode weighs samples and microbatches with; default: the FLOPs formula."""
    load_balance: str = "none"
    """Assignment of samples to data-parallel ranks and microbatches: none (strided
    equal-count split), lb-mini (replicas balanced by cost, any microbatch count per
    replica: odc / hierarchical), balanced (replicas balanced by cost with equal microbatch
    counts on every replica: any dp mode)."""
    data_path: list[str] | None = None
    """JSONL file(s) or indexed-dataset prefix(es)."""
    mock_data: bool = False
    """Use the built-in synthetic long-tailed corpus (needs --vocab-size)."""
    split: str | None = None
    """Megatron's --split: comma-separated train,valid,test weights over the documents of
    --data-path (normalised; e.g. 98,2,0). The valid part feeds evaluation. Default: every
    document trains (Megatron defaults to 969,30,1; give it explicitly for that)."""
    valid_data_path: list[str] | None = None
    """Validation JSONL file(s) or indexed-dataset prefix(es) (instead of a --split part)."""
    eval_interval: int = 1000
    """Evaluate on the validation data every N iterations (when there is validation data:
    --split with a valid part, --valid-data-path, or --mock-data)."""
    eval_iters: int = 100
    """Global batches per evaluation (0: no evaluation). Evaluation k takes the next
    eval_iters batches of the validation data (cycling), so a resumed run sees the same."""
    tokenizer_type: str | None = None
    """Tokenizer for JSONL / indexed data (default: HuggingFaceTokenizer with
    --tokenizer-model, GPT2BPETokenizer with --vocab-file/--merge-file, else
    ByteLevelTokenizer)."""
    tokenizer_model: str | None = None
    """Local path of a Hugging Face tokenizer."""
    vocab_file: str | None = None
    """GPT-2 BPE vocab.json (Megatron's GPT2BPETokenizer, with --merge-file)."""
    merge_file: str | None = None
    """GPT-2 BPE merges.txt (Megatron's GPT2BPETokenizer, with --vocab-file)."""
    sample_construction: str = "auto"
    """How samples are built: megatron (Megatron's GPTDataset: documents shuffled per epoch
    and concatenated with their EOD into --seq-length samples), document (one document per
    sample, truncated to --seq-length: post-training) or auto (megatron for indexed data;
    document for JSONL, --mock-data's long-tailed corpus and packed rows). --mock-data with
    megatron gives full --seq-length samples, as Megatron's mock data."""
    reset_position_ids: bool = False
    """Megatron's: with --sample-construction megatron, positions restart at 0 after each
    EOD of a sample (one document per sample: always so)."""
    reset_attention_mask: bool = False
    """Megatron's: with --sample-construction megatron, attention stays within each
    document of a sample (one document per sample: always so)."""
    eod_mask_loss: bool = False
    """Megatron's: no loss on the prediction made at an EOD input token (the next
    document's first token) with --sample-construction megatron."""


@dataclass(kw_only=True)
class CheckpointArgs:
    """Saving and loading."""

    save: str | None = None
    """Checkpoint directory."""
    load: str | None = None
    """Resume from the latest checkpoint in this directory (the newest one that verifies).
    A directory without a checkpoint is an error, unless --load-optional is given or it is
    also --save (resume when there is one)."""
    load_optional: bool = False
    """With --load: a missing directory or one without a checkpoint means training from
    scratch instead of an error."""
    finetune: bool = False
    """With --load: take only the model weights (saved under any layout); optimizer state,
    RNG and iteration count start afresh (Megatron's --finetune; save elsewhere). Also the
    override for a deliberate change of model when loading a Megatron checkpoint: its
    differing arguments are logged and its unused tensors dropped and listed, instead of
    the error naming each flag."""
    override_resume_iteration: int | None = None
    """With --load: continue from iteration N whatever the checkpoint records. Without it
    the iteration is the one the checkpoint records, and a directory name, `latest`,
    meta.json or rank file that disagree stop the run (a renamed or symlinked checkpoint)."""
    save_interval: int | None = None
    """Save every N iterations (and at the end)."""
    keep_checkpoints: int = 2
    """Keep the last K checkpoints this run saved (other runs' are never deleted)."""


@dataclass(kw_only=True)
class LoggingArgs:
    """What is logged and where."""

    log_interval: int = 1
    """Log every N iterations."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one device, for the MFU column (default: the dense bf16 peak of a
    known GPU, e.g. H100/H200 989; none on CPU, where MFU is not reported)."""
    log_json: str | None = None
    """Append one JSON object per logged iteration to this file (rank 0)."""
    tensorboard_dir: str | None = None
    """TensorBoard event files (when tensorboard is installed)."""
    wandb_project: str | None = None
    """Weights & Biases project: log the same record as --log-json / TensorBoard to wandb
    (rank 0; needs the ``wandb`` extra; WANDB_MODE=offline writes a local run directory)."""
    wandb_exp_name: str | None = None
    """wandb run name (with --wandb-project)."""
    wandb_save_dir: str | None = None
    """Directory for wandb's local files (with --wandb-project; default: --save/wandb when
    --save is given, else wandb's default ./wandb)."""
    no_progress_bar: bool = False
    """Plain log lines instead of a progress bar."""
    schedule_png: str | None = None
    """Write the schedule timeline picture here (rank 0)."""
    trace: str | None = None
    """Write a Chrome/Perfetto trace (torch profiler ``traceEvents`` JSON) of the measured
    F, B, W, communication, offload and step/sync time, one track per rank, to this file
    (rank 0 gathers every rank's timings), and the measured schedule picture beside it."""
    log_activation_memory: bool = False
    """Count every microbatch's saved activations (saved-tensor hooks, a few percent of step
    time) so ``peak_activation_mb`` is logged for every schedule, not only offloading
    ones."""


@dataclass(kw_only=True)
class RunArgs:
    """Length, seed and fault injection of the run."""

    seed: int = 1234
    """Seed of initialization, data order and synthetic data."""
    train_iters: int | None = None
    """Iterations (global batches) to train (default 10, or from --train-samples)."""
    train_samples: int | None = None
    """Megatron's run length in samples instead of --train-iters: samples // global batch
    iterations, as Megatron."""
    exit_interval: int | None = None
    """Stop after this iteration (after saving), as if interrupted."""
    exit_signal_handler: bool = False
    """Megatron's flag: save and exit on --exit-signal. SIGTERM is always handled so: every
    rank finishes the current iteration, saves (with --save) and exits with status 4
    (docs/preemption.md); this flag adds --exit-signal when that is another signal."""
    exit_signal: str = "SIGTERM"
    """The signal --exit-signal-handler handles besides SIGTERM (SIGINT, SIGUSR1, SIGUSR2)."""
    exit_duration_in_mins: float | None = None
    """Stop, saving with --save, after the first iteration at which a rank has run longer
    than this many minutes (every rank agrees: the maximum over ranks); exit status 0."""
    inject_fault_rank: int | None = None
    """Testing: this rank kills itself (SIGKILL) at --inject-fault-iter."""
    inject_fault_iter: int = 1
    """Testing: iteration of the injected fault."""
    inject_nonfinite_grad_iter: int | None = None
    """Testing: at this iteration the last rank writes inf into one of its gradients (the
    step must be skipped on every rank)."""


@dataclass(kw_only=True)
class TrainingArgs:
    """Every flag of ``pretrain_gpt.py``, grouped into sections; each builder is handed
    only the section(s) it needs. Cross-section combinations are validated here."""

    model: ModelArgs = field(default_factory=ModelArgs)
    """The transformer's shape and numerics."""
    parallel: ParallelArgs = field(default_factory=ParallelArgs)
    """How processes are laid out and how data parallelism runs."""
    schedule: ScheduleArgs = field(default_factory=ScheduleArgs)
    """The pipeline schedule and what it may hold in memory."""
    optimizer: OptimizerArgs = field(default_factory=OptimizerArgs)
    """AdamW, learning-rate schedule, clipping and skipped steps."""
    data: DataArgs = field(default_factory=DataArgs)
    """Samples, batches and their assignment to replicas and microbatches."""
    checkpoint: CheckpointArgs = field(default_factory=CheckpointArgs)
    """Saving and loading."""
    logging: LoggingArgs = field(default_factory=LoggingArgs)
    """What is logged and where."""
    run: RunArgs = field(default_factory=RunArgs)
    """Length, seed and fault injection of the run."""

    def __post_init__(self) -> None:
        try:
            self.data.tokenizer_type = tokenizer_type_for(
                self.data.tokenizer_type, self.data.tokenizer_model,
                vocab_file=self.data.vocab_file, merge_file=self.data.merge_file)
        except ValueError as exc:
            raise ValueError(f"invalid arguments:\n  {exc}") from None
        problems = _validate(self)
        if problems:
            raise ValueError("invalid arguments:\n  " + "\n  ".join(problems))
        self.resolution_notes: list[str] = []  # log notes of what the job's size resolved
        if self.model.ffn_hidden_size is None:
            self.model.ffn_hidden_size = 4 * self.model.hidden_size
        if self.model.max_position_embeddings is None:
            self.model.max_position_embeddings = self.model.seq_length
        if self.schedule.num_model_chunks is None:
            self.schedule.num_model_chunks = family(self.schedule.pipeline_schedule).default_chunks
        resolve_lengths(self)

    def data_parallel_size(self, world_size: int, local_world_size: int | None = None) -> int:
        """dp = world / pp, after checking every flag combination that depends on the
        job's size (so it fails before the first step, never during training); a
        ValueError naming the flags otherwise. ``local_world_size``: processes per host
        (torchrun --nproc-per-node), for --dp-mode hierarchical."""
        pp = self.parallel.pipeline_model_parallel_size
        tp = self.parallel.tensor_model_parallel_size
        cp = self.parallel.context_parallel_size
        if world_size % (pp * tp * cp):
            raise ValueError(f"world size {world_size} (torchrun --nproc-per-node x --nnodes) "
                             f"is not divisible by --pipeline-model-parallel-size {pp} x "
                             f"--tensor-model-parallel-size {tp} x "
                             f"--context-parallel-size {cp}")
        dp = world_size // (pp * tp * cp)
        if self.data.global_batch_size is None:  # Megatron's default
            self.data.global_batch_size = self.data.micro_batch_size * dp
            self.resolution_notes.append(
                f"note: no --global-batch-size: --micro-batch-size "
                f"{self.data.micro_batch_size} x data-parallel size {dp} = "
                f"{self.data.global_batch_size}, as Megatron")
            resolve_lengths(self)
        ramp = rampup_of(self.data)
        problem = ramp.divisibility_problem(self.data.micro_batch_size, dp) if ramp else None
        if problem:
            raise ValueError(problem)
        if self.model.hf_checkpoint is None and self.model.vocab_size is not None and \
                self.model.vocab_size % tp:
            raise ValueError(f"--vocab-size {self.model.vocab_size} is not divisible by "
                             f"--tensor-model-parallel-size {tp}")
        if dp > 1 and self.parallel.dp_mode == "collective" and self.data.load_balance == "lb-mini" and \
                self.schedule.num_model_chunks > 1:
            raise ValueError(
                f"--dp-mode collective with --load-balance lb-mini needs equal microbatch "
                f"counts on every replica when a pipeline rank runs several model chunks "
                f"(--pipeline-schedule {self.schedule.pipeline_schedule}, {self.schedule.num_model_chunks} "
                f"chunks): use --load-balance balanced or none, --dp-mode odc, or a "
                f"one-chunk schedule")
        if self.parallel.dp_mode == "hierarchical":
            per_host = self.parallel.ranks_per_host(local_world_size or world_size)
            if dp % per_host:
                raise ValueError(f"--dp-ranks-per-host {per_host} (default: processes per host"
                                 f" / (pp x tp)) does not divide the data-parallel size {dp}")
        if self.data.max_tokens_per_microbatch is None and \
                self.data.global_batch_size % (self.data.micro_batch_size * dp):
            raise ValueError(f"--global-batch-size {self.data.global_batch_size} must be a multiple "
                             f"of --micro-batch-size {self.data.micro_batch_size} x data-parallel "
                             f"size {dp} (or use --max-tokens-per-microbatch)")
        if self.data.global_batch_size < dp:
            raise ValueError(f"--global-batch-size {self.data.global_batch_size} is smaller than "
                             f"the data-parallel size {dp}")
        return dp


def _validate(args: TrainingArgs) -> list[str]:
    problems = []
    for name, choices in CHOICES.items():
        if _value(args, name) not in choices:
            problems.append(f"--{_flag(name)} {_value(args, name)!r} is not one of {choices}")
    positive = ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                "micro_batch_size", "global_batch_size", "pipeline_model_parallel_size",
                "train_iters", "log_interval", "keep_checkpoints", "train_samples",
                "lr_decay_samples")
    problems += [f"--{_flag(n)} must be >= 1, got {_value(args, n)}"
                 for n in positive if _value(args, n) is not None and _value(args, n) < 1]
    problems += length_conflicts(args)
    if problems:
        return problems
    return _validate_model(args) + _validate_layout(args) + _validate_run(args)


def _validate_model(args: TrainingArgs) -> list[str]:
    problems = []
    tp, model = args.parallel.tensor_model_parallel_size, args.model
    if tp < 1:
        problems.append(f"--tensor-model-parallel-size must be >= 1, got {tp}")
    if args.parallel.sequence_parallel and tp == 1:
        problems.append("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if args.parallel.keep_sp_input_for_w and not args.parallel.sequence_parallel:
        problems.append("--keep-sp-input-for-w needs --sequence-parallel")
    if tp > 1:
        for flag, value in (("--num-attention-heads", model.num_attention_heads),
                            ("--num-query-groups", model.num_query_groups),
                            ("--ffn-hidden-size", model.ffn_hidden_size)):
            if value is not None and value % tp:
                problems.append(f"{flag} {value} is not divisible by "
                                f"--tensor-model-parallel-size {tp}")
    if model.kv_channels is None and model.hidden_size % model.num_attention_heads:
        problems.append(f"--hidden-size {model.hidden_size} must be divisible by "
                        f"--num-attention-heads {model.num_attention_heads} (or give "
                        f"--kv-channels)")
    if model.group_query_attention != (model.num_query_groups is not None):
        problems.append("--group-query-attention and --num-query-groups go together")
    elif model.num_query_groups is not None and (
            model.num_query_groups < 1 or model.num_attention_heads % model.num_query_groups):
        problems.append(f"--num-query-groups {model.num_query_groups} must divide "
                        f"--num-attention-heads {model.num_attention_heads}")
    if model.use_rope_scaling and model.position_embedding_type != "rope":
        problems.append("--use-rope-scaling needs --position-embedding-type rope")
    if model.add_qkv_bias and not model.disable_bias_linear:
        problems.append("--add-qkv-bias only matters with --disable-bias-linear")
    if model.fp16 and model.bf16:
        problems.append("--fp16 and --bf16 contradict each other: give one")
    if model.fp16 and args.schedule.enable_optimizer_post_validation:
        problems.append("--fp16 does not compose with --enable-optimizer-post-validation "
                        "(the loss-scaled step is synchronous): drop one of them")
    if model.fp16:
        problems += loss_scale_problems(args.optimizer)
    problems += rampup_problems(args)
    problems += context_parallel_problems(args)
    if model.norm_epsilon <= 0 or model.rotary_base <= 0:
        problems.append("--norm-epsilon and --rotary-base must be > 0")
    if not (math.isfinite(model.init_method_std) and model.init_method_std > 0):
        problems.append(f"--init-method-std must be finite and > 0, got {model.init_method_std}")
    return problems


def _validate_layout(args: TrainingArgs) -> list[str]:
    problems = []
    pp, schedule = args.parallel.pipeline_model_parallel_size, args.schedule.pipeline_schedule
    fam = family(schedule)
    chunks = args.schedule.num_model_chunks or fam.default_chunks
    if not fam.accepts_chunks(chunks):
        if fam.max_chunks == 1:
            problems.append(f"--pipeline-schedule {schedule} runs one model chunk per rank; "
                            f"drop --num-model-chunks {chunks} or use interleaved/zbv/offload")
        else:
            wanted = (str(fam.min_chunks) if fam.max_chunks == fam.min_chunks
                      else f">= {fam.min_chunks}")
            problems.append(f"--pipeline-schedule {schedule} needs --num-model-chunks "
                            f"{wanted}, got {chunks}")
    if args.model.num_layers % (pp * chunks):
        problems.append(f"--num-layers {args.model.num_layers} must be divisible by "
                        f"--pipeline-model-parallel-size {pp} x model chunks {chunks}")
    if args.data.mock_data == bool(args.data.data_path):
        problems.append("give exactly one of --mock-data (with --vocab-size) and --data-path")
    if args.model.recompute_full != (args.model.recompute_method is not None) or \
            args.model.recompute_full != (args.model.recompute_num_layers is not None):
        problems.append("--recompute-granularity full (--recompute-full) goes with both "
                        "--recompute-method uniform|block and --recompute-num-layers N")
    elif args.model.recompute_full and args.model.recompute_num_layers < 1:
        problems.append("--recompute-num-layers must be >= 1")
    if args.data.eval_interval < 1 or args.data.eval_iters < 0:
        problems.append("--eval-interval must be >= 1 and --eval-iters >= 0")
    if args.data.split is not None and args.data.valid_data_path:
        problems.append("give one of --split (a valid part of --data-path) and "
                        "--valid-data-path")
    if args.data.split is not None and args.data.mock_data:
        problems.append("--split divides the documents of --data-path; --mock-data has none")
    if args.data.mock_data and not args.model.vocab_size:
        problems.append("--mock-data needs --vocab-size")
    if args.data.tokenizer_type == "HuggingFaceTokenizer" and not args.data.tokenizer_model and \
            args.data.data_path:
        problems.append("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model PATH")
    if args.data.mock_data and args.data.tokenizer_model:
        problems.append("--tokenizer-model is not used with --mock-data (synthetic token ids)")
    if args.model.max_position_embeddings is not None and \
            args.model.max_position_embeddings < args.model.seq_length:
        problems.append(f"--max-position-embeddings {args.model.max_position_embeddings} is "
                        f"smaller than --seq-length {args.model.seq_length}")
    if args.data.max_tokens_per_microbatch is not None and \
            args.data.max_tokens_per_microbatch < args.model.seq_length:
        problems.append(f"--max-tokens-per-microbatch {args.data.max_tokens_per_microbatch} must "
                        f"be >= --seq-length {args.model.seq_length} (a sample must fit)")
    offloading = ", ".join(f.name for f in FAMILIES if f.offloads)
    if (args.schedule.cpu_offload or args.schedule.offload_chunks) and not fam.offloads:
        problems.append(f"--cpu-offload/--offload-chunks need --pipeline-schedule "
                        f"{offloading}")
    if fam.offloads and not args.schedule.cpu_offload:
        problems.append(f"--pipeline-schedule {schedule} needs --cpu-offload")
    if args.schedule.offload_chunks and any(not 0 <= c < chunks for c in args.schedule.offload_chunks):
        problems.append(f"--offload-chunks {args.schedule.offload_chunks} must be local chunk "
                        f"indices in 0..{chunks - 1}")
    if args.schedule.memory_limit is not None and not (math.isfinite(args.schedule.memory_limit) and
                                              args.schedule.memory_limit > 0):
        problems.append(f"--memory-limit must be a finite number > 0, got {args.schedule.memory_limit}")
    return problems


def _validate_run(args: TrainingArgs) -> list[str]:
    problems = []
    if args.run.inject_nonfinite_grad_iter is not None and args.run.inject_nonfinite_grad_iter < 1:
        problems.append("--inject-nonfinite-grad-iter must be >= 1")
    if args.data.pack_sequences and args.data.no_pack_sequences:
        problems.append("--pack-sequences and --no-pack-sequences contradict each other")
    if args.schedule.profile_iters < 0:
        problems.append("--profile-iters must be >= 0")
    if not (math.isfinite(args.optimizer.lr) and args.optimizer.lr >= 0):
        problems.append(f"--lr {args.optimizer.lr} must be finite and >= 0")
    elif not (math.isfinite(args.optimizer.min_lr) and 0 <= args.optimizer.min_lr <= args.optimizer.lr):
        problems.append(f"--min-lr {args.optimizer.min_lr} must be in [0, --lr {args.optimizer.lr}]")
    problems += _decoupled_lr_problems(args.optimizer)
    if args.logging.peak_tflops is not None and not (math.isfinite(args.logging.peak_tflops) and
                                             args.logging.peak_tflops > 0):
        problems.append(f"--peak-tflops {args.logging.peak_tflops} must be finite and > 0")
    if args.optimizer.max_skipped_steps < 1:
        problems.append(f"--max-skipped-steps must be >= 1, got {args.optimizer.max_skipped_steps}")
    if args.optimizer.lr_warmup_iters < 0 or args.optimizer.clip_grad < 0 or args.optimizer.weight_decay < 0:
        problems.append("--lr-warmup-iters, --clip-grad and --weight-decay must be >= 0")
    if args.checkpoint.save_interval is not None and (args.checkpoint.save_interval < 1 or not args.checkpoint.save):
        problems.append("--save-interval needs --save DIR and must be >= 1")
    if args.checkpoint.load_optional and not args.checkpoint.load:
        problems.append("--load-optional needs --load DIR")
    if args.checkpoint.finetune and not args.checkpoint.load:
        problems.append("--finetune needs --load DIR (the checkpoint to start from)")
    override = args.checkpoint.override_resume_iteration
    if override is not None and (override < 0 or not args.checkpoint.load
                                 or args.checkpoint.finetune):
        problems.append(f"--override-resume-iteration {override} needs --load DIR, no "
                        f"--finetune, and must be >= 0")
    if args.run.exit_interval is not None and args.run.exit_interval < 1:
        problems.append("--exit-interval must be >= 1")
    if args.run.exit_signal != "SIGTERM" and not args.run.exit_signal_handler:
        problems.append(f"--exit-signal {args.run.exit_signal} needs --exit-signal-handler")
    if args.run.exit_duration_in_mins is not None and not (
            math.isfinite(args.run.exit_duration_in_mins) and args.run.exit_duration_in_mins > 0):
        problems.append(f"--exit-duration-in-mins must be a finite number > 0, got "
                        f"{args.run.exit_duration_in_mins}")
    if args.parallel.dp_ranks_per_host is not None and (args.parallel.dp_ranks_per_host < 1 or
                                               args.parallel.dp_mode != "hierarchical"):
        problems.append("--dp-ranks-per-host needs --dp-mode hierarchical and must be >= 1")
    if args.parallel.distributed_timeout_minutes <= 0:
        problems.append("--distributed-timeout-minutes must be > 0")
    problems += wandb_problems(args.logging)
    problems += sample_construction_problems(args.data)
    return problems


def _decoupled_lr_problems(optimizer: OptimizerArgs) -> list[str]:
    """Bad --decoupled-lr / --decoupled-min-lr (the LR schedule's own check)."""
    from .lr_schedule import LRSchedule

    rates = (optimizer.decoupled_lr, optimizer.decoupled_min_lr)
    if all(rate is None for rate in rates):
        return []
    if not all(rate is None or math.isfinite(rate) for rate in rates):
        return ["--decoupled-lr and --decoupled-min-lr must be finite"]
    try:
        LRSchedule(lr=max(optimizer.lr, optimizer.min_lr), min_lr=optimizer.min_lr,
                   decoupled_lr=optimizer.decoupled_lr,
                   decoupled_min_lr=optimizer.decoupled_min_lr)
    except ValueError as error:
        return [str(error)]
    return []


def loss_scale_config(optimizer: OptimizerArgs):
    """The --fp16 loss scaler's settings (:class:`odc_pp.optim.loss_scale.LossScaleConfig`)."""
    from odc_pp.optim.loss_scale import LossScaleConfig

    return LossScaleConfig(loss_scale=optimizer.loss_scale,
                           initial_scale=optimizer.initial_loss_scale,
                           min_scale=optimizer.min_loss_scale,
                           growth_interval=optimizer.loss_scale_window,
                           hysteresis=optimizer.hysteresis)


def loss_scale_problems(optimizer: OptimizerArgs) -> list[str]:
    """Bad --loss-scale / --initial-loss-scale / ... values (one line)."""
    try:
        loss_scale_config(optimizer)
    except ValueError as exc:
        return [str(exc)]
    return []


def wandb_problems(logging: LoggingArgs) -> list[str]:
    """--wandb-* flags without --wandb-project, or wandb not installed."""
    if not logging.wandb_project:
        return [f"--{_flag(name)} needs --wandb-project" for name in
                ("wandb_exp_name", "wandb_save_dir") if getattr(logging, name)]
    if importlib.util.find_spec("wandb") is None:
        return [f"--wandb-project {logging.wandb_project!r} needs the wandb package, which is "
                f"not installed: pip install 'odc-pp[wandb]' (or pip install wandb)"]
    return []


def _flag(name: str) -> str:
    return name.replace("_", "-")


@functools.lru_cache(maxsize=None)  # pure; odc-pp plan parses hundreds of flag sets
def _field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string literal after each annotated field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr) and \
                isinstance(following.value, ast.Constant) and isinstance(node.target, ast.Name):
            docs[node.target.id] = str(following.value.value)
    return docs


def _section_fields():
    """(section name, section class, field) for every flag, in help order."""
    for section in dataclasses.fields(TrainingArgs):
        cls = section.default_factory
        for item in dataclasses.fields(cls):
            yield section.name, cls, item


SECTION_OF = {item.name: section for section, _, item in _section_fields()}
"""Flag field -> the section that holds it (flags are unique across sections)."""


def _value(args: TrainingArgs, name: str):
    return getattr(getattr(args, SECTION_OF[name]), name)


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``ValueError`` (one line, the caller prints it once per job)
    instead of printing its usage block and exiting in every process."""

    def error(self, message: str):
        raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pretrain_gpt.py", description="Train a megatron-core GPT with zero-bubble "
        "pipeline parallelism and ODC data parallelism (odc-pp).", allow_abbrev=False)
    groups, docs = {}, {}
    for section, cls, item in _section_fields():
        if section not in groups:
            groups[section] = parser.add_argument_group(section, cls.__doc__)
            docs.update(_field_docs(cls))
        group = groups[section]
        flag, help_text = f"--{_flag(item.name)}", docs.get(item.name, "")
        default = item.default
        kind = str(item.type)
        if kind == "bool":
            group.add_argument(flag, action="store_true", help=help_text)
        elif kind.startswith("list[int]"):
            group.add_argument(flag, type=int, nargs="+", default=None, help=help_text)
        elif kind.startswith("list[str]"):
            group.add_argument(flag, nargs="+", default=None, help=help_text)
        else:
            convert = int if kind.startswith("int") else float if kind.startswith("float") else str
            group.add_argument(flag, type=convert, default=default, help=help_text,
                               choices=CHOICES.get(item.name))
    return parser


def args_from_flags(values: dict) -> TrainingArgs:
    """TrainingArgs from ``{field: value}`` of every flag (argparse's namespace)."""
    sections: dict[str, dict] = {}
    for name, value in values.items():
        sections.setdefault(SECTION_OF[name], {})[name] = value
    built = {section.name: section.default_factory(**sections.get(section.name, {}))
             for section in dataclasses.fields(TrainingArgs)}
    return TrainingArgs(**built)


def parse_args_with_notes(argv: list[str] | None = None) -> tuple[TrainingArgs, list[str]]:
    """Parse Megatron-style flags: the arguments and the notes for the log about pasted
    Megatron-LM flags (:mod:`.megatron_flags`). A bad value or combination, a rejected
    pasted flag or an unknown flag raises one ``ValueError`` with a line per flag."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    native = frozenset(o for action in parser._actions for o in action.option_strings)
    translation = translate_megatron_flags(argv, native)
    argv, notes = translation.argv, translation.notes
    namespace, unknown = parser.parse_known_args(argv)
    problems = translation.problems + unknown_lines(unknown, native)
    if problems:
        raise ValueError(f"{len(problems)} flag{'s' * (len(problems) > 1)} not taken:\n  "
                         + "\n  ".join(problems))
    values = vars(namespace)
    notes += megatron_tolerances(values)
    if values.get("hf_checkpoint"):
        from odc_pp.megatron.hf_config import given_flags, merge_hf_flags

        values = merge_hf_flags(values, given_flags(argv), values["hf_checkpoint"])
        notes.append(f"note: --hf-checkpoint {values['hf_checkpoint']}: architecture and "
                     f"weights from its config.json and safetensors")
    args = args_from_flags(values)
    if args.model.fp16:
        opt = args.optimizer
        notes.append("note: --fp16: float16 compute, fp32 master weights, " + (
            f"constant loss scale {opt.loss_scale}" if opt.loss_scale is not None else
            f"Megatron's dynamic loss scale from {opt.initial_loss_scale:g}"))
    if args.data.rampup_batch_size:
        notes.append(f"note: --rampup-batch-size {' '.join(map(str, args.data.rampup_batch_size))}"
                     f": the global batch ramps up to --global-batch-size "
                     f"{args.data.global_batch_size} as Megatron")
    if values.get("tokenizer_type") is None and values.get("tokenizer_model"):
        notes.append(f"note: --tokenizer-model {values['tokenizer_model']} without "
                     f"--tokenizer-type: HuggingFaceTokenizer")
    notes.append(sample_construction_note(args))
    if args.optimizer.lr == 0:
        notes.append("warning: --lr 0: the weights will not change (evaluation / parity run)")
    return args, notes


def parse_args(argv: list[str] | None = None) -> TrainingArgs:
    """:func:`parse_args_with_notes` without the notes."""
    return parse_args_with_notes(argv)[0]
