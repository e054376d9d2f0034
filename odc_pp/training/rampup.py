"""Megatron's global-batch ramp-up (``--rampup-batch-size START INCREMENT SAMPLES``).

The global batch starts at START samples and grows by INCREMENT each time another
``SAMPLES / ((--global-batch-size - START) / INCREMENT)`` samples have been consumed, until
--global-batch-size (after SAMPLES samples it is --global-batch-size); the arithmetic of
megatron-core's ``RampupBatchsizeNumMicroBatchesCalculator``, including its check that
every batch size is a multiple of --micro-batch-size x data-parallel size. The batch of an
iteration depends only on the samples consumed before it, so every rank derives the whole
ramp from the consumed samples (a resumed run continues it from those its checkpoint
records, :class:`~odc_pp.training.data_position.DataPosition`); the samples of iteration
``i`` are the next ones after those consumed.

--train-samples converts to iterations as Megatron's ``update_train_iters``: the ramp's
iterations, then whole global batches of what is left. The learning rate follows the
samples consumed (Megatron's schedule is sample-based): iteration ``i`` takes the rate of
the fractional iteration ``consumed samples / --global-batch-size``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["BatchRampup", "rampup_problems", "rampup_of"]

FLAG = "--rampup-batch-size"


@dataclass(kw_only=True)
class BatchRampup:
    """The ramp of one run."""

    start: int
    """Global batch of the first iteration."""
    increment: int
    """Growth of the global batch per step of the ramp."""
    samples: int
    """Samples over which the batch grows to ``global_batch_size``."""
    global_batch_size: int
    """The batch after the ramp (--global-batch-size)."""
    _consumed: list[int] = field(default_factory=lambda: [0], repr=False)
    """Samples consumed before iteration ``i`` (grown on demand)."""

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise ValueError(problem)

    def problem(self) -> str | None:
        """Why these values make no ramp (Megatron's assertions), or None."""
        if self.start <= 0 or self.increment <= 0 or self.samples <= 0:
            # SAMPLES 0 divides by zero in megatron-core
            return (f"{FLAG} {self.start} {self.increment} {self.samples}: START, "
                    f"INCREMENT and SAMPLES must be > 0")
        difference = self.global_batch_size - self.start
        if difference <= 0 or difference % self.increment:
            return (f"{FLAG}: --global-batch-size {self.global_batch_size} minus START "
                    f"{self.start} must be a positive multiple of INCREMENT {self.increment}")
        return None

    @property
    def samples_per_increment(self) -> float:
        return self.samples / ((self.global_batch_size - self.start) // self.increment)

    def batch_size_at(self, consumed: int) -> int:
        """The global batch after ``consumed`` samples (megatron-core's ``update``)."""
        if consumed > self.samples:
            return self.global_batch_size
        steps = int(consumed / self.samples_per_increment)
        return self.start + steps * self.increment

    def consumed_before(self, iteration: int) -> int:
        """Samples consumed by iterations ``0 .. iteration - 1``."""
        while len(self._consumed) <= iteration:
            done = self._consumed[-1]
            self._consumed.append(done + self.batch_size_at(done))
        return self._consumed[iteration]

    def batch_size_of(self, iteration: int) -> int:
        """The global batch of iteration ``iteration`` (0-based)."""
        return self.batch_size_at(self.consumed_before(iteration))

    def batch_sizes(self) -> list[int]:
        """The batch sizes the ramp runs, in order (some steps may be jumped over)."""
        sizes, consumed = [], 0
        while True:
            size = self.batch_size_at(consumed)
            if not sizes or sizes[-1] != size:
                sizes.append(size)
            if consumed > self.samples:
                return sizes
            consumed += size

    def divisibility_problem(self, micro_batch_size: int, dp: int) -> str | None:
        """A batch size the ramp runs that is not divisible by micro batch x dp (Megatron
        asserts it at every iteration), or None."""
        unit = micro_batch_size * dp
        bad = [size for size in self.batch_sizes() if size % unit]
        if not bad:
            return None
        return (f"{FLAG}: global batch size {bad[0]} of the ramp is not divisible by "
                f"--micro-batch-size {micro_batch_size} x data-parallel size {dp}")

    def train_iters(self, train_samples: int) -> int:
        """--train-samples as iterations (Megatron's ``update_train_iters``): the ramp's
        iterations while consumed <= SAMPLES and <= train samples, then whole global
        batches of the rest (a partial last batch is dropped)."""
        iterations = consumed = 0
        while consumed <= self.samples and consumed <= train_samples:
            consumed += self.batch_size_at(consumed)
            iterations += 1
        if train_samples > consumed:
            iterations += (train_samples - consumed) // self.global_batch_size
        return iterations


def rampup_of(data) -> BatchRampup | None:
    """The ramp of the data flags (``args.data``), None without --rampup-batch-size."""
    if not data.rampup_batch_size:
        return None
    start, increment, samples = data.rampup_batch_size
    return BatchRampup(start=start, increment=increment, samples=samples,
                       global_batch_size=data.global_batch_size)


def rampup_problems(args) -> list[str]:
    """Bad --rampup-batch-size values or combinations (one line each)."""
    values = args.data.rampup_batch_size
    if values is None:
        return []
    if len(values) != 3:
        return [f"{FLAG} takes three numbers (START INCREMENT SAMPLES), got {len(values)}"]
    if args.data.global_batch_size is None:
        return [f"{FLAG} needs --global-batch-size (the batch after the ramp)"]
    start, increment, samples = values
    problem = None
    try:
        BatchRampup(start=start, increment=increment, samples=samples,
                    global_batch_size=args.data.global_batch_size)
    except ValueError as exc:
        problem = str(exc)
    return [problem] if problem else []
