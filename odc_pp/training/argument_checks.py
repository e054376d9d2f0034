"""Validation of :class:`~odc_pp.training.arg_sections.TrainingArgs` (``args`` below; its
sections ``optimizer``, ``logging``): every flag combination that can be checked without
the job's size, each problem one line naming the
flags to change (``TrainingArgs.__post_init__`` joins them into one ``ValueError``), and the
choices of the enumerated flags."""

from __future__ import annotations

import dataclasses
import importlib.util
import math

from odc_pp.data.assignment import LOAD_BALANCE_MODES
from odc_pp.layout import DataParallelMode
from odc_pp.schedule.generators.families import FAMILIES, FAMILY_NAMES, family

from .context_checks import context_parallel_problems, padded_length_problems
from .logging_args import tensorboard_problems
from .megatron_semantics import length_conflicts
from .rampup import rampup_problems
from .sample_construction import SAMPLE_CONSTRUCTIONS, sample_construction_problems

__all__ = ["CHOICES", "DP_MODES", "LOAD_BALANCE", "validate", "loss_scale_config",
           "loss_scale_problems", "wandb_problems", "flag_name"]

DP_MODES = tuple(mode.value for mode in DataParallelMode)
LOAD_BALANCE = LOAD_BALANCE_MODES
CHOICES = {
    "pipeline_schedule": FAMILY_NAMES,
    "dp_mode": DP_MODES,
    "odc_param_residency": ("auto", "minibatch", "layer"),
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
    "fused_cross_entropy": ("auto", "on", "off"),
    "fused_swiglu": ("auto", "on", "off"),
    "fused_rope": ("auto", "on", "off"),
    "distributed_backend": ("nccl", "gloo"),
}



def flag_name(name: str) -> str:
    """A field's flag without the dashes (``num_layers`` -> ``num-layers``)."""
    return name.replace("_", "-")


_flag = flag_name


def _value(args, name: str):
    """The value of flag field ``name`` in whichever section holds it."""
    for section in dataclasses.fields(args):
        holder = getattr(args, section.name)
        if hasattr(holder, name):
            return getattr(holder, name)
    raise KeyError(name)


def validate(args) -> list[str]:
    """Every problem of ``args`` (empty when valid)."""
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


def _validate_model(args) -> list[str]:
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
    problems += padded_length_problems(args)
    if model.norm_epsilon <= 0 or model.rotary_base <= 0:
        problems.append("--norm-epsilon and --rotary-base must be > 0")
    if not (math.isfinite(model.init_method_std) and model.init_method_std > 0):
        problems.append(f"--init-method-std must be finite and > 0, got {model.init_method_std}")
    for flag, value in (("--hidden-dropout", model.hidden_dropout),
                        ("--attention-dropout", model.attention_dropout)):
        if not 0.0 <= value < 1.0:
            problems.append(f"{flag} must be in [0, 1), got {value}")
    return problems


def _validate_layout(args) -> list[str]:
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
    parallel = args.parallel
    first, last = (parallel.decoder_first_pipeline_num_layers,
                   parallel.decoder_last_pipeline_num_layers)
    embedding, loss = (parallel.account_for_embedding_in_pipeline_split,
                       parallel.account_for_loss_in_pipeline_split)
    if first is not None or last is not None or embedding or loss:  # Megatron's checks
        from odc_pp.schedule.stage_layout import StageLayout
        try:
            StageLayout.resolve(args.model.num_layers, pp, chunks, first=first, last=last,
                                account_embedding=embedding, account_loss=loss)
        except ValueError as exc:
            problems.append(str(exc))
    elif args.model.num_layers % (pp * chunks):
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
    problems += _group_size_problems(args.schedule, fam, pp)
    if args.schedule.selective_offload and not fam.offloads:
        problems.append(f"--selective-offload needs --pipeline-schedule {offloading}")
    if args.schedule.memory_limit is not None and not (math.isfinite(args.schedule.memory_limit) and
                                              args.schedule.memory_limit > 0):
        problems.append(f"--memory-limit must be a finite number > 0, got {args.schedule.memory_limit}")
    return problems


def _group_size_problems(schedule, fam, pp: int) -> list[str]:
    """--microbatch-group-size-per-virtual-pipeline-stage against the schedule family."""
    group = schedule.microbatch_group_size_per_virtual_pipeline_stage
    flag = "--microbatch-group-size-per-virtual-pipeline-stage"
    if group is None:
        return []
    if "group_size" not in fam.options:
        return [f"{flag} needs a grouped --pipeline-schedule (interleaved, gis, offload), "
                f"not {fam.name}"]
    if group < 1 or (fam.name == "gis" and group > pp):
        return [f"{flag} {group} must be in 1..{pp} (pp) for --pipeline-schedule gis"]
    if fam.name == "interleaved" and group < pp:
        return [f"{flag} {group} is below pp ({pp}): Megatron's interleaved order needs a "
                f"group that fills the pipeline; --pipeline-schedule gis takes 1..pp"]
    return []


def _validate_run(args) -> list[str]:
    problems = []
    if args.data.pack_sequences and args.data.no_pack_sequences:
        problems.append("--pack-sequences and --no-pack-sequences contradict each other")
    if args.schedule.profile_iters < 0:
        problems.append("--profile-iters must be >= 0")
    if args.schedule.fill_pipeline_gaps and family(args.schedule.pipeline_schedule).offloads:
        problems.append(f"--fill-pipeline-gaps does not apply to --pipeline-schedule "
                        f"{args.schedule.pipeline_schedule} (its OFFLOAD/RELOAD timing is "
                        f"planned with the order it builds)")
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
    consumed = args.checkpoint.override_consumed_samples
    if consumed is not None and (consumed < 0 or not args.checkpoint.load
                                 or args.checkpoint.finetune):
        problems.append(f"--override-consumed-samples {consumed} needs --load DIR, no "
                        f"--finetune, and must be >= 0")
    if args.run.exit_interval is not None and args.run.exit_interval < 1:
        problems.append("--exit-interval must be >= 1")
    if args.run.exit_signal != "SIGTERM" and not args.run.exit_signal_handler:
        problems.append(f"--exit-signal {args.run.exit_signal} needs --exit-signal-handler")
    if args.run.exit_duration_in_mins is not None and not (
            math.isfinite(args.run.exit_duration_in_mins) and args.run.exit_duration_in_mins > 0):
        problems.append(f"--exit-duration-in-mins must be a finite number > 0, got "
                        f"{args.run.exit_duration_in_mins}")
    if not 0 <= args.data.max_dropped_records_fraction <= 1:  # nan too
        problems.append(f"--max-dropped-records-fraction must be in [0, 1], got "
                        f"{args.data.max_dropped_records_fraction}")
    timeout = args.parallel.distributed_timeout_minutes
    if not (math.isfinite(timeout) and timeout > 0):
        problems.append(f"--distributed-timeout-minutes must be a positive finite number of "
                        f"minutes, got {timeout}")
    problems += wandb_problems(args.logging) + tensorboard_problems(args.logging)
    problems += sample_construction_problems(args.data)
    return problems


def _decoupled_lr_problems(optimizer) -> list[str]:
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


def loss_scale_config(optimizer):
    """The --fp16 loss scaler's settings (:class:`odc_pp.optim.loss_scale.LossScaleConfig`)."""
    from odc_pp.optim.loss_scale import LossScaleConfig

    return LossScaleConfig(loss_scale=optimizer.loss_scale,
                           initial_scale=optimizer.initial_loss_scale,
                           min_scale=optimizer.min_loss_scale,
                           growth_interval=optimizer.loss_scale_window,
                           hysteresis=optimizer.hysteresis)


def loss_scale_problems(optimizer) -> list[str]:
    """Bad --loss-scale / --initial-loss-scale / ... values (one line)."""
    try:
        loss_scale_config(optimizer)
    except ValueError as exc:
        return [str(exc)]
    return []


def wandb_problems(logging) -> list[str]:
    """--wandb-* flags without --wandb-project, or wandb not installed."""
    if not logging.wandb_project:
        return [f"--{_flag(name)} needs --wandb-project" for name in
                ("wandb_exp_name", "wandb_save_dir") if getattr(logging, name)]
    if importlib.util.find_spec("wandb") is None:
        return [f"--wandb-project {logging.wandb_project!r} needs the wandb package, which is "
                f"not installed: pip install 'odc-pp[wandb]' (or pip install wandb)"]
    return []


