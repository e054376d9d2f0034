"""The logging section of ``pretrain_gpt.py``'s arguments (:class:`LoggingArgs`, one of
the sections of :class:`~odc_pp.training.arg_sections.TrainingArgs`): what is logged and
where, Megatron-LM's logging and TensorBoard flags among them, and their problems."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

__all__ = ["LoggingArgs", "tensorboard_problems"]


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
    log_params_norm: bool = False
    """Megatron's flag: log the L2 norm of all parameters after each logged iteration's
    step (fp32 master weights; every element once, whatever the layout)."""
    log_num_zeros_in_grad: bool = False
    """Megatron's flag: log how many gradient elements of the step are exactly zero
    (the whole model's, every element once, whatever the layout)."""
    tensorboard_dir: str | None = None
    """Write TensorBoard event files here (rank 0), with Megatron's scalar names: lm loss,
    learning-rate, grad-norm, batch-size, loss-scale (--fp16), params-norm, num-zeros and
    the validation loss (lm loss validation); odc-pp's throughput and memory under their
    log-record names."""
    tensorboard_log_interval: int = 1
    """Megatron's flag: write the TensorBoard scalars every N iterations (independent of
    --log-interval)."""
    log_timers_to_tensorboard: bool = False
    """Megatron's flag: also write the iteration time (iteration-time, seconds) and the
    model TFLOP/s per device (throughput) to TensorBoard."""
    log_validation_ppl_to_tensorboard: bool = False
    """Megatron's flag: also write the validation perplexity (lm loss validation ppl) to
    TensorBoard."""
    wandb_project: str | None = None
    """Weights & Biases project: log the same record as --log-json / TensorBoard to wandb
    (rank 0; needs the ``wandb`` extra; WANDB_MODE=offline writes a local run directory)."""
    wandb_exp_name: str | None = None
    """Weights & Biases run name (with --wandb-project)."""
    wandb_save_dir: str | None = None
    """Directory for wandb's local files (with --wandb-project; default: --save/wandb when
    --save is given, else wandb's default ./wandb)."""
    no_progress_bar: bool = False
    """Plain log lines: no progress (on a terminal a bar, elsewhere each logged line ends
    with iterations done, iterations per second and the ETA)."""
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


def tensorboard_problems(logging: LoggingArgs) -> list[str]:
    """--tensorboard-dir without the tensorboard package, a bad --tensorboard-log-interval."""
    problems = []
    if logging.tensorboard_log_interval < 1:
        problems.append(f"--tensorboard-log-interval must be >= 1, got "
                        f"{logging.tensorboard_log_interval}")
    if logging.tensorboard_dir and importlib.util.find_spec("tensorboard") is None:
        problems.append(f"--tensorboard-dir {logging.tensorboard_dir!r} needs the tensorboard "
                        f"package: pip install tensorboard (or drop the flag)")
    return problems
