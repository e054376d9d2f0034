"""Megatron-style command-line arguments, backed by one validated dataclass.

Every field of :class:`TrainingArgs` is a flag: ``num_layers`` -> ``--num-layers``; its
docstring is the flag's help. Validation of combinations happens in ``__post_init__``
and raises one ``ValueError`` that names the flags to change.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import math
import sys
import textwrap
from dataclasses import dataclass

from odc_pp.data.planner import LOAD_BALANCE_MODES
from odc_pp.schedule.generators.families import FAMILIES, FAMILY_NAMES, family

from .megatron_flags import translate as translate_megatron_flags

__all__ = ["TrainingArgs", "parse_args", "parse_args_with_notes", "build_parser", "DP_MODES",
           "LOAD_BALANCE"]

DP_MODES = ("odc", "collective", "hierarchical")
LOAD_BALANCE = LOAD_BALANCE_MODES
CHOICES = {
    "pipeline_schedule": FAMILY_NAMES,
    "dp_mode": DP_MODES,
    "load_balance": LOAD_BALANCE,
    "lr_decay_style": ("constant", "linear", "cosine"),
    "tokenizer_type": ("ByteLevelTokenizer", "HuggingFaceTokenizer"),
}


@dataclass(kw_only=True)
class TrainingArgs:
    # ----- model ------------------------------------------------------------------
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
    """Vocabulary size for --mock-data (other data take it from the tokenizer)."""
    make_vocab_size_divisible_by: int = 8
    """Pad the tokenizer's vocabulary to a multiple of this."""
    # ----- batch ------------------------------------------------------------------
    micro_batch_size: int = 1
    """Samples per microbatch."""
    global_batch_size: int = 8
    """Samples per iteration, over all data-parallel ranks."""
    max_tokens_per_microbatch: int | None = None
    """Pack microbatches by padded tokens (count x longest) instead of --micro-batch-size."""
    # ----- parallelism ------------------------------------------------------------
    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel size (pp); data-parallel size is world size / pp."""
    tensor_model_parallel_size: int = 1
    """Tensor parallelism: only 1 is supported."""
    pipeline_schedule: str = "1f1b"
    """Pipeline schedule."""
    num_model_chunks: int | None = None
    """Model chunks per pipeline rank (default 2 for V schedules and interleaved, else 1)."""
    memory_limit: float | None = None
    """Activation-memory limit per rank, in microbatch-chunk activations (zb-auto, v-min, offload)."""
    cpu_offload: bool = False
    """Offload saved activations to host memory (schedule 'offload')."""
    offload_chunks: list[int] | None = None
    """Local model chunks whose activations are offloaded (default: all)."""
    recompute_lgd: bool = False
    """Recompute layernorm/GeLU/dropout outputs in backward instead of saving them."""
    enable_optimizer_post_validation: bool = False
    """Zero-bubble optimizer post-validation (step speculatively, roll back on inf/nan or clip)."""
    dp_mode: str = "odc"
    """Data-parallel engine: odc (one-sided sharded), collective (all-reduce), hierarchical."""
    dp_ranks_per_host: int | None = None
    """hierarchical: data-parallel ranks per host (default: local processes / pp)."""
    nondeterministic_dp: bool = False
    """Let ODC add gradients in arrival order (faster; resume no longer bit-exact)."""
    load_balance: str = "none"
    """Assignment of samples to data-parallel ranks and microbatches: none (strided
    equal-count split), lb-mini (replicas balanced by cost, any microbatch count per
    replica: odc / hierarchical), balanced (replicas balanced by cost with equal microbatch
    counts on every replica: any dp mode)."""
    cost_model: str | None = None
    """JSON file of a CostModel for schedule generation (default: measured/uniform)."""
    # ----- optimizer --------------------------------------------------------------
    lr: float = 1e-3
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of decay."""
    lr_decay_style: str = "cosine"
    """Decay after warmup."""
    lr_warmup_iters: int = 0
    """Linear warmup iterations."""
    lr_decay_iters: int | None = None
    """Decay length (default: --train-iters)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    clip_grad: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    bf16: bool = False
    """Compute in bfloat16 (fp32 master weights)."""
    seed: int = 1234
    """Seed of initialization, data order and synthetic data."""
    # ----- run, data, checkpoints, logging -----------------------------------------
    train_iters: int = 10
    """Iterations (global batches) to train."""
    exit_interval: int | None = None
    """Stop after this iteration (after saving), as if interrupted."""
    data_path: list[str] | None = None
    """JSONL file(s) or indexed-dataset prefix(es)."""
    mock_data: bool = False
    """Use the built-in synthetic long-tailed corpus (needs --vocab-size)."""
    tokenizer_type: str = "ByteLevelTokenizer"
    """Tokenizer for JSONL / indexed data."""
    tokenizer_model: str | None = None
    """Local path of a Hugging Face tokenizer."""
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
    RNG and iteration count start afresh (Megatron's --finetune; save elsewhere)."""
    save_interval: int | None = None
    """Save every N iterations (and at the end)."""
    keep_checkpoints: int = 2
    """Keep the last K checkpoints this run saved (other runs' are never deleted)."""
    log_interval: int = 1
    """Log every N iterations."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one device, for the MFU column (default: the dense bf16 peak of a
    known GPU, e.g. H100/H200 989; none on CPU, where MFU is not reported)."""
    max_skipped_steps: int = 10
    """Stop (exit 3) after this many consecutive skipped optimizer steps (inf/nan
    gradients); a non-finite loss stops the job at once."""
    log_json: str | None = None
    """Append one JSON object per logged iteration to this file (rank 0)."""
    tensorboard_dir: str | None = None
    """TensorBoard event files (when tensorboard is installed)."""
    no_progress_bar: bool = False
    """Plain log lines instead of a progress bar."""
    distributed_timeout_minutes: float = 5.0
    """Longest wait on a peer before the job fails."""
    schedule_png: str | None = None
    """Write the schedule timeline picture here (rank 0)."""
    inject_fault_rank: int | None = None
    """Testing: this rank kills itself (SIGKILL) at --inject-fault-iter."""
    inject_fault_iter: int = 1
    """Testing: iteration of the injected fault."""
    inject_nonfinite_grad_iter: int | None = None
    """Testing: at this iteration the last rank writes inf into one of its gradients (the
    step must be skipped on every rank)."""
    profile_iters: int = 2
    """zb-auto: iterations profiled (the first one as warm-up when > 1) before re-planning
    the schedule from the measured per-stage costs; 0 keeps the initial plan."""

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise ValueError("invalid arguments:\n  " + "\n  ".join(problems))
        if self.ffn_hidden_size is None:
            self.ffn_hidden_size = 4 * self.hidden_size
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
        if self.num_model_chunks is None:
            self.num_model_chunks = family(self.pipeline_schedule).default_chunks
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.train_iters

    def data_parallel_size(self, world_size: int, local_world_size: int | None = None) -> int:
        """dp = world / pp, after checking every flag combination that depends on the
        job's size (so it fails before the first step, never during training); a
        ValueError naming the flags otherwise. ``local_world_size``: processes per host
        (torchrun --nproc-per-node), for --dp-mode hierarchical."""
        pp = self.pipeline_model_parallel_size
        if world_size % pp:
            raise ValueError(f"world size {world_size} (torchrun --nproc-per-node x --nnodes) "
                             f"is not divisible by --pipeline-model-parallel-size {pp}")
        dp = world_size // pp
        if dp > 1 and self.dp_mode == "collective" and self.load_balance == "lb-mini" and \
                self.num_model_chunks > 1:
            raise ValueError(
                f"--dp-mode collective with --load-balance lb-mini needs equal microbatch "
                f"counts on every replica when a pipeline rank runs several model chunks "
                f"(--pipeline-schedule {self.pipeline_schedule}, {self.num_model_chunks} "
                f"chunks): use --load-balance balanced or none, --dp-mode odc, or a "
                f"one-chunk schedule")
        if self.dp_mode == "hierarchical":
            per_host = self.dp_ranks_per_host or max(1, (local_world_size or world_size) // pp)
            if dp % per_host:
                raise ValueError(f"--dp-ranks-per-host {per_host} (default: processes per host"
                                 f" / pp) does not divide the data-parallel size {dp}")
        if self.max_tokens_per_microbatch is None and \
                self.global_batch_size % (self.micro_batch_size * dp):
            raise ValueError(f"--global-batch-size {self.global_batch_size} must be a multiple "
                             f"of --micro-batch-size {self.micro_batch_size} x data-parallel "
                             f"size {dp} (or use --max-tokens-per-microbatch)")
        if self.global_batch_size < dp:
            raise ValueError(f"--global-batch-size {self.global_batch_size} is smaller than "
                             f"the data-parallel size {dp}")
        return dp


def _validate(args: TrainingArgs) -> list[str]:
    problems = []
    for name, choices in CHOICES.items():
        if getattr(args, name) not in choices:
            problems.append(f"--{_flag(name)} {getattr(args, name)!r} is not one of {choices}")
    positive = ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                "micro_batch_size", "global_batch_size", "pipeline_model_parallel_size",
                "train_iters", "log_interval", "keep_checkpoints")
    problems += [f"--{_flag(n)} must be >= 1, got {getattr(args, n)}"
                 for n in positive if getattr(args, n) < 1]
    if problems:
        return problems
    pp, schedule = args.pipeline_model_parallel_size, args.pipeline_schedule
    if args.tensor_model_parallel_size != 1:
        problems.append("--tensor-model-parallel-size other than 1 is not supported "
                        "(odc-pp composes pipeline and data parallelism only)")
    if args.hidden_size % args.num_attention_heads:
        problems.append(f"--hidden-size {args.hidden_size} must be divisible by "
                        f"--num-attention-heads {args.num_attention_heads}")
    fam = family(schedule)
    chunks = args.num_model_chunks or fam.default_chunks
    if not fam.accepts_chunks(chunks):
        if fam.max_chunks == 1:
            problems.append(f"--pipeline-schedule {schedule} runs one model chunk per rank; "
                            f"drop --num-model-chunks {chunks} or use interleaved/zbv/offload")
        else:
            wanted = (str(fam.min_chunks) if fam.max_chunks == fam.min_chunks
                      else f">= {fam.min_chunks}")
            problems.append(f"--pipeline-schedule {schedule} needs --num-model-chunks "
                            f"{wanted}, got {chunks}")
    if args.num_layers % (pp * chunks):
        problems.append(f"--num-layers {args.num_layers} must be divisible by "
                        f"--pipeline-model-parallel-size {pp} x model chunks {chunks}")
    if args.mock_data == bool(args.data_path):
        problems.append("give exactly one of --mock-data (with --vocab-size) and --data-path")
    if args.mock_data and not args.vocab_size:
        problems.append("--mock-data needs --vocab-size")
    if args.tokenizer_type == "HuggingFaceTokenizer" and not args.tokenizer_model and \
            args.data_path:
        problems.append("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model PATH")
    if args.max_position_embeddings is not None and \
            args.max_position_embeddings < args.seq_length:
        problems.append(f"--max-position-embeddings {args.max_position_embeddings} is "
                        f"smaller than --seq-length {args.seq_length}")
    if args.max_tokens_per_microbatch is not None and \
            args.max_tokens_per_microbatch < args.seq_length:
        problems.append(f"--max-tokens-per-microbatch {args.max_tokens_per_microbatch} must "
                        f"be >= --seq-length {args.seq_length} (a sample must fit)")
    offloading = ", ".join(f.name for f in FAMILIES if f.offloads)
    if (args.cpu_offload or args.offload_chunks) and not fam.offloads:
        problems.append(f"--cpu-offload/--offload-chunks need --pipeline-schedule "
                        f"{offloading}")
    if fam.offloads and not args.cpu_offload:
        problems.append(f"--pipeline-schedule {schedule} needs --cpu-offload")
    if args.offload_chunks and any(not 0 <= c < chunks for c in args.offload_chunks):
        problems.append(f"--offload-chunks {args.offload_chunks} must be local chunk "
                        f"indices in 0..{chunks - 1}")
    if args.memory_limit is not None and not (math.isfinite(args.memory_limit) and
                                              args.memory_limit > 0):
        problems.append(f"--memory-limit must be a finite number > 0, got {args.memory_limit}")
    if args.inject_nonfinite_grad_iter is not None and args.inject_nonfinite_grad_iter < 1:
        problems.append("--inject-nonfinite-grad-iter must be >= 1")
    if args.profile_iters < 0:
        problems.append("--profile-iters must be >= 0")
    if not (math.isfinite(args.lr) and args.lr >= 0):
        problems.append(f"--lr {args.lr} must be finite and >= 0")
    elif not (math.isfinite(args.min_lr) and 0 <= args.min_lr <= args.lr):
        problems.append(f"--min-lr {args.min_lr} must be in [0, --lr {args.lr}]")
    if args.peak_tflops is not None and not (math.isfinite(args.peak_tflops) and
                                             args.peak_tflops > 0):
        problems.append(f"--peak-tflops {args.peak_tflops} must be finite and > 0")
    if args.max_skipped_steps < 1:
        problems.append(f"--max-skipped-steps must be >= 1, got {args.max_skipped_steps}")
    if args.lr_warmup_iters < 0 or args.clip_grad < 0 or args.weight_decay < 0:
        problems.append("--lr-warmup-iters, --clip-grad and --weight-decay must be >= 0")
    if args.save_interval is not None and (args.save_interval < 1 or not args.save):
        problems.append("--save-interval needs --save DIR and must be >= 1")
    if args.load_optional and not args.load:
        problems.append("--load-optional needs --load DIR")
    if args.finetune and not args.load:
        problems.append("--finetune needs --load DIR (the checkpoint to start from)")
    if args.exit_interval is not None and args.exit_interval < 1:
        problems.append("--exit-interval must be >= 1")
    if args.dp_ranks_per_host is not None and (args.dp_ranks_per_host < 1 or
                                               args.dp_mode != "hierarchical"):
        problems.append("--dp-ranks-per-host needs --dp-mode hierarchical and must be >= 1")
    if args.distributed_timeout_minutes <= 0:
        problems.append("--distributed-timeout-minutes must be > 0")
    return problems


def _flag(name: str) -> str:
    return name.replace("_", "-")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pretrain_gpt.py", description="Train a megatron-core GPT with zero-bubble "
        "pipeline parallelism and ODC data parallelism (odc-pp).", allow_abbrev=False)
    docs = _field_docs(TrainingArgs)
    for item in dataclasses.fields(TrainingArgs):
        flag, help_text = f"--{_flag(item.name)}", docs.get(item.name, "")
        default = item.default
        kind = str(item.type)
        if kind == "bool":
            parser.add_argument(flag, action="store_true", help=help_text)
        elif kind.startswith("list[int]"):
            parser.add_argument(flag, type=int, nargs="+", default=None, help=help_text)
        elif kind.startswith("list[str]"):
            parser.add_argument(flag, nargs="+", default=None, help=help_text)
        else:
            convert = int if kind.startswith("int") else float if kind.startswith("float") else str
            parser.add_argument(flag, type=convert, default=default, help=help_text,
                                choices=CHOICES.get(item.name))
    return parser


def parse_args_with_notes(argv: list[str] | None = None) -> tuple[TrainingArgs, list[str]]:
    """Parse Megatron-style flags: the arguments and the notes for the log about pasted
    Megatron-LM flags (:mod:`.megatron_flags`). A bad value or combination, or a rejected
    pasted flag, raises ``ValueError`` (argparse's own errors -- unknown flag, bad type --
    exit with status 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    argv, notes = translate_megatron_flags(argv)
    namespace = build_parser().parse_args(argv)
    args = TrainingArgs(**vars(namespace))
    if args.lr == 0:
        notes.append("warning: --lr 0: the weights will not change (evaluation / parity run)")
    return args, notes


def parse_args(argv: list[str] | None = None) -> TrainingArgs:
    """:func:`parse_args_with_notes` without the notes."""
    return parse_args_with_notes(argv)[0]
