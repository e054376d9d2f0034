"""How a rank runs its schedule (:class:`RuntimeConfig`) and what
:meth:`~odc_pp.runtime.runtime.PipelineRuntime.run_minibatch` returns
(:class:`MinibatchResult`, its :class:`ActionTiming` per action)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..schedule.ir import Action
from ..optim.step import StepOutcome

__all__ = ["RuntimeConfig", "MinibatchResult", "ActionTiming"]

Key = tuple[int, int]


@dataclass(kw_only=True)
class RuntimeConfig:
    """How a rank executes its schedule."""

    device: str = "cpu"
    """Compute device of the chunks ("cpu", "cuda", "cuda:1")."""
    comm_timeout_s: float = 300.0
    """Longest wait for one message from a peer before raising TimeoutError."""
    batch_p2p: bool = True
    """Issue consecutive sends as one ``batch_isend_irecv``."""
    track_activations: bool | None = None
    """Account saved-activation bytes of every F (saved-tensor hooks, ~5% step time on
    the CPU benchmark). None: only when the schedule has OFFLOAD/RELOAD actions, which
    need it; True to profile activation memory."""
    min_offload_bytes: int = 1024
    """Saved tensors smaller than this stay on the device during OFFLOAD."""
    synchronize_timings: bool = False
    """On GPU, synchronize around each action so its timing covers its kernels."""
    shapes_from_microbatch: bool = True
    """Receivers derive each activation/gradient shape from the microbatch through the
    chunks' ``input_shape(microbatch)`` / ``output_shape(microbatch)`` -> (shape, dtype),
    so only payloads travel and receives are posted at once. False: every message carries
    a shape header (works for any chunk). Must be equal on all ranks."""

    prepost_receives: bool | None = None
    """Post every receive of the minibatch when it starts instead of at its RECV action.
    Posting a gloo ``irecv`` while the peer's messages stream in contends with gloo's
    I/O thread (~0.1-0.4 ms per post on 2 busy CPU cores, vs ~20 us when idle), so
    posting them all up front, before any traffic, takes that cost off the critical
    path. Needs ``shapes_from_microbatch``. None: on when the pipeline group's backend is
    gloo (which matches by tag); NCCL runs receives in order on one stream, where
    posting ahead of the schedule's sends would deadlock."""

    def __post_init__(self) -> None:
        if self.prepost_receives and not self.shapes_from_microbatch:
            raise ValueError("prepost_receives needs shapes_from_microbatch=True (the "
                             "receive buffers are sized from the microbatches)")
        if self.comm_timeout_s <= 0:
            raise ValueError(f"comm_timeout_s must be > 0, got {self.comm_timeout_s}")
        if self.min_offload_bytes < 0:
            raise ValueError("min_offload_bytes must be >= 0")
        torch.device(self.device)  # raises on a malformed device string


@dataclass(frozen=True)
class ActionTiming:
    action: Action
    start: float
    """Seconds since the minibatch started."""
    end: float
    waited: float = 0.0
    """Seconds of the action spent waiting for a peer's message (an input activation or
    output gradient received at its consumer)."""

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def busy(self) -> float:
        """Duration without the wait for peers: the action's own cost."""
        return self.duration - self.waited


@dataclass
class MinibatchResult:
    loss_sum: float | None
    """Sum of token losses over the minibatch (ranks holding the last stage), else None."""
    num_tokens: int
    """Global token count the loss was divided by."""
    timings: list[ActionTiming] = field(default_factory=list)
    peak_activation_bytes: int = 0
    """Peak saved-activation bytes resident on the compute device during the minibatch."""
    activation_bytes: dict[Key, int] = field(default_factory=dict)
    """Saved bytes captured by each F, per (chunk, microbatch)."""
    wgrad_bytes: dict[Key, int] = field(default_factory=dict)
    """Bytes each B leaves held for its W (saved inputs, output gradients), per (chunk,
    microbatch; a BW defers nothing and has no entry); the profiler's memory deltas come
    from these and ``activation_bytes``."""
    wall_time: float = 0.0
    step: StepOutcome | None = None
    """This minibatch's optimizer step, when its outcome is known at once (synchronous;
    None: no optimizer step, or a deferred one)."""
    validated: StepOutcome | None = None
    """The previous minibatch's deferred step, validated at this one's POST_VALIDATION
    (None without post-validation or a pending step)."""
    repeat: bool = False
    """``validated`` rolled back or clipped the step this minibatch's forwards used: its
    gradients were dropped and it was not stepped. Run it again (every rank decides this
    from the same global state)."""
