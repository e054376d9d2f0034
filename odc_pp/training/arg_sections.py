"""The sections of ``pretrain_gpt.py``'s arguments: one validated dataclass per section
(model, parallel, schedule, optimizer, data, checkpoint, logging, run) and
:class:`TrainingArgs`, which holds them. Every field is a flag named as in Megatron-LM
(``model.num_layers`` -> ``--num-layers``); its docstring is the flag's help. Validation of
combinations (:mod:`.argument_checks`) runs in ``TrainingArgs.__post_init__``; the parser is
:mod:`.arguments`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from odc_pp.data.record_checks import DEFAULT_MAX_DROPPED_FRACTION
from odc_pp.data.tokenizer_identity import default_tokenizer_model
from odc_pp.data.tokenizers import tokenizer_type_for
from odc_pp.schedule.generators.families import family

from .argument_checks import validate
from .logging_args import LoggingArgs
from .megatron_semantics import resolve_lengths

if TYPE_CHECKING:
    from .job import Job

__all__ = ["TrainingArgs", "ModelArgs", "ParallelArgs", "ScheduleArgs", "OptimizerArgs",
           "DataArgs", "CheckpointArgs", "LoggingArgs", "RunArgs"]


@dataclass(kw_only=True)
class ModelArgs:
    """The transformer's shape and numerics."""

    num_layers: int = 4
    """Number of transformer layers of the model (all pipeline stages together)."""
    hidden_size: int = 64
    """Hidden size: the width of the model's residual stream."""
    num_attention_heads: int = 4
    """Number of attention heads in each layer."""
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
    hidden_dropout: float = 0.1
    """Dropout on the embedding and after attention and the MLP (Megatron's default)."""
    attention_dropout: float = 0.1
    """Dropout on the attention probabilities (Megatron's default)."""
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
    (docs/gpu.md). Under auto or varlen, unpacked rows shorter than --seq-length also
    run varlen (one document per row) where it applies."""
    fused_swiglu: str = "auto"
    """--swiglu's activation as one Triton kernel per direction: auto (on CUDA where the
    kernel runs and matches the eager path), on (an error where it cannot), off
    (odc_pp/megatron/swiglu_triton.py)."""
    fused_rope: str = "auto"
    """RoPE (--position-embedding-type rope) as one Triton kernel per direction, applied in
    the SDPA core attention with cos/sin computed once per microbatch: auto (on CUDA where
    the kernel runs and matches megatron's formula, unless Transformer Engine's fused RoPE
    is installed or context parallelism splits the sequence), on (an error where it
    cannot), off (odc_pp/megatron/rope_triton.py)."""
    fused_cross_entropy: str = "auto"
    """The output layer and the loss in one pass over token chunks, never holding the
    tokens x vocabulary logits: auto (on CUDA), on, off. The output layer's weight
    gradient is then computed in F, not deferred to W
    (odc_pp/megatron/linear_cross_entropy.py); tensor parallelism keeps the unfused
    path."""

    @property
    def compute_dtype(self) -> str:
        """The parameters' compute dtype: bfloat16 (--bf16), float16 (--fp16) or float32."""
        return "bfloat16" if self.bf16 else "float16" if self.fp16 else "float32"


@dataclass(kw_only=True)
class ParallelArgs:
    """How processes are laid out and how data parallelism runs."""

    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel size (pp); data-parallel size is world size / (pp x tp)."""
    decoder_first_pipeline_num_layers: int | None = None
    """Decoder layers of the first pipeline stage (Megatron's uneven pipeline: the middle
    stages share the layers the first and last stages leave, evenly; with several model
    chunks each chunk of the stage holds an equal part)."""
    decoder_last_pipeline_num_layers: int | None = None
    """Decoder layers of the last pipeline stage (Megatron's uneven pipeline, as
    --decoder-first-pipeline-num-layers)."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as one layer of the pipeline split (Megatron's meaning):
    --num-layers + 1 is split evenly over the virtual stages and the first (rank 0's first
    chunk) holds one decoder layer fewer; not with --decoder-first-pipeline-num-layers."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the loss as one layer of the pipeline split (Megatron's meaning): the last
    virtual stage (the last rank's last chunk) holds one decoder layer fewer."""
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
    dynamic_context_parallel: bool = False
    """Variable context parallelism (needs --context-parallel-size N > 1, --load-balance
    lb-mini with packed rows, --max-tokens-per-microbatch, --dp-mode odc): only the rows
    holding a document longer than a lane's share (--max-tokens-per-microbatch / N) are
    split over the N context-parallel ranks; the other samples are packed again into
    rows of that share and each rank runs its own (docs/context_parallel.md)."""
    sequence_parallel: bool = False
    """Split the activations outside the tensor-parallel regions (norms, dropout, the
    pipeline's point-to-point tensors) along the sequence over the tp ranks; needs tp > 1.
    Microbatches are padded to a multiple of tp."""
    keep_sp_input_for_w: bool = False
    """Sequence parallelism: keep each column-parallel linear's all-gathered input from B
    until its deferred weight gradient (W), instead of gathering it again in W. Saves one
    all-gather per linear in W for tp times the bytes of its input held until W."""
    dp_mode: str = "odc"
    """Data-parallel engine: odc (one-sided sharded), collective (all-reduce), hierarchical, ddp (Megatron's DDP + distributed optimizer)."""
    dp_ranks_per_host: int | None = None
    """With `--dp-mode hierarchical`: data-parallel ranks per host (default: local
    processes / (pp x tp), the model copies one host holds)."""
    nondeterministic_dp: bool = False
    """Let ODC add gradients in arrival order (faster; resume no longer bit-exact)."""
    odc_param_residency: str = "auto"
    """How long ODC keeps a chunk's gathered parameters: minibatch (from first use to the
    optimizer step: no re-gathering), layer (each transformer layer only while it
    computes, FSDP's per-layer gather and free: the memory of one layer instead of the
    chunk's, for one more read of the layer per F and B), or auto: layer where the memory
    plan of minibatch exceeds the GPU's memory (the dry run: --memory-gb), else
    minibatch. Data-parallel size 1 gathers nothing either way."""
    grad_reduce_in_bf16: bool = False
    """Megatron's flag: with --bf16, each chunk's local weight-gradient buffer (main_grad,
    summed over the minibatch's microbatches, data-parallel size > 1) is bf16 instead of
    fp32: half its bytes. The owners' accumulators and the optimizer stay fp32."""
    distributed_timeout_minutes: float = 5.0
    """Longest wait on a peer before the job fails."""
    distributed_backend: str = "nccl"
    """Megatron's flag: the collectives' backend on GPUs, nccl (gloo for CPU tensors
    beside it) or gloo (CUDA tensors too: slower, but it runs ranks that share one GPU,
    which NCCL refuses). CPU runs use gloo whatever it says."""


@dataclass(kw_only=True)
class ScheduleArgs:
    """The pipeline schedule and what it may hold in memory."""

    pipeline_schedule: str = "1f1b"
    """Pipeline schedule family: the order of forwards, backwards and weight gradients on
    each pipeline rank (docs/schedules.md)."""
    num_model_chunks: int | None = None
    """Model chunks per pipeline rank (default 2 for V schedules and interleaved, else 1)."""
    memory_limit: float | None = None
    """Activation-memory limit per rank, in microbatch-chunk activations (zb-auto, zb-h2, zbv, v-half, v-min, offload)."""
    cpu_offload: bool = False
    """Offload saved activations to host memory (schedule 'offload')."""
    offload_chunks: list[int] | None = None
    """Local model chunks whose activations are offloaded (default: all)."""
    selective_offload: bool = False
    """PipeOffload's selective offload: of the offloaded chunks, move only the microbatch
    passes whose activations live long enough to hide both host transfers (the cost
    model's offload time), each rank its longest-lived ones while the simulated iteration
    stays as short as without offload; the others stay on the device. PO-H: --offload-chunks
    of the first half of the chunks; PO-F: all chunks."""
    microbatch_group_size_per_virtual_pipeline_stage: int | None = None
    """Megatron's flag: microbatches run through one model chunk at a time (interleaved:
    >= pp, default pp; gis and offload: 1..pp, PipeOffload's group-interleaved order, 1 its
    uniform repeating order; gis defaults to ceil(pp/2), offload without it runs
    Megatron's order)."""
    enable_optimizer_post_validation: bool = False
    """Zero-bubble optimizer post-validation (step speculatively, roll back on inf/nan or clip)."""
    cost_model: str | None = None
    """JSON file of a CostModel for schedule generation (default: measured/uniform)."""
    profile_iters: int = 2
    """zb-auto and --fill-pipeline-gaps: iterations profiled (the first one as warm-up when
    > 1) before re-planning the schedule from the measured per-stage costs; 0 keeps the
    initial plan."""
    fill_pipeline_gaps: bool = False
    """Move weight-gradient work (W) into the schedule's idle gaps, within its memory cap
    (a fixed pattern: its own peak), and re-plan so from the costs measured over
    --profile-iters (any schedule but offload; the losses stay the same)."""


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
    """AdamW's beta1, the decay rate of the first-moment estimate."""
    adam_beta2: float = 0.95
    """AdamW's beta2, the decay rate of the second-moment estimate."""
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
    --tokenizer-model or --hf-checkpoint, GPT2BPETokenizer with --vocab-file/--merge-file,
    else ByteLevelTokenizer)."""
    tokenizer_model: str | None = None
    """Local path of a Hugging Face tokenizer (default with --hf-checkpoint: its own; a
    checkpoint directory without one needs this or --tokenizer-type)."""
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
    max_dropped_records_fraction: float = DEFAULT_MAX_DROPPED_FRACTION
    """The largest fraction of a JSONL file's records that may give no sample (an unknown
    chat role, no assistant turn, fewer than 2 tokens) before the file is an error; the
    first few are named either way."""
    drop_unscored_samples: bool = False
    """Drop the JSONL samples whose scored tokens all lie beyond --seq-length (kept by
    default, as Megatron keeps them, and counted at start-up)."""


@dataclass(kw_only=True)
class CheckpointArgs:
    """Saving and loading."""

    save: str | None = None
    """Directory to save checkpoints in (each save a new iteration directory)."""
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
    override_consumed_samples: int | None = None
    """With --load: continue from training sample N instead of the consumed samples the
    checkpoint records, skipping or repeating samples on purpose."""
    save_interval: int | None = None
    """Save every N iterations (and at the end)."""
    keep_checkpoints: int = 2
    """Keep the last K checkpoints this run saved (other runs' are never deleted)."""


@dataclass(kw_only=True)
class RunArgs:
    """Length, seed and exit of the run."""

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
    """Length, seed and exit of the run."""

    def __post_init__(self) -> None:
        try:
            self.data.tokenizer_model = default_tokenizer_model(
                self.data.tokenizer_type, self.data.tokenizer_model,
                vocab_file=self.data.vocab_file, merge_file=self.data.merge_file,
                hf_checkpoint=self.model.hf_checkpoint, mock_data=self.data.mock_data)
            self.data.tokenizer_type = tokenizer_type_for(
                self.data.tokenizer_type, self.data.tokenizer_model,
                vocab_file=self.data.vocab_file, merge_file=self.data.merge_file)
        except ValueError as exc:
            raise ValueError(f"invalid arguments:\n  {exc}") from None
        problems = validate(self)
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

    def resolve(self, world_size: int, local_world_size: int | None = None) -> Job:
        """The :class:`~odc_pp.training.job.Job` of these flags over ``world_size``
        processes (``local_world_size`` per host: torchrun --nproc-per-node), after every
        check that depends on the job's size (so it fails before the first step, never
        during training); a ValueError naming the flags otherwise. Call it once per entry
        point; these args are not changed (the job holds its own resolved copy)."""
        from .job import Job

        return Job.resolve(self, world_size, local_world_size)
