"""AdamW on the owned shards of a :class:`~odc_pp.odc.engine.ShardedDataParallel`.

Each rank keeps fp32 master weights, ``exp_avg`` and ``exp_avg_sq`` for the elements it
owns and nothing else. The update is torch's own fused multi-tensor AdamW kernel
(``torch.optim.adamw.adamw(fused=True)``, what ``torch.optim.AdamW(fused=True)`` runs) over
the flat owned shards, cut only where weight decay or the learning rate changes (decayed
and exempt pieces are two calls; with ``AdamWConfig.decoupled`` the decoupled pieces, e.g.
Megatron's --decoupled-lr embedding and output layer, two more at the step's
:func:`~odc_pp.optim.rates.decoupled_rate`), so on identical gradients it gives
``AdamW(fused=True)``'s numbers; where the fused kernel does not take the dtype or device,
the ``foreach`` kernel. Gradient-norm clipping is :mod:`odc_pp.optim.clip` (the same
scaling as ``torch.nn.utils.clip_grad_norm_``): the squared norms of the owned gradients
are all-reduced over the ``norm_group`` (one group or several in turn).

:class:`ShardedAdamW` is itself a
:class:`~odc_pp.optim.post_validation.PostValidationTarget` (eager step, later
validation, maybe rollback): :meth:`local_grad_norm_sq` is this rank's share of the global
norm, :meth:`snapshot` copies the owned state and gradients before :meth:`step_eagerly`,
:meth:`finish_step` publishes the update (and zeroes the accumulators for the next
minibatch), :meth:`restore` rolls it back and :meth:`redo_clipped` steps again on the
snapshot's scaled gradients.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch.optim.adamw import adamw

from ..optim import clip
from ..optim.rates import decoupled_rate
from ..optim.step import StepOutcome
from .engine import ShardedDataParallel
from .shard_map import param_pieces

__all__ = ["AdamWConfig", "ShardedAdamW"]


@dataclass(kw_only=True)
class AdamWConfig:
    """Hyper-parameters of :class:`ShardedAdamW` (same meaning as ``torch.optim.AdamW``)."""

    lr: float = 1e-3
    """Learning rate of a step given none (the training loop passes each step's
    scheduled rate to :meth:`ShardedAdamW.clip_and_step` / the post-validator)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Decay rates of the first and second moment estimates."""
    eps: float = 1e-8
    """Added to the denominator for numerical stability."""
    weight_decay: float = 1e-2
    """Decoupled weight decay."""
    no_decay: Callable[[str, tuple[int, ...]], bool] | None = None
    """Given a parameter's name (as in its unit) and shape, True exempts it from weight
    decay (e.g. biases and norms: ``lambda name, shape: len(shape) == 1``)."""

    decoupled: Callable[[str, tuple[int, ...]], bool] | None = None
    """Given a parameter's name and shape, True makes it step at the decoupled rate of a
    step's :class:`~odc_pp.optim.rates.StepRates` (Megatron's --decoupled-lr: embedding
    and output layer); None: every parameter steps at the step's rate."""

    fused: bool = True
    """torch's fused AdamW kernel over the shards (False: the ``foreach`` kernel)."""

    def __post_init__(self) -> None:
        if not self.lr >= 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if not all(0.0 <= beta < 1.0 for beta in self.betas) or len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


class ShardedAdamW:
    """AdamW over the owned shards of ``engine``; call after ``engine.finish_minibatch()``.

    ``norm_group``: the ranks whose owned gradients together make the whole model's
    gradient, for the global norm. Default ``"data_parallel"``: ``engine.process_group``.
    Under pipeline parallelism pass the group of all pp x dp ranks (``None``: WORLD), or
    the sequence ``[data-parallel group, pipeline group]`` (reduced in turn), as each rank
    owns a disjoint piece: its stage's units, its shard of them. The reductions wait at
    most the engine transport's ``timeout_s``.
    """

    def __init__(self, engine: ShardedDataParallel, config: AdamWConfig, *,
                 norm_group="data_parallel", counts_in_norm=None) -> None:
        """``counts_in_norm(name, shape)``: False for a parameter another rank of the
        norm group also holds (tensor parallelism: a replicated parameter on every tp rank
        but the first), so each gradient element enters the global norm once; None:
        every parameter counts."""
        self.engine = engine
        self.config = config
        self.norm_groups = clip.group_list(
            engine.process_group if norm_group == "data_parallel" else norm_group)
        self.step_count = 0
        self.master: list[torch.Tensor] = []
        self.exp_avg: list[torch.Tensor] = []
        self.exp_avg_sq: list[torch.Tensor] = []
        self.norm_mask: list[torch.Tensor | None] = []
        for unit, owned in zip(engine.units, engine.owned_params()):
            if owned.dtype == torch.float32:
                master = owned  # the symmetric shard itself: updated in place
            else:
                master = owned.detach().float().clone()
            self.master.append(master)
            self.exp_avg.append(torch.zeros_like(master))
            self.exp_avg_sq.append(torch.zeros_like(master))
            self.norm_mask.append(None if counts_in_norm is None else self._owned_mask(
                unit, lambda name, shape: not counts_in_norm(name, shape)))
        self.decay_pieces = [self._pieces(unit, self._group_of) for unit in engine.units]
        """Per owned shard, ``(start, end, (decayed, decoupled))`` runs covering it (one
        when all are alike): the fused kernel takes one weight decay and rate per call."""
        self.state_steps = [torch.zeros((), dtype=torch.float32, device=m.device)
                            for m, pieces in zip(self.master, self.decay_pieces) for _ in pieces]

    def _group_of(self, name: str, shape) -> tuple[bool, bool]:
        """``(decayed, decoupled)`` of a parameter (:class:`AdamWConfig`'s predicates)."""
        no_decay, decoupled = self.config.no_decay, self.config.decoupled
        return (no_decay is None or not no_decay(name, shape),
                decoupled is not None and decoupled(name, shape))

    @staticmethod
    def _pieces(unit, group_of) -> list[tuple[int, int, tuple[bool, bool]]]:
        """``(start, end, group)`` runs over the owned range, ``group`` the
        ``group_of(name, shape)`` of its parameters (decided without reading data); a gap
        is ``(True, False)``: decayed, the step's rate."""
        runs, position, size, gap = [], 0, unit.owned_numel, (True, False)
        for name, shape, offset in zip(unit.names, unit.shapes, unit.offsets):
            group = group_of(name, shape)
            for low, high, start in param_pieces(unit.owned, offset, math.prod(shape)):
                end = start + high - low
                if runs and runs[-1][2] == group and runs[-1][1] == start:
                    runs[-1] = (runs[-1][0], end, group)
                else:
                    if start > position:  # a gap (a layer's padding; none in a packed unit)
                        runs.append((position, start, gap))
                    runs.append((start, end, group))
                position = end
        if position < size or not runs:
            runs.append((position, size, gap))
        return runs

    @staticmethod
    def _owned_mask(unit, excluded) -> torch.Tensor | None:
        """Bool mask over the owned range: False where ``excluded(name, shape)``; None
        when nothing is excluded (or no predicate)."""
        if excluded is None:
            return None
        cut = []  # excluded pieces inside the owned range (decided without reading data)
        for name, shape, offset in zip(unit.names, unit.shapes, unit.offsets):
            if excluded(name, shape):
                cut += [(start, start + high - low) for low, high, start
                        in param_pieces(unit.owned, offset, math.prod(shape))]
        if not cut:
            return None
        mask = torch.ones(unit.owned_numel, dtype=torch.bool, device=unit.grad_acc.device)
        for start, end in cut:
            mask[start:end] = False
        return mask

    # ----- global norm, clipping and the synchronous step (odc_pp.optim.clip) ---------
    def local_grad_norm_sq(self) -> torch.Tensor:
        """Sum of squares of this rank's owned gradients (fp32 scalar tensor)."""
        grads = [grad if mask is None else grad[mask]
                 for grad, mask in zip(self.engine.owned_grads(), self.norm_mask)]
        return clip.local_sum_of_squares(grads, dtype=torch.float32,
                                         device=self.master[0].device)

    def grad_state(self) -> clip.GradState:
        """Global gradient state: the owned shares reduced over the ``norm_group``."""
        return clip.global_grad_state(self.local_grad_norm_sq(), self.norm_groups,
                                      device=self.master[0].device,
                                      timeout_s=self.engine.group.config.timeout_s)

    def clip_and_step(self, max_norm: float | None, *, lr: float | None = None) -> StepOutcome:
        """The synchronous step after ``engine.finish_minibatch()``: reduce the global
        gradient state over the ``norm_group``; an inf/nan gradient on any rank drops this
        minibatch's gradients and keeps the weights ("skipped", on every rank alike);
        otherwise scale the owned gradients so the global norm is at most ``max_norm``
        (as ``torch.nn.utils.clip_grad_norm_``; None or 0: no clipping) and step at
        ``lr`` (None: ``config.lr``). The outcome carries the norm before clipping."""
        state = self.grad_state()
        if not state.finite:
            self.finish_step()
            return StepOutcome(grad_norm=state.norm, action="skipped")
        clipped = bool(max_norm) and clip.clip_(self.engine.owned_grads(), state, max_norm)
        self.step(lr=lr)
        return StepOutcome(grad_norm=state.norm, action="clipped" if clipped else "accepted")

    # ----- update ----------------------------------------------------------------------
    @torch.no_grad()
    def step(self, *, lr: float | None = None, finish: bool = True,
             grads: list[torch.Tensor] | None = None) -> None:
        """One AdamW update of the owned shards at learning rate ``lr`` (None:
        ``config.lr``; a :class:`~odc_pp.optim.rates.StepRates`: its decoupled rate for
        the ``config.decoupled`` parameters) from the accumulated gradients (or ``grads``,
        one tensor per owned shard), then (with ``finish``) ``engine.finish_step()``: zero
        the accumulators and publish the new shards."""
        self.step_count += 1
        lr = self.config.lr if lr is None else lr
        grads = self.engine.owned_grads() if grads is None else grads
        for decayed in (True, False):
            for decoupled in (False, True):
                rate = float(decoupled_rate(lr) if decoupled else lr)
                self._adamw(grads, (decayed, decoupled), rate,
                            self.config.weight_decay if decayed else 0.0)
        owned = self.engine.owned_params()
        copies = [(o, m) for o, m in zip(owned, self.master) if o.data_ptr() != m.data_ptr()]
        if copies:
            torch._foreach_copy_([o for o, _ in copies], [m for _, m in copies])
        if finish:
            self.finish_step()

    def _adamw(self, grads, group: tuple[bool, bool], lr: float, weight_decay: float) -> None:
        """torch's AdamW kernel over every owned piece of ``group`` (decayed, decoupled)."""
        lists = ([], [], [], [], [])
        steps = iter(self.state_steps)
        for index, pieces in enumerate(self.decay_pieces):
            for start, end, piece_group in pieces:
                step = next(steps)
                if piece_group != group:
                    continue
                for out, tensor in zip(lists, (self.master[index], grads[index],
                                               self.exp_avg[index], self.exp_avg_sq[index])):
                    out.append(tensor[start:end])
                lists[4].append(step)
        if not lists[0]:
            return
        torch._foreach_zero_(lists[4])
        torch._foreach_add_(lists[4], float(self.step_count - 1))  # the kernel adds 1
        fused = self.config.fused and lists[0][0].dtype in (torch.float32, torch.float16,
                                                            torch.bfloat16)
        beta1, beta2 = self.config.betas
        adamw(*lists[:4], [], lists[4], foreach=not fused, fused=fused or None,
              amsgrad=False, beta1=beta1, beta2=beta2, lr=lr, weight_decay=weight_decay,
              eps=self.config.eps, maximize=False)

    # ----- state -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's owned state (fp32 master, moments, step count), detached copies."""
        return {"step": self.step_count,
                "master": [t.detach().clone() for t in self.master],
                "exp_avg": [t.detach().clone() for t in self.exp_avg],
                "exp_avg_sq": [t.detach().clone() for t in self.exp_avg_sq]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output of the same shard layout; the parameter shards
        follow the master weights. Call ``engine.finish_step()`` afterwards to publish."""
        for name in ("master", "exp_avg", "exp_avg_sq"):
            mine, theirs = getattr(self, name), state[name]
            if len(mine) != len(theirs) or any(a.shape != b.shape for a, b in zip(mine, theirs)):
                raise ValueError(f"optimizer state {name!r} has a different shard layout "
                                 f"(another model or data-parallel size?)")
            for target, source in zip(mine, theirs):
                target.copy_(source)
        self.step_count = int(state["step"])
        for owned, master in zip(self.engine.owned_params(), self.master):
            if owned.data_ptr() != master.data_ptr():
                owned.copy_(master)

    def snapshot(self) -> dict:
        """Copy of the owned state and gradients, for :meth:`restore` / :meth:`redo_clipped`
        (``finish_step`` zeroes the accumulators for the next minibatch)."""
        return dict(self.state_dict(),
                    grads=[grad.detach().clone() for grad in self.engine.owned_grads()])

    def restore(self, snapshot: dict) -> None:
        """Roll back to ``snapshot`` (accumulated gradients are untouched). Peers see the
        restored shards after the next ``engine.finish_step()``."""
        self.load_state_dict(snapshot)

    # ----- PostValidationTarget ----------------------------------------------------------
    def step_eagerly(self, lr: float | None = None) -> None:
        """:meth:`step` at ``lr`` without publishing (``finish=False``)."""
        self.step(lr=lr, finish=False)

    @torch.no_grad()
    def redo_clipped(self, snapshot: dict, coefficient: float, lr: float | None = None) -> None:
        """Roll back to ``snapshot``, scale its kept gradients by ``coefficient`` and
        step again on them at ``lr`` (the eager step's), unpublished."""
        self.restore(snapshot)
        clip.scale_(snapshot["grads"], coefficient)
        self.step(lr=lr, finish=False, grads=snapshot["grads"])

    def finish_step(self) -> None:
        """Zero the accumulators and publish the owned shards (``engine.finish_step()``)."""
        self.engine.finish_step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: :meth:`finish_step` zeroes the engine's accumulators."""
