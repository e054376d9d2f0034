"""Training logs: a console progress bar, one JSON object per logged iteration, and
TensorBoard event files when tensorboard is installed. Used on rank 0 only."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from typing import TextIO

__all__ = ["TrainingLogger", "format_record"]


def format_record(record: dict) -> str:
    """One console line for a logged iteration."""
    parts = [f"iter {record['iteration']:>5}", f"loss {record['loss']:.4f}",
             f"lr {record['lr']:.2e}", f"grad-norm {record['grad_norm']:.3f}",
             f"{record['tokens_per_s']:.0f} tok/s", f"step {record['step_s'] * 1000:.0f} ms"]
    if record.get("tflops_per_device") is not None:
        parts.append(f"{record['tflops_per_device']:.3g} TFLOP/s/dev")
    if record.get("mfu") is not None:
        parts.append(f"MFU {100 * record['mfu']:.1f}%")
    idle = record.get("idle_s")
    if idle:
        parts.append("idle/rank " + " ".join(f"{v * 1000:.0f}" for v in idle) + " ms")
    if record.get("peak_memory_mb"):
        parts.append(f"peak {record['peak_memory_mb']:.0f} MB")
    return " | ".join(parts)


@dataclass(kw_only=True)
class TrainingLogger:
    train_iters: int
    """Total iterations (progress-bar length)."""
    log_json: str | None = None
    """Append JSON lines here."""
    tensorboard_dir: str | None = None
    """Write TensorBoard scalars here (skipped with a note when tensorboard is missing)."""
    progress_bar: bool = True
    """Redraw a bar between log lines (only when the stream is a terminal)."""
    stream: TextIO = sys.stdout
    """Console stream."""

    def __post_init__(self) -> None:
        if self.train_iters < 1:
            raise ValueError("train_iters must be >= 1")
        self._writer = None
        if self.tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self._writer = SummaryWriter(self.tensorboard_dir)
            except ImportError:
                print("note: tensorboard is not installed; --tensorboard-dir ignored",
                      file=self.stream)
        if self.log_json:
            os.makedirs(os.path.dirname(os.path.abspath(self.log_json)), exist_ok=True)
        self._start = time.perf_counter()
        self._bar_drawn = False

    def _bar(self, iteration: int) -> str:
        width = 30
        filled = int(width * iteration / self.train_iters)
        elapsed = time.perf_counter() - self._start
        return f"[{'#' * filled}{'.' * (width - filled)}] {iteration}/{self.train_iters} " \
               f"{elapsed:.0f}s"

    def progress(self, iteration: int) -> None:
        """Called every iteration: redraws the bar in place on a terminal."""
        if self.progress_bar and self.stream.isatty():
            self.stream.write("\r" + self._bar(iteration))
            self.stream.flush()
            self._bar_drawn = True

    def log(self, record: dict) -> None:
        if self._bar_drawn:
            self.stream.write("\r\033[K")
            self._bar_drawn = False
        print(format_record(record), file=self.stream, flush=True)
        if self.log_json:
            with open(self.log_json, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_s",
                        "tflops_per_device", "mfu", "peak_memory_mb"):
                if record.get(key) is not None:
                    self._writer.add_scalar(f"train/{key}", record[key], record["iteration"])
            for rank, idle in enumerate(record.get("idle_s") or []):
                self._writer.add_scalar(f"idle_s/rank{rank}", idle, record["iteration"])
            self._writer.flush()

    def log_eval(self, record: dict) -> None:
        """An evaluation's record (``iteration``, ``eval_loss``, ``eval_ppl``,
        ``eval_tokens``): one line on the stream, one JSON line, TensorBoard ``valid/``."""
        if self._bar_drawn:
            self.stream.write("\r\033[K")
            self._bar_drawn = False
        print(f"validation at iter {record['iteration']:>5} | loss {record['eval_loss']:.4f} "
              f"| ppl {record['eval_ppl']:.4g} | {record['eval_tokens']:.0f} tokens",
              file=self.stream, flush=True)
        if self.log_json:
            with open(self.log_json, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        if self._writer is not None:
            for key in ("eval_loss", "eval_ppl"):
                self._writer.add_scalar(f"valid/{key.removeprefix('eval_')}", record[key],
                                        record["iteration"])
            self._writer.flush()

    def close(self) -> None:
        if self._bar_drawn:
            self.stream.write("\n")
        if self._writer is not None:
            self._writer.close()
