"""Stopping cleanly before the cluster stops the job: signals and a wall-clock budget.

SLURM, Kubernetes and torchrun send SIGTERM before they kill a job (torchrun forwards it to
its workers and kills them 30 s later). :class:`ExitController` turns that into a clean
stop: the signal handler only sets a flag; at every iteration boundary every rank joins one
all-reduce (MAX over the world) of ``[signal received, minutes since start]``, so all
ranks see the same values and take the same decision at the same iteration. On a stop the
loop saves a checkpoint of the iteration it just finished (with ``--save``) and leaves.

Flags (Megatron-LM's meaning):

* SIGTERM is always handled this way. ``--exit-signal-handler`` (Megatron: save and exit
  on the signal) is accepted; with it, ``--exit-signal`` picks another signal to handle as
  well (SIGINT, SIGUSR1, SIGUSR2; SLURM's ``--signal=USR1@120`` for example).
* ``--exit-duration-in-mins M``: stop (and save) after the first iteration at which some
  rank has run for more than M minutes since its process started (Megatron's MAX
  all-reduce of the elapsed time).

Exit codes (of every worker): :data:`EXIT_PREEMPTED` (4) after a signal stop -- the run is
not finished, resume it with ``--load``; 0 after ``--exit-duration-in-mins`` (as Megatron
and ``--exit-interval``) or when the signal came during the last iteration.

Repeated signals (SLURM signals every process of the job step, torchrun among them, and
torchrun forwards its own SIGTERM to the workers a few ms later): the first asks for the
save; every later one is logged and absorbed while the save is pending or running. The
stop decision starts the save's grace period, :data:`REPEAT_GRACE_S` (torchrun's 30 s
between its forwarded SIGTERM and its SIGKILL); only a signal that comes after that grace
period kills the process (the default action). A hung job is ended by the scheduler's
SIGKILL, as always.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

__all__ = ["EXIT_PREEMPTED", "EXIT_SIGNALS", "ExitDecision", "ExitController",
           "TrainingInterrupted", "PROCESS_START", "REPEAT_GRACE_S"]

EXIT_PREEMPTED = 4
"""Exit status of every worker after a signal stop (a checkpoint was saved with --save)."""

EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
"""Signals ``--exit-signal`` may name (Megatron-LM's choices)."""

REPEAT_GRACE_S = 30.0
"""Seconds after the stop decision (the start of the save) during which repeated signals
are absorbed; a signal after that kills (torchrun's grace between SIGTERM and SIGKILL)."""

PROCESS_START = time.time()
"""When this module was first imported: the start of ``pretrain_gpt.py`` for
``--exit-duration-in-mins`` (Megatron measures from the start of ``pretrain``)."""


class TrainingInterrupted(Exception):
    """Raised by the training loop after a signal stop; ``exit_code`` is the status every
    worker exits with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class ExitDecision:
    """What every rank decided at one iteration boundary (the same on every rank)."""

    stop: bool
    """Save (with --save) and leave the loop after this iteration."""
    reason: str = ""
    """For the log: which signal or budget stopped the run."""
    exit_code: int = 0
    """The workers' exit status after the stop."""


def _world_max(values: list[float]) -> list[float]:
    """Elementwise MAX over every rank of the default group (a CPU tensor: gloo)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


class ExitController:
    """Signal handlers plus the per-iteration agreement on stopping (see the module doc).

    ``reduce`` combines this rank's ``[signal number or 0, minutes elapsed]`` with every
    other rank's by elementwise MAX (default: an all-reduce over the world; tests inject
    their own)."""

    def __init__(self, *, signals: Sequence[str] = ("SIGTERM",),
                 duration_minutes: float | None = None, train_iters: int,
                 start_time: float = PROCESS_START,
                 reduce: Callable[[list[float]], list[float]] | None = None,
                 clock: Callable[[], float] = time.time,
                 grace_s: float = REPEAT_GRACE_S) -> None:
        unknown = [name for name in signals if name not in EXIT_SIGNALS]
        if unknown:
            raise ValueError(f"--exit-signal {unknown[0]} is not one of {EXIT_SIGNALS}")
        if duration_minutes is not None and not (math.isfinite(duration_minutes)
                                                 and duration_minutes > 0):
            raise ValueError(f"--exit-duration-in-mins must be a finite number > 0, got "
                             f"{duration_minutes}")
        self.signals = tuple(dict.fromkeys(signals))
        self.duration_minutes = duration_minutes
        self.train_iters = train_iters
        self.start_time = start_time
        self.reduce = reduce or _world_max
        self.clock = clock
        self.received = 0
        """The first handled signal's number (0: none yet)."""
        self.decision = ExitDecision(stop=False)
        """The latest decision of :meth:`should_exit`."""
        self.grace_s = grace_s
        """Repeats are absorbed until this long after the stop decision (the save)."""
        self.repeats = 0
        """Handled signals after the first (logged and absorbed)."""
        self.stopping_since: float | None = None
        """``clock()`` at the stop decision: the save's grace period starts there."""
        self._previous: dict[int, object] = {}

    @classmethod
    def for_args(cls, args) -> "ExitController":
        """The controller for ``pretrain_gpt.py``'s flags, handlers installed."""
        signals = ["SIGTERM"]
        if args.run.exit_signal_handler:
            signals.append(args.run.exit_signal)
        return cls(signals=signals, duration_minutes=args.run.exit_duration_in_mins,
                   train_iters=args.run.train_iters).install()

    # ----- handlers -------------------------------------------------------------------------
    def install(self) -> "ExitController":
        """Install the handlers (only the main thread may; elsewhere this is a no-op, so
        library users running training in a thread keep their own handling)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        for name in self.signals:
            number = getattr(signal, name)
            self._previous[number] = signal.signal(number, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were there before :meth:`install`."""
        for number, previous in self._previous.items():
            if signal.getsignal(number) == self._on_signal:
                signal.signal(number, previous)
        self._previous.clear()

    def _on_signal(self, number: int, frame) -> None:
        if not self.received:
            self.received = number  # ask for the save at the next iteration boundary
            return
        self.repeats += 1
        name = signal.Signals(number).name
        since = self.stopping_since
        if since is not None and self.clock() - since > self.grace_s:
            _say(f"{name} received {self.clock() - since:.1f} s after the save started "
                 f"(grace {self.grace_s:g} s): exiting now")
            signal.signal(number, signal.SIG_DFL)  # the default action, at once
            os.kill(os.getpid(), number)
            return
        state = "the save is pending at the end of this iteration" if since is None else \
            "the save is running"
        _say(f"{name} received again (repeat {self.repeats}): absorbed, {state}; a signal "
             f"more than {self.grace_s:g} s after the save started exits at once")

    # ----- the agreement --------------------------------------------------------------------
    def should_exit(self, iteration: int) -> ExitDecision:
        """Collective (every rank, every iteration): whether to stop after ``iteration``,
        decided from values reduced over all ranks, so every rank decides the same."""
        minutes = (self.clock() - self.start_time) / 60.0
        signal_number, minutes = self.reduce([float(self.received), minutes])
        decision = ExitDecision(stop=False)
        last = iteration >= self.train_iters
        if signal_number:
            name = signal.Signals(int(signal_number)).name
            decision = ExitDecision(
                stop=True, exit_code=0 if last else EXIT_PREEMPTED,
                reason=f"{name} received: every rank stopped after iteration {iteration}")
        elif self.duration_minutes is not None and minutes > self.duration_minutes:
            decision = ExitDecision(
                stop=True, exit_code=0,
                reason=f"--exit-duration-in-mins {self.duration_minutes:g} reached "
                       f"({minutes:.2f} minutes on the slowest rank): every rank stopped "
                       f"after iteration {iteration}")
        if decision.stop and self.stopping_since is None:
            self.stopping_since = self.clock()  # the save's grace period starts
        self.decision = decision
        return decision

    def finish(self) -> None:
        """After the loop: restore the handlers; raise :class:`TrainingInterrupted` when a
        signal stopped the run before its last iteration. After a signal the handlers stay
        (until :meth:`uninstall`): the process is on its way out with its status, and a late
        repeat (torchrun's forwarded SIGTERM) must not turn that into a death by signal."""
        if not self.received:
            self.uninstall()
        if self.decision.stop and self.decision.exit_code:
            raise TrainingInterrupted(
                f"interrupted: {self.decision.reason}; resume with --load",
                self.decision.exit_code)


def _say(message: str) -> None:
    """One line on stderr from a signal handler: ``os.write`` (a buffered ``print`` could
    re-enter a write the handler interrupted)."""
    rank = os.environ.get("RANK")
    prefix = f"rank {rank}: " if rank is not None else ""
    try:
        os.write(2, f"{prefix}{message}\n".encode())
    except OSError:
        pass
