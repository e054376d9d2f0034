"""Execute one rank's part of a lowered Schedule on model chunks.

``PipelineRuntime.run_minibatch(schedule, microbatches)`` walks the rank's action list of
``schedule`` (one runtime serves every schedule of its chunks: LB-Mini's microbatch counts,
ZB-auto's re-plans) in order:

* ``F``: run the chunk on its input (tokens on stage 0, else a received or locally handed
  activation), keep the output for the backward, hand it to the next stage.
* ``B``: backward from the output (loss on the last stage, else the received output
  gradient) with weight-gradient deferral on: linear wgrads go to the WeightGradQueue.
* ``W``: run the queued wgrads of (chunk, microbatch). ``BW``: B with the weight
  gradients computed inside the backward (no deferral: nothing queued or held for a W).
* ``SEND_*``/``RECV_*``: consecutive comm actions are issued together (sends batched);
  receives are posted when their RECV runs and waited where the compute consumes them.
* ``OFFLOAD``/``RELOAD``: move saved activations of (chunk, microbatch) to the host
  pool and back.
* ``POST_VALIDATION`` (the rank's gradients are final; without one: after the last
  action): finish the data-parallel engine's minibatch, then take the optimizer step the
  runtime was given (:class:`~odc_pp.optim.step.OptimizerStep`), whichever it is: the
  synchronous one (:class:`~odc_pp.optim.step.SynchronousStep`; the outcome is
  :attr:`MinibatchResult.step`), or post-validation
  (:class:`~odc_pp.optim.post_validation.PostValidatedOptimizer`), which validates the
  previous minibatch's eager step, whose global norm / inf check ran while this
  minibatch ran, then steps eagerly on this minibatch's gradients. When that validation
  rolled the previous step back or clipped it, this minibatch ran on parameters that are
  gone: its gradients were dropped, nothing is stepped, and
  :attr:`MinibatchResult.repeat` asks the caller to run it again. Without an optimizer
  step, call your optimizer after run_minibatch.

The schedule must be lowered (:func:`odc_pp.schedule.lowering.lower`): every stage hop
between ranks needs its SEND and RECV action; hops that stay on the rank (V placement's
turn, pp=1) never touch the network.

The last stage's loss is ``sum(token losses * loss_mask) / global_num_tokens``, so the
gradient of a minibatch equals the gradient of the mean token loss over the global batch.
The loss sum stays on the device until the minibatch ends (one transfer per minibatch).
"""

from __future__ import annotations

import contextlib
import time
from typing import Sequence

import torch
import torch.distributed as dist

from ..schedule.ir import Action, ActionKind, COMM_KINDS, Schedule
from ..data.microbatch import Microbatch, count_tokens
from ..data.pinned import to_device
from .hooks import NoDataParallel, StageDataParallel
from .offload import ActivationStore
from .timing import ActionClock
from .p2p import PeerTransport
from .p2p_channels import PipelineChannels, pipeline_channels
from .runtime_config import ActionTiming, Key, MinibatchResult, RuntimeConfig
from odc_pp.optim.step import OptimizerStep, StepReport
from .wgrad import WeightGradQueue

__all__ = ["RuntimeConfig", "PipelineRuntime", "MinibatchResult", "ActionTiming"]


def _check_request(schedule: Schedule, microbatches: Sequence[Microbatch],
                   forward_only: bool) -> None:
    """ValueError naming the schedule where it cannot run these microbatches."""
    if forward_only and any(a.kind not in (ActionKind.F, ActionKind.SEND_F, ActionKind.RECV_F)
                            for a in schedule.actions()):
        raise ValueError(f"forward_only: schedule {schedule.name!r} has actions other than "
                         f"F / SEND_F / RECV_F (make it with "
                         f"odc_pp.schedule.lowering.forward_only)")
    if len(microbatches) != schedule.num_microbatches:
        raise ValueError(f"schedule {schedule.name!r} expects {schedule.num_microbatches} "
                         f"microbatches, got {len(microbatches)}")


class PipelineRuntime:
    """Runs this rank's (``pp_group`` rank) actions of the schedules it is given on
    ``chunks``. The weight-gradient queue is bound to the chunks once, here.

    ``channels``: the pipeline's point-to-point process groups (one per direction, see
    :mod:`odc_pp.runtime.p2p_channels`); default: created here from ``pp_group``, which
    then must span every process (collective). ``p2p_ops``: the point-to-point calls
    (default torch.distributed's; tests pass an NCCL-semantics backend)."""

    def __init__(self, config: RuntimeConfig, *, chunks: Sequence[torch.nn.Module],
                 pp_group, dp_hooks: StageDataParallel | None = None,
                 optimizer_step: OptimizerStep | None = None,
                 channels: PipelineChannels | None = None,
                 p2p_ops=None) -> None:
        self.config = config
        self.chunks = list(chunks)
        self.pp_group = pp_group
        self.rank = dist.get_rank(pp_group)
        self.dp_hooks = dp_hooks if dp_hooks is not None else NoDataParallel()
        self.optimizer_step = optimizer_step
        """Taken when a minibatch's gradients are final (None: the caller steps)."""
        self.device = torch.device(config.device)
        self.wgrad_queue = WeightGradQueue()
        for index, chunk in enumerate(self.chunks):
            self.wgrad_queue.attach(index, chunk)
        self._clock = ActionClock(self.device)  # CUDA events on GPU, host clock on CPU
        self.store = ActivationStore(
            parameters=[p for chunk in self.chunks for p in chunk.parameters()],
            device=self.device, min_offload_bytes=config.min_offload_bytes, clock=self._clock)
        if channels is None:
            channels = pipeline_channels(pp_group)
        if channels.ranks != dist.get_process_group_ranks(pp_group):
            raise ValueError(f"channels connect global ranks {channels.ranks} but pp_group "
                             f"has {dist.get_process_group_ranks(pp_group)}")
        self.transport = PeerTransport(channels=channels, rank=self.rank, device=self.device,
                                       timeout_s=config.comm_timeout_s,
                                       batch=config.batch_p2p, ops=p2p_ops)
        if config.shapes_from_microbatch and not all(
                hasattr(chunk, "input_shape") and hasattr(chunk, "output_shape")
                for chunk in self.chunks):
            raise ValueError("shapes_from_microbatch needs chunks with input_shape(microbatch)"
                             " and output_shape(microbatch); set RuntimeConfig("
                             "shapes_from_microbatch=False) to send shape headers instead")
        self._prepost = config.prepost_receives
        if self._prepost is None:
            self._prepost = (config.shapes_from_microbatch
                             and dist.get_backend(pp_group) == "gloo")
        self.transport.receives_preposted = bool(self._prepost)
        self.schedule: Schedule | None = None
        """The schedule of the current (or last) minibatch."""
        self.actions: list[Action] = []
        self._forward_only = False
        self._step_lr: float | None = None
        self._loss_scale = 1.0

    # ----- public ----------------------------------------------------------------
    def run_minibatch(self, schedule: Schedule, microbatches: Sequence[Microbatch], *,
                      global_num_tokens: int | None = None,
                      max_microbatches: int | None = None,
                      step_lr: float | None = None,
                      forward_only: bool = False,
                      loss_scale: float = 1.0) -> MinibatchResult:
        """Run every action of this rank in ``schedule`` (lowered) for one minibatch; the
        data-parallel hooks open it (``begin_minibatch``) and close it
        (``finish_minibatch``, at POST_VALIDATION or the end).

        ``global_num_tokens``: tokens the loss is normalised by; default: the tokens of
        ``microbatches`` (pass the sum over data-parallel replicas when dp > 1).
        ``max_microbatches``: the largest microbatch count of any replica (collective data
        parallelism pads to it). ``step_lr``: learning rate of the optimizer step (None: the
        optimizer's own). ``loss_scale``: the backward starts from the
        loss times it (fp16 loss scaling; the reported ``loss_sum`` is unscaled).
        ``forward_only`` (evaluation; ``schedule`` from
        :func:`~odc_pp.schedule.lowering.forward_only`): F without autograd, nothing kept
        for a backward, no gradients finished; ``loss_sum`` is the masked token-loss sum.
        """
        _check_request(schedule, microbatches, forward_only)
        self._forward_only = forward_only
        self._use(schedule)
        self.dp_hooks.begin_minibatch(max_microbatches=max_microbatches,
                                      num_microbatches=len(microbatches))
        self._step_lr = step_lr
        self._loss_scale = loss_scale
        self._begin(microbatches, global_num_tokens)
        started = time.perf_counter()
        self._clock.restart()
        with torch.no_grad() if forward_only else contextlib.nullcontext():
            self._run_actions(started)
        self._finish()
        if not forward_only:
            self._gradients_final()
        loss_sum = None if self._loss_sum is None else float(self._loss_sum)
        return MinibatchResult(
            loss_sum=loss_sum, num_tokens=self._global_tokens,
            timings=self._clock.resolve(self._timings),
            peak_activation_bytes=self.store.peak_resident_bytes,
            activation_bytes=dict(self.store.captured_bytes),
            wgrad_bytes=dict(self.wgrad_queue.held_bytes),
            wall_time=time.perf_counter() - started, step=self._report.outcome,
            validated=self._report.validated, repeat=self._report.repeat)

    # ----- phases ----------------------------------------------------------------
    def _run_actions(self, started: float) -> None:
        """Every action of this rank in order; adjacent communication runs as a group."""
        index = 0
        while index < len(self.actions):
            group_end = self._comm_group_end(index)
            if group_end > index:
                self._run_comm_group(self.actions[index:group_end], started)
                index = group_end
                continue
            self._timed([self.actions[index]], self._run_action, started)
            index += 1

    def _use(self, schedule: Schedule) -> None:
        """Check ``schedule`` against the chunks and the group; take this rank's actions."""
        if schedule is self.schedule:
            return
        self._check_layout(schedule)
        actions = list(schedule.ranks[self.rank])
        has_offload = any(a.kind in (ActionKind.OFFLOAD, ActionKind.RELOAD) for a in actions)
        if self.config.track_activations is False and has_offload:
            raise ValueError(f"schedule {schedule.name!r} offloads activations: keep "
                             "track_activations None or True")
        self._check_lowered(schedule, actions)
        self.schedule = schedule
        self.actions = actions
        self._track = has_offload if self.config.track_activations is None \
            else self.config.track_activations

    @property
    def tracks_activations(self) -> bool:
        """The schedule in use counts saved activations (offloading, or
        ``track_activations``): :attr:`MinibatchResult.peak_activation_bytes` is set."""
        return bool(getattr(self, "_track", False))

    def _begin(self, microbatches, global_num_tokens) -> None:
        self._microbatches = list(microbatches)
        self._global_tokens = (count_tokens(self._microbatches) if global_num_tokens is None
                               else int(global_num_tokens))
        if self._global_tokens <= 0:
            raise ValueError("the minibatch has no tokens that count in the loss")
        self._loss_sum: torch.Tensor | None = None
        self._gradients_done = False
        self._report = StepReport()
        self._timings: list[ActionTiming] = []
        self._inputs: dict[Key, torch.Tensor | None] = {}
        self._outputs: dict[Key, torch.Tensor] = {}
        self._handoff_f: dict[Key, torch.Tensor] = {}
        self._handoff_b: dict[Key, torch.Tensor] = {}
        self._ready_to_send: dict[tuple, torch.Tensor] = {}
        self._pending_recv: dict[tuple, object] = {}
        self.store.reset_peak()
        self.wgrad_queue.claim()  # chunks shared with another runtime (benchmarks)
        self.wgrad_queue.reset_held_bytes()
        self.transport.max_inflight_sends = 0
        if self._prepost:
            self._post_all_receives()

    def _post_all_receives(self) -> None:
        """Post this minibatch's receives now, in schedule order (see prepost_receives)."""
        for action in self.actions:
            if action.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                self._pending_recv[(action.kind, action.chunk, action.microbatch)] = \
                    self._post_recv(action)

    def _finish(self) -> None:
        self.transport.drain_sends()
        leftovers = {
            "outputs awaiting backward": list(self._outputs),
            "unsent tensors": list(self._ready_to_send),
            "unconsumed receives": list(self._pending_recv),
            "deferred weight gradients": self.wgrad_queue.pending_keys(),
        }
        problems = {name: keys for name, keys in leftovers.items() if keys}
        if problems:
            raise ValueError(f"schedule {self.schedule.name!r} rank {self.rank} is "
                             f"incomplete: {problems}")

    def _gradients_final(self) -> None:
        """This rank's gradients are final (POST_VALIDATION, or the end): finish data
        parallelism once, then take the optimizer step."""
        if self._gradients_done:
            return
        self._gradients_done = True
        self.dp_hooks.finish_minibatch()
        if self.optimizer_step is not None:
            self._report = self.optimizer_step.gradients_final(self._step_lr)

    def _run_action(self, action: Action) -> None:
        kind = action.kind
        if kind is ActionKind.F:
            self._forward(action.chunk, action.microbatch)
        elif kind in (ActionKind.B, ActionKind.BW):
            self._backward(action.chunk, action.microbatch, fused=kind is ActionKind.BW)
        elif kind is ActionKind.W:
            self._weight_grad(action.chunk, action.microbatch)
        elif kind is ActionKind.OFFLOAD:
            self.store.offload((action.chunk, action.microbatch))
        elif kind is ActionKind.RELOAD:
            self.store.reload((action.chunk, action.microbatch))
        elif kind is ActionKind.POST_VALIDATION:
            self._gradients_final()
        else:
            raise AssertionError(f"unexpected action {action}")

    # ----- compute ---------------------------------------------------------------
    def _forward(self, chunk: int, microbatch: int) -> None:
        key = (chunk, microbatch)
        self.dp_hooks.before_forward(chunk, microbatch)
        stage = self.schedule.stage_of(self.rank, chunk)
        hidden = None
        if stage > 0:
            hidden = self._take_activation(chunk, microbatch).detach().requires_grad_()
        data = self._microbatches[microbatch]
        if self._forward_only:
            output = self.chunks[chunk](hidden, data)
            if stage == self.schedule.num_stages - 1:
                self._scaled_loss(output, data)
            else:
                self._hand_on(ActionKind.SEND_F, chunk, microbatch, output,
                              self.schedule.next_stage_rank(self.rank, chunk), stage + 1)
            return
        capture = self.store.capture(key) if self._track else contextlib.nullcontext()
        with capture:
            output = self.chunks[chunk](hidden, data)
            if stage == self.schedule.num_stages - 1:
                output = self._scaled_loss(output, data)
        self._inputs[key] = hidden
        self._outputs[key] = output
        if stage < self.schedule.num_stages - 1:
            self._hand_on(ActionKind.SEND_F, chunk, microbatch, output.detach(),
                          self.schedule.next_stage_rank(self.rank, chunk), stage + 1)

    def _scaled_loss(self, token_losses: torch.Tensor, data: Microbatch) -> torch.Tensor:
        token_losses = token_losses.float()
        if data.loss_mask is not None:
            token_losses = token_losses * to_device(data.loss_mask, token_losses.device)
        loss_sum = token_losses.sum()
        # float64 on the device, no host sync: the same sum as adding Python floats
        detached = loss_sum.detach().double()
        self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
        loss = loss_sum / self._global_tokens
        return loss if self._loss_scale == 1.0 else loss * self._loss_scale

    def _backward(self, chunk: int, microbatch: int, *, fused: bool) -> None:
        key = (chunk, microbatch)
        if key not in self._outputs:
            raise ValueError(f"rank {self.rank}: backward of {key} before its forward")
        self.dp_hooks.before_backward(chunk, microbatch)
        stage = self.schedule.stage_of(self.rank, chunk)
        output = self._outputs.pop(key)
        grad_output = None
        if stage < self.schedule.num_stages - 1:
            grad_output = self._take_gradient(chunk, microbatch)
        # BW: each weight gradient is computed where autograd reaches it (nothing queued,
        # nothing held past its layer); B: deferred to the W action
        with contextlib.nullcontext() if fused else \
                self.wgrad_queue.deferring(chunk, microbatch):
            torch.autograd.backward(output, grad_tensors=grad_output)
        self.store.release(key)
        if self._track and not fused:
            self.store.hold_for_weight_grad(key, self.wgrad_queue.pending_bytes(*key))
        hidden = self._inputs.pop(key)
        if fused:
            self._weight_grad(chunk, microbatch)
        if stage > 0:
            self._hand_on(ActionKind.SEND_B, chunk, microbatch, hidden.grad,
                          self.schedule.prev_stage_rank(self.rank, chunk), stage)

    def _weight_grad(self, chunk: int, microbatch: int) -> None:
        self.wgrad_queue.flush(chunk, microbatch)
        self.store.release_weight_grad((chunk, microbatch))
        self.dp_hooks.after_weight_grad(chunk, microbatch)

    # ----- data movement ---------------------------------------------------------
    def _hand_on(self, send_kind: ActionKind, chunk: int, microbatch: int,
                 tensor: torch.Tensor, peer: int, tag_stage: int) -> None:
        """Give a produced activation/gradient to the stage that consumes it."""
        if peer == self.rank:
            neighbour_stage = tag_stage if send_kind is ActionKind.SEND_F else tag_stage - 1
            neighbour_chunk = self.schedule.locate(neighbour_stage)[1]
            handoff = self._handoff_f if send_kind is ActionKind.SEND_F else self._handoff_b
            handoff[(neighbour_chunk, microbatch)] = tensor
            return
        self._ready_to_send[(send_kind, chunk, microbatch)] = tensor

    def _take_activation(self, chunk: int, microbatch: int) -> torch.Tensor:
        if (chunk, microbatch) in self._handoff_f:
            return self._handoff_f.pop((chunk, microbatch))
        return self._take_message(ActionKind.RECV_F, chunk, microbatch)

    def _take_gradient(self, chunk: int, microbatch: int) -> torch.Tensor:
        if (chunk, microbatch) in self._handoff_b:
            return self._handoff_b.pop((chunk, microbatch))
        return self._take_message(ActionKind.RECV_B, chunk, microbatch)

    def _take_message(self, kind: ActionKind, chunk: int, microbatch: int) -> torch.Tensor:
        pending = self._pending_recv.pop((kind, chunk, microbatch), None)
        if pending is None:
            raise ValueError(f"rank {self.rank}: {kind.value} of chunk {chunk} microbatch "
                             f"{microbatch} is consumed before its RECV action ran")
        return self.transport.wait(pending)

    def _run_comm_group(self, actions: list[Action], started: float) -> None:
        """Post the group's receives (each timed alone), then issue its sends together
        (one timing shared by them): the profiler measures per-message CPU cost."""
        sends = [a for a in actions if a.kind in (ActionKind.SEND_F, ActionKind.SEND_B)]
        self.transport.reap_sends()  # sent tensors live only while in flight
        for action in actions:
            if action.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                self._timed([action], self._remember_recv, started)
        if sends:
            self._timed(sends, self._send, started)

    def _remember_recv(self, actions: list[Action]) -> None:
        action = actions[0]
        if not self._prepost:  # else posted when the minibatch started
            self._pending_recv[(action.kind, action.chunk, action.microbatch)] = \
                self._post_recv(action)

    def _send(self, actions: list[Action]) -> None:
        messages = []
        for action in actions:
            key = (action.kind, action.chunk, action.microbatch)
            if key not in self._ready_to_send:
                raise ValueError(f"rank {self.rank}: {action.short()} runs before the "
                                 "compute that produces its tensor")
            stage = self.schedule.stage_of(self.rank, action.chunk)
            tag_stage = stage + 1 if action.kind is ActionKind.SEND_F else stage
            peer = self._peer_of(action)
            messages.append((self._ready_to_send.pop(key), peer,
                             self._tag(action.kind, tag_stage, action.microbatch),
                             f"{action.short()} to rank {peer}"))
        self.transport.send_many(messages,
                                 with_header=not self.config.shapes_from_microbatch)

    def _post_recv(self, action: Action):
        stage = self.schedule.stage_of(self.rank, action.chunk)
        tag_stage = stage if action.kind is ActionKind.RECV_F else stage + 1
        peer = self._peer_of(action)
        shape = None
        if self.config.shapes_from_microbatch:
            # an input activation has the previous stage's output shape; an output
            # gradient has this chunk's output shape
            microbatch = self._microbatches[action.microbatch]
            chunk = self.chunks[action.chunk]
            shape = (chunk.input_shape(microbatch) if action.kind is ActionKind.RECV_F
                     else chunk.output_shape(microbatch))
        return self.transport.post_recv(peer, self._tag(action.kind, tag_stage,
                                                        action.microbatch),
                                        f"{action.short()} (from rank {peer})", shape=shape)

    def _peer_of(self, action: Action) -> int:
        if action.kind in (ActionKind.SEND_F, ActionKind.RECV_B):
            expected = self.schedule.next_stage_rank(self.rank, action.chunk)
        else:
            expected = self.schedule.prev_stage_rank(self.rank, action.chunk)
        if expected is None or (action.peer is not None and action.peer != expected):
            raise ValueError(f"rank {self.rank}: {action.short()} names peer {action.peer} "
                             f"but the neighbouring stage is on rank {expected}")
        return expected

    def _tag(self, kind: ActionKind, stage: int, microbatch: int) -> int:
        gradient = kind in (ActionKind.SEND_B, ActionKind.RECV_B)
        return (stage * self.schedule.num_microbatches + microbatch) * 2 + int(gradient)

    # ----- helpers ---------------------------------------------------------------
    def _comm_group_end(self, index: int) -> int:
        end = index
        while end < len(self.actions) and self.actions[end].kind in COMM_KINDS:
            end += 1
        return end

    def _timed(self, actions: list[Action], run, started: float) -> None:
        sync = self.config.synchronize_timings and self.device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.device)
        waited_before = self.transport.waited_s
        begin = self._clock.mark()
        run(actions if len(actions) > 1 or actions[0].kind in COMM_KINDS else actions[0])
        if sync:
            torch.cuda.synchronize(self.device)
        end = self._clock.mark()
        waited = self.transport.waited_s - waited_before
        transfer = self.store.take_transfer_span()  # OFFLOAD/RELOAD: the copies' own span
        if transfer is not None:
            begin, end = transfer
        for action in actions:
            self._timings.append(ActionTiming(action, begin, end, waited))

    def _check_layout(self, schedule: Schedule) -> None:
        if len(self.chunks) != schedule.num_chunks:
            raise ValueError(f"schedule {schedule.name!r} needs {schedule.num_chunks}"
                             f" chunks per rank, got {len(self.chunks)}")
        if dist.get_world_size(self.pp_group) != schedule.pp:
            raise ValueError(f"schedule is for pp={schedule.pp}, pipeline group has "
                             f"{dist.get_world_size(self.pp_group)} ranks")
        for index, chunk in enumerate(self.chunks):
            stage = getattr(chunk, "stage", None)
            expected = schedule.stage_of(self.rank, index)
            if stage is not None and stage != expected:
                raise ValueError(f"chunk {index} on rank {self.rank} holds stage {stage}, "
                                 f"the schedule's {schedule.placement.value} placement "
                                 f"puts stage {expected} there: build chunks with the "
                                 "schedule's placement")

    def _check_lowered(self, schedule: Schedule, actions: list[Action]) -> None:
        """Every stage hop between ranks has its SEND after the producer and its RECV
        before the consumer on this rank."""
        present = {(a.kind, a.chunk, a.microbatch) for a in actions if a.kind in COMM_KINDS}
        last = schedule.num_stages - 1
        for action in actions:
            stage = schedule.stage_of(self.rank, action.chunk) if action.is_compute else None
            needed = []
            if action.kind is ActionKind.F:
                if stage > 0 and schedule.prev_stage_rank(self.rank, action.chunk) != self.rank:
                    needed.append(ActionKind.RECV_F)
                if stage < last and \
                        schedule.next_stage_rank(self.rank, action.chunk) != self.rank:
                    needed.append(ActionKind.SEND_F)
            elif action.kind in (ActionKind.B, ActionKind.BW):
                if stage < last and \
                        schedule.next_stage_rank(self.rank, action.chunk) != self.rank:
                    needed.append(ActionKind.RECV_B)
                if stage > 0 and schedule.prev_stage_rank(self.rank, action.chunk) != self.rank:
                    needed.append(ActionKind.SEND_B)
            for kind in needed:
                if (kind, action.chunk, action.microbatch) not in present:
                    raise ValueError(
                        f"schedule {schedule.name!r} is not lowered: rank {self.rank}'s "
                        f"{action.short()} needs a {kind.value} action; run it through "
                        "odc_pp.schedule.lowering.lower (or lower_communication) first")
