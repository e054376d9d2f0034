"""Where the training data stands: the samples consumed before each iteration -- part of
every checkpoint, as Megatron's ``consumed_train_samples``.

Iteration ``i`` trains on the samples ``consumed_before(i)`` .. ``consumed_before(i) +
batch_size_of(i) - 1`` of the training source. A fresh run starts at sample 0; a resumed run
continues at the iteration and from the consumed samples its checkpoint records, whatever
this run's --global-batch-size, --rampup-batch-size or data-parallel size: each later batch
is the one the batch flags give after that many samples (the ramp's batch at the consumed
count, megatron-core's ``update(consumed_samples)``), so no sample is skipped or repeated.
A checkpoint that records no count (written before odc-pp recorded it, or a Megatron-LM
checkpoint) is taken to have consumed what this run's batches consume in its iterations,
and the log says so. ``--override-consumed-samples N`` continues from sample N on purpose:
the only way to skip or repeat samples. The learning rate follows the consumed samples in
global batches of --global-batch-size (Megatron's scheduler counts samples), which for a
run whose batch never changes is its iteration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .rampup import FLAG as RAMPUP_FLAG, BatchRampup, rampup_of

__all__ = ["OVERRIDE_FLAG", "DATA_KEYS", "DataPosition"]

OVERRIDE_FLAG = "--override-consumed-samples"
"""The flag that continues from a chosen sample whatever the checkpoint records."""
DATA_KEYS = ("consumed_samples", "global_batch_size", "rampup_batch_size")
"""What a checkpoint's meta.json records of the data position (:meth:`DataPosition.record`)."""


@dataclass(kw_only=True)
class DataPosition:
    """The consumed samples of one run, from its first iteration on."""

    global_batch_size: int
    """--global-batch-size (the batch after any ramp)."""
    rampup: BatchRampup | None = None
    """--rampup-batch-size: the batch is the ramp's at the consumed samples."""
    first_iteration: int = 0
    """The run's first iteration (where --load resumed)."""
    first_consumed: int = 0
    """Samples consumed before :attr:`first_iteration`."""
    _consumed: list[int] = field(default_factory=list, repr=False)
    """Samples consumed before ``first_iteration + k`` (grown on demand)."""

    @classmethod
    def of(cls, data) -> "DataPosition":
        """A fresh run's position for the data flags (``args.data``)."""
        return cls(global_batch_size=data.global_batch_size, rampup=rampup_of(data))

    def batch_size_at(self, consumed: int) -> int:
        """The global batch after ``consumed`` samples."""
        return self.global_batch_size if self.rampup is None else \
            self.rampup.batch_size_at(consumed)

    def consumed_before(self, iteration: int) -> int:
        """Samples consumed by the iterations before ``iteration`` (0-based)."""
        if iteration < self.first_iteration:
            raise ValueError(f"iteration {iteration} is before this run's first, "
                             f"{self.first_iteration}")
        if not self._consumed:
            self._consumed.append(self.first_consumed)
        while len(self._consumed) <= iteration - self.first_iteration:
            done = self._consumed[-1]
            self._consumed.append(done + self.batch_size_at(done))
        return self._consumed[iteration - self.first_iteration]

    def batch_size_of(self, iteration: int) -> int:
        """The global batch of iteration ``iteration`` (0-based)."""
        return self.batch_size_at(self.consumed_before(iteration))

    def sample_ids(self, iteration: int) -> list[int]:
        """The training samples of iteration ``iteration``."""
        start = self.consumed_before(iteration)
        return list(range(start, start + self.batch_size_of(iteration)))

    def schedule_iteration(self, iteration: int) -> float:
        """Where the learning-rate schedule stands at ``iteration``: the consumed samples
        in global batches."""
        return self.consumed_before(iteration) / self.global_batch_size

    @property
    def ramp_values(self) -> list[int] | None:
        """--rampup-batch-size's START INCREMENT SAMPLES (None without a ramp)."""
        ramp = self.rampup
        return None if ramp is None else [ramp.start, ramp.increment, ramp.samples]

    def record(self, done: int) -> dict:
        """What a checkpoint of iteration ``done`` records (:data:`DATA_KEYS`)."""
        return {"consumed_samples": self.consumed_before(done),
                "global_batch_size": self.global_batch_size,
                "rampup_batch_size": self.ramp_values}

    def resume(self, iteration: int, recorded: dict | None, *,
               override: int | None = None) -> str:
        """Continue at ``iteration`` from the consumed samples of ``recorded`` (a
        checkpoint's :meth:`record`; None or without the count: what this run's batches
        consume in ``iteration`` iterations), or from ``override``
        (--override-consumed-samples). Returns the log line: where the data continues
        and, when the batch flags differ from the checkpoint's, how the batch changes."""
        recorded = recorded or {}
        saved = recorded.get("consumed_samples")
        if override is not None:
            consumed = override
            why = _override_why(override, saved)
        elif saved is not None:
            consumed, why = int(saved), "the samples the checkpoint records as consumed"
        else:
            consumed = DataPosition(global_batch_size=self.global_batch_size,
                                    rampup=self.rampup).consumed_before(iteration)
            why = (f"the checkpoint records no consumed samples: assumed what this run's "
                   f"batches consume in {iteration} iterations")
        self.first_iteration, self.first_consumed, self._consumed = iteration, consumed, []
        return (f"data: iteration {iteration} continues from sample {consumed} ({why}); "
                f"{self._batch_change(recorded, consumed)}")

    def _batch_change(self, recorded: dict, consumed: int) -> str:
        """The global batch from here on and, when the checkpoint's batch flags differ,
        what the checkpoint's run would have taken."""
        now = self.batch_size_at(consumed)
        if recorded.get("global_batch_size") is None:
            return f"global batch {now}"
        ramp = recorded.get("rampup_batch_size")
        before = DataPosition(global_batch_size=int(recorded["global_batch_size"]),
                              rampup=None if not ramp else BatchRampup(
                                  start=ramp[0], increment=ramp[1], samples=ramp[2],
                                  global_batch_size=int(recorded["global_batch_size"])))
        flags = []
        if before.global_batch_size != self.global_batch_size:
            flags.append(f"--global-batch-size {before.global_batch_size} -> "
                         f"{self.global_batch_size}")
        if self.ramp_values != before.ramp_values:
            flags.append(f"{RAMPUP_FLAG} {_ramp(before)} -> {_ramp(self)}")
        if not flags:
            return f"global batch {now}"
        return (f"global batch {before.batch_size_at(consumed)} -> {now} from here on "
                f"({', '.join(flags)}); no sample is skipped or repeated")


def _ramp(position: DataPosition) -> str:
    values = position.ramp_values
    return "none" if values is None else " ".join(map(str, values))


def _override_why(override: int, saved) -> str:
    """The log's reason for ``--override-consumed-samples``: what is skipped or repeated."""
    if saved is None:
        return f"{OVERRIDE_FLAG}; the checkpoint records no consumed samples"
    saved = int(saved)
    if override > saved:
        effect = f"samples {saved}-{override - 1} are skipped"
    elif override < saved:
        effect = f"samples {override}-{saved - 1} are seen again"
    else:
        effect = "nothing is skipped or repeated"
    return f"{OVERRIDE_FLAG}; the checkpoint records {saved}: {effect}"
