"""The trainer's one handle on checkpoints: lock --save, check it, resume from --load
(odc-pp's own checkpoints, resharded when the layout changed, or Megatron's), save
atomically when due, release the lock.

The pieces it drives: :mod:`.checkpointing` (atomic, checksummed files and their
retention), :mod:`.resume` and :mod:`.resume_iteration` (what a load may restore and from
which iteration), :mod:`.resharding` (state by parameter name, across layouts),
:mod:`.megatron_checkpoint` (Megatron's dist-checkpoint), :mod:`.save_lock` (one job per
--save) and :mod:`.elastic` (a torchrun restart resumes from the newest --save).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch.distributed as dist

from ..data_position import DataPosition
from ..distributed import Topology, all_ranks_true
from .checkpointing import CheckpointSaver, capture_rng_state, restore_rng_state
from .elastic import adopt_elastic_restart
from .resharding import sharded_state
from .resume import check_save_dir, checkpoint_meta, refuse_newer_checkpoints, resume
from .save_lock import lock_save_dir

__all__ = ["Checkpointer"]


class Checkpointer:
    """Checkpoints of one rank's ``parts`` (training Components). Collective: every
    rank makes it, loads and saves at the same iterations."""

    def __init__(self, job, topo: Topology, parts, *, vocab_size: int,
                 say: Callable[[str], None], out, position: DataPosition) -> None:
        args = job.args
        self.job, self.args, self.topo, self.parts = job, args, topo, parts
        self.position = position
        """The run's data position: recorded in every checkpoint, moved by :meth:`load`."""
        self.vocab_size, self.say, self.out = vocab_size, say, out
        self.lock = lock_save_dir(args.checkpoint.save, topo, out=out)  # one job per --save
        self.saver: CheckpointSaver | None = None

    def load(self) -> int:
        """Check --save before the first step (fail now, not at the first save); resume
        from --load (or a torchrun restart's newest --save), the data position with it. The
        first iteration to run."""
        args, topo, checkpoint = self.args, self.topo, self.args.checkpoint
        if checkpoint.save:
            check_save_dir(self.parts, checkpoint, topo, out=self.out)
        loading = adopt_elastic_restart(args, topo, out=self.out)
        start, how, recorded = 0, "", None
        if loading.load:
            start, how, recorded = resume(self.parts, _loading_with(args, loading), topo,
                                          restore_rng_state, vocab_size=self.vocab_size,
                                          out=self.out)
            if how:
                self.say(f"resumed from {loading.load} at iteration {start} ({how})")
        override = checkpoint.override_consumed_samples
        if (how and not loading.finetune) or override is not None:
            self.say(self.position.resume(start, recorded, override=override))
        if checkpoint.save:
            refuse_newer_checkpoints(checkpoint, topo, start)
            self.saver = CheckpointSaver(checkpoint.save, keep=checkpoint.keep_checkpoints,
                                         rank=topo.rank, world_size=topo.world_size,
                                         barrier=dist.barrier, token=self.lock.token,
                                         agree=all_ranks_true,
                                         lock=self.lock if topo.rank == 0 else None)
        return start

    def due(self, done: int, *, stopping: bool) -> bool:
        """A checkpoint of iteration ``done`` is due: --save-interval, the exit interval,
        the end, or a stop (``stopping``: a signal or --exit-duration-in-mins)."""
        interval, run = self.args.checkpoint.save_interval, self.args.run
        return self.saver is not None and (
            (bool(interval) and done % interval == 0)
            or done == run.train_iters or done == run.exit_interval or stopping)

    def save_if_due(self, done: int, *, stopping: bool) -> None:
        """An atomic checkpoint of iteration ``done`` when :meth:`due`, the data position
        (the samples consumed) in its meta.json."""
        if not self.due(done, stopping=stopping):
            return
        parts = self.parts
        difference = parts.engine.tied_difference(parts.optimizer.master)
        if difference:  # tied across stages: the copies must be one weight
            raise RuntimeError(f"iteration {done}: the tied embedding and its output-layer "
                               f"copy differ (max abs {difference:.3g}); not saving a broken "
                               f"tie (--untie-embeddings-and-output-weights trains two weights)")
        state = dict(sharded_state(parts.engine, parts.optimizer), rng=capture_rng_state(),
                     iteration=done)
        if parts.loss_scaler is not None:
            state["loss_scaler"] = parts.loss_scaler.state_dict()
        meta = dict(checkpoint_meta(self.args, self.topo, vocab_size=self.vocab_size),
                    **self.position.record(done))
        path = self.saver.save(done, state, meta=meta)
        self.say(f"saved checkpoint {path}")

    def close(self) -> None:
        """Release the --save lock."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def _loading_with(args, loading):
    """``args`` as the load sees them: their checkpoint section replaced by ``loading``
    (an elastic restart's; a shallow copy, the job's args stay as resolved)."""
    if loading is args.checkpoint:
        return args
    view = copy.copy(args)
    view.checkpoint = loading
    return view
