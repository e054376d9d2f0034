"""Training logs: a console progress bar (iterations done, rate and ETA: redrawn in place
on a terminal, appended to every logged iteration's line elsewhere), one JSON object per
logged iteration, TensorBoard event files with ``--tensorboard-dir`` (Megatron-LM's scalar
names, every ``--tensorboard-log-interval`` iterations), and a Weights & Biases run with
``--wandb-project`` (the same record). Used on rank 0 only."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO

__all__ = ["TrainingLogger", "format_record", "flat_scalars", "wandb_settings",
           "tensorboard_settings", "TENSORBOARD_NAMES", "format_duration"]

TENSORBOARD_NAMES = {"loss": "lm loss", "lr": "learning-rate", "grad_norm": "grad-norm",
                     "loss_scale": "loss-scale", "params_norm": "params-norm",
                     "num_zeros_in_grad": "num-zeros", "global_batch_size": "batch-size"}
"""Record keys written under Megatron-LM's TensorBoard names."""
_TENSORBOARD_OWN = ("tokens_per_s", "tflops_per_device", "mfu", "step_s", "peak_memory_mb",
                    "peak_allocated_mb")
"""odc-pp's record keys also written to TensorBoard (under their own names)."""


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_record(record: dict) -> str:
    """One console line for a logged iteration."""
    parts = [f"iter {record['iteration']:>5}", f"loss {record['loss']:.4f}",
             f"lr {record['lr']:.2e}", f"grad-norm {record['grad_norm']:.3f}",
             f"{record['tokens_per_s']:.0f} tok/s", f"step {record['step_s'] * 1000:.0f} ms"]
    if record.get("num_zeros_in_grad") is not None:  # as Megatron's iteration line
        parts.append(f"num zeros: {record['num_zeros_in_grad']}")
    if record.get("params_norm") is not None:
        parts.append(f"params norm: {record['params_norm']:.3f}")
    if record.get("tflops_per_device") is not None:
        parts.append(f"{record['tflops_per_device']:.3g} TFLOP/s/dev")
    if record.get("mfu") is not None:
        parts.append(f"MFU {100 * record['mfu']:.1f}%")
    idle = record.get("idle_s")
    if idle:
        parts.append("idle/rank " + " ".join(f"{v * 1000:.0f}" for v in idle) + " ms")
    if record.get("peak_memory_mb"):
        parts.append(f"peak {record['peak_memory_mb']:.0f} MB")
    if record.get("consumed_samples") is not None:  # as Megatron's iteration line
        parts.append(f"consumed samples: {record['consumed_samples']} | global batch size: "
                     f"{record['global_batch_size']}")
    if record.get("loss_scale") is not None:  # --fp16, as Megatron's iteration line
        parts.append(f"loss scale: {record['loss_scale']:.1f}")
    if record.get("loss_scale") is not None or record.get("skipped_iterations"):
        parts.append(f"number of skipped iterations: {record.get('skipped_iterations', 0):3d}")
    return " | ".join(parts)


def flat_scalars(record: dict) -> dict[str, float]:
    """A log record's numbers under their keys (booleans as 0/1, per-rank lists as
    ``key/rank<i>``, None left out): what wandb is given."""
    scalars = {}
    for key, value in record.items():
        if isinstance(value, (list, tuple)):
            scalars.update({f"{key}/rank{rank}": float(item) for rank, item in enumerate(value)
                            if isinstance(item, (int, float))})
        elif isinstance(value, (bool, int, float)):
            scalars[key] = float(value)
    return scalars


def wandb_settings(args) -> dict:
    """The :class:`TrainingLogger` keywords for wandb from :class:`TrainingArgs` (as
    Megatron: the run's files under ``--wandb-save-dir``, else ``--save``/wandb)."""
    logging, save = args.logging, args.checkpoint.save
    if not logging.wandb_project:
        return {}
    save_dir = logging.wandb_save_dir or (os.path.join(save, "wandb") if save else None)
    return {"wandb_project": logging.wandb_project, "wandb_exp_name": logging.wandb_exp_name,
            "wandb_save_dir": save_dir, "wandb_config": dataclasses.asdict(args)}


def tensorboard_settings(args) -> dict:
    """The :class:`TrainingLogger` keywords for TensorBoard from :class:`TrainingArgs`."""
    logging = args.logging
    return {"tensorboard_log_interval": logging.tensorboard_log_interval,
            "log_timers_to_tensorboard": logging.log_timers_to_tensorboard,
            "log_validation_ppl_to_tensorboard": logging.log_validation_ppl_to_tensorboard,
            "global_batch_size": args.data.global_batch_size}


def _start_wandb(project: str, name: str | None, save_dir: str | None, config: dict | None):
    try:
        import wandb
    except ImportError as error:
        raise RuntimeError(f"--wandb-project {project!r} needs the wandb package: pip install "
                           f"'odc-pp[wandb]' (or pip install wandb)") from error
    if save_dir:
        os.makedirs(save_dir, exist_ok=True)
    return wandb.init(project=project, name=name or None, dir=save_dir, config=config)


@dataclass(kw_only=True)
class TrainingLogger:
    train_iters: int
    """Total iterations (progress-bar length)."""
    log_json: str | None = None
    """Append JSON lines here."""
    tensorboard_dir: str | None = None
    """Write TensorBoard scalars here (``torch.utils.tensorboard``)."""
    tensorboard_log_interval: int = 1
    """Write the TensorBoard scalars of every N-th iteration."""
    log_timers_to_tensorboard: bool = False
    """Also write iteration-time (seconds) and throughput (model TFLOP/s per device)."""
    log_validation_ppl_to_tensorboard: bool = False
    """Also write the validation perplexity (``lm loss validation ppl``)."""
    global_batch_size: int | None = None
    """batch-size of a record without its own ``global_batch_size`` (no ramp-up)."""
    progress_bar: bool = True
    """Progress (iterations done of ``train_iters``, iterations per second, ETA): a bar
    redrawn between log lines on a terminal, else appended to each logged line."""
    stream: TextIO = sys.stdout
    """Console stream."""
    wandb_project: str | None = None
    """Log every record to this Weights & Biases project as well (needs wandb)."""
    wandb_exp_name: str | None = None
    """wandb run name."""
    wandb_save_dir: str | None = None
    """wandb's local run files go here (default: wandb's ./wandb)."""
    wandb_config: dict | None = None
    """The run's configuration, recorded with the wandb run."""
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)
    """Seconds (monotonic) for the rate and ETA."""

    def __post_init__(self) -> None:
        if self.train_iters < 1:
            raise ValueError("train_iters must be >= 1")
        self._writer = None
        if self.tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as error:
                raise RuntimeError(f"--tensorboard-dir {self.tensorboard_dir!r} needs the "
                                   f"tensorboard package: pip install tensorboard") from error
            self._writer = SummaryWriter(self.tensorboard_dir)
        self._wandb = _start_wandb(self.wandb_project, self.wandb_exp_name, self.wandb_save_dir,
                                   self.wandb_config) if self.wandb_project else None
        if self.log_json:
            os.makedirs(os.path.dirname(os.path.abspath(self.log_json)), exist_ok=True)
        self._start = self.clock()
        self._first: int | None = None  # iterations done before this run (resumed runs)
        self._bar_drawn = False

    def _status(self, iteration: int) -> str:
        """``30/100 (30%) | 2.50 it/s | ETA 28s``: the rate over this run's iterations so
        far (a resumed run counts from its checkpoint)."""
        if self._first is None:
            self._first = iteration - 1
        elapsed = self.clock() - self._start
        done = iteration - self._first
        text = f"{iteration}/{self.train_iters} ({100 * iteration // self.train_iters}%)"
        if elapsed <= 0 or done <= 0:
            return text
        rate = done / elapsed
        left = max(0, self.train_iters - iteration) / rate
        return (f"{text} | {rate:.3g} it/s | elapsed {format_duration(elapsed)} | "
                f"ETA {format_duration(left)}")

    def _bar(self, iteration: int) -> str:
        width = 30
        filled = int(width * min(iteration, self.train_iters) / self.train_iters)
        return f"[{'#' * filled}{'.' * (width - filled)}] {self._status(iteration)}"

    def _on_terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def progress(self, iteration: int) -> None:
        """Called every iteration: redraws the bar in place on a terminal (elsewhere the
        progress goes on the logged lines: :meth:`log`)."""
        if self._first is None:
            self._first = iteration - 1
        if self.progress_bar and self._on_terminal():
            self.stream.write("\r\033[K" + self._bar(iteration))
            self.stream.flush()
            self._bar_drawn = True

    def log(self, record: dict) -> None:
        """A logged iteration's record: the console line, --log-json, wandb, and
        TensorBoard when its interval is due."""
        if self._bar_drawn:
            self.stream.write("\r\033[K")
            self._bar_drawn = False
        line = format_record(record)
        if self.progress_bar and not self._on_terminal():
            line += " | " + self._status(record["iteration"])
        print(line, file=self.stream, flush=True)
        if self.log_json:
            with open(self.log_json, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        self.write_tensorboard(record)
        if self._wandb is not None:
            self._wandb.log(flat_scalars(record), step=record["iteration"])

    def write_tensorboard(self, record: dict) -> None:
        """The record's scalars to TensorBoard, at iterations that are multiples of
        ``tensorboard_log_interval`` (Megatron's names: :data:`TENSORBOARD_NAMES`)."""
        step = record["iteration"]
        if self._writer is None or step % self.tensorboard_log_interval:
            return
        values = {name: record.get(key) for key, name in TENSORBOARD_NAMES.items()}
        if values["batch-size"] is None:
            values["batch-size"] = self.global_batch_size
        values.update({key: record.get(key) for key in _TENSORBOARD_OWN})
        if self.log_timers_to_tensorboard:
            values["iteration-time"] = record.get("step_s")
            values["throughput"] = record.get("tflops_per_device")
        for name, value in values.items():
            if value is not None:
                self._writer.add_scalar(name, value, step)
        for rank, idle in enumerate(record.get("idle_s") or []):
            self._writer.add_scalar(f"idle_s/rank{rank}", idle, step)
        self._writer.flush()

    def log_eval(self, record: dict) -> None:
        """An evaluation's record (``iteration``, ``eval_loss``, ``eval_ppl``,
        ``eval_tokens``): one line on the stream, one JSON line, TensorBoard and wandb
        ``valid/``."""
        if self._bar_drawn:
            self.stream.write("\r\033[K")
            self._bar_drawn = False
        print(f"validation at iter {record['iteration']:>5} | loss {record['eval_loss']:.4f} "
              f"| ppl {record['eval_ppl']:.4g} | {record['eval_tokens']:.0f} tokens",
              file=self.stream, flush=True)
        if self.log_json:
            with open(self.log_json, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        if self._writer is not None:  # Megatron's names
            self._writer.add_scalar("lm loss validation", record["eval_loss"],
                                    record["iteration"])
            if self.log_validation_ppl_to_tensorboard:
                self._writer.add_scalar("lm loss validation ppl", record["eval_ppl"],
                                        record["iteration"])
            self._writer.flush()
        if self._wandb is not None:  # same step as that iteration's training record
            self._wandb.log({f"valid/{key.removeprefix('eval_')}": record[key]
                             for key in ("eval_loss", "eval_ppl")}, step=record["iteration"])

    def close(self) -> None:
        if self._bar_drawn:
            self.stream.write("\n")
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()
