"""ODC primitives: one-sided gather and scatter-accumulate with a torch.distributed-like API.

``gather_into_tensor`` pulls every member's shard without the owners taking part;
``scatter_accumulate`` pushes slices of a gradient into the owners' fp32 accumulators,
asynchronously; ``sync`` is the once-per-minibatch wait after which every accumulation
issued before it has landed. ``get`` and ``put`` read and write one peer's copy of a
symmetric tensor (the building blocks, exposed for other protocols). Paths, chosen per peer:

* same host, CPU tensors: POSIX shared memory (odc_pp._C), locked fp32 adds;
* same host, CUDA tensors: cudaIpc handles, copies and an atomic add kernel on dedicated
  gather and push streams (odc_pp._C_cuda); staged adds at sync where the GPUs lack
  native peer atomics;
* other host (or ``force_cross_host``): gloo point-to-point answered by the owner's
  server thread (CPU tensors only).

Concurrency: accumulations from several ranks into one owner take per-chunk spin locks in
the owner's shared control block (CPU) or use atomicAdd (CUDA). Deterministic mode
stages every contribution in a private fp32 buffer and applies them at ``sync`` in source
rank order (turn-taking on shared counters; over gloo, the owner receives sources in rank
order), so results are bitwise reproducible. ``sync`` must be called by every member the
same number of times; a shard/accumulator may be any contiguous view of a tensor from
``symmetric_empty``.

This module checks arguments and delegates to the group
(:mod:`~odc_pp.odc.transport_group`), which routes each piece to the path of its peer; the
ordering/completion/visibility contract of the paths (including owner writes vs. peer adds
at ``sync``) is in :mod:`~odc_pp.odc.transport_path`.
"""

from __future__ import annotations

import torch

from odc_pp import _C
from odc_pp.odc.transport_group import FORCE_CROSS_HOST_ENV, OdcGroup, TransportConfig
from odc_pp.odc.transport_host import dtype_code
from odc_pp.odc.transport_path import Work, shard_range

__all__ = ["TransportConfig", "OdcGroup", "Work", "PeerError", "new_group", "symmetric_empty",
           "symmetric_free",
           "shard_range", "gather_into_tensor", "scatter_accumulate", "get", "put", "sync",
           "FORCE_CROSS_HOST_ENV"]

PeerError = _C.PeerError


def _check_usable(group: OdcGroup) -> None:
    if not isinstance(group, OdcGroup):
        raise ValueError(f"group must be an OdcGroup from odc_pp.odc.primitives.new_group, "
                         f"got {type(group).__name__}")
    if group.destroyed:
        raise ValueError("this OdcGroup was destroyed; create a new one with new_group")


def _check_shard(full: torch.Tensor, part: torch.Tensor, group: OdcGroup, what: str) -> int:
    shard_size = -(-full.numel() // group.world_size)
    if part.numel() != shard_size:
        raise ValueError(f"{what} must hold ceil({full.numel()} / {group.world_size}) = "
                         f"{shard_size} elements, got {part.numel()}")
    if not full.is_contiguous():
        raise ValueError("the full-size tensor (output / input) must be contiguous")
    if full.device != part.device:
        raise ValueError(f"{what} is on {part.device} but the full tensor on {full.device}")
    return shard_size


def new_group(process_group=None, *, config: TransportConfig | None = None) -> OdcGroup:
    """Collective over the members of process_group (None = WORLD)."""
    return OdcGroup(process_group, config if config is not None else TransportConfig())


def symmetric_empty(shape, dtype: torch.dtype, group: OdcGroup, device=None) -> torch.Tensor:
    """Uninitialised tensor in symmetric memory. Collective: every member calls it with the
    same shape and dtype, in the same order."""
    _check_usable(group)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    device = torch.device(device) if device is not None else torch.device("cpu")
    if group.config.backend == "collective":
        return torch.empty(shape, dtype=dtype, device=device)
    return group.allocate(shape, dtype, device)


def symmetric_free(tensor: torch.Tensor, group: OdcGroup) -> None:
    """Free the symmetric allocation ``tensor`` (or a view of it) belongs to. Collective:
    every member calls it for the same allocation; peers unmap before the owner frees.
    Contributions staged since the last ``sync`` are discarded; do not use the tensor or
    its views afterwards. A no-op for the collective backend (plain tensors)."""
    _check_usable(group)
    if group.config.backend == "odc":
        group.release(tensor)


def gather_into_tensor(output: torch.Tensor, shard: torch.Tensor, group: OdcGroup, *,
                       async_op: bool = False) -> Work | None:
    """output[start_r:end_r] = rank r's shard[:end_r - start_r] for every member r, read
    one-sidedly (the owners do not take part). ``async_op`` (CUDA odc backend): return a
    Work at once; its ``wait()`` makes the then current stream wait for the copies (no host
    block). Elsewhere the gather completes before the (completed) Work is returned."""
    _check_usable(group)
    if output.dtype != shard.dtype:
        raise ValueError(f"output dtype {output.dtype} differs from shard dtype {shard.dtype}")
    _check_shard(output, shard, group, "shard")
    if output.numel() == 0 and group.config.backend == "odc":
        return Work() if async_op else None  # (empty tensors have data_ptr 0)
    work = group.gather(output, shard, async_op=async_op)
    return work if async_op else None


def scatter_accumulate(accumulator: torch.Tensor, input: torch.Tensor, group: OdcGroup, *,
                       retain: bool = False) -> Work:
    """Asynchronously add input[start_r:end_r] into rank r's accumulator[:end_r - start_r]
    (fp32) for every member r. Members may call it different numbers of times (odc
    backend); everything issued before a sync has landed once sync returns everywhere.
    ``retain``: the caller leaves ``input`` unchanged until the next sync, so a staging
    group may stage an fp32 input by reference instead of copying it."""
    _check_usable(group)
    if accumulator.dtype != torch.float32:
        raise ValueError(f"accumulator must be float32, got {accumulator.dtype}")
    dtype_code(input.dtype)
    _check_shard(input, accumulator, group, "accumulator")
    if input.numel() == 0 and group.config.backend == "odc":
        return Work()
    return group.scatter_accumulate(accumulator, input, retain=retain)


def get(output: torch.Tensor, remote: torch.Tensor, peer: int, group: OdcGroup) -> None:
    """output = ``peer``'s copy of ``remote``, read one-sidedly (``peer`` does not take
    part). ``remote`` is a contiguous view of a tensor from ``symmetric_empty``; the same
    bytes of peer's buffer are read. What peer wrote before a ``sync`` that both passed is
    visible. On CUDA the copy is ordered on the current stream, like a collective."""
    _check_point_to_point(output, remote, peer, group, "get", "output")
    if output.numel() == 0:
        return
    group.get(output.view(-1), remote, peer)


def put(remote: torch.Tensor, input: torch.Tensor, peer: int, group: OdcGroup) -> Work:
    """Write ``input`` into ``peer``'s copy of ``remote`` one-sidedly (see :func:`get` for
    ``remote``). Once the returned work's ``wait()`` (or this rank's next ``sync``) has
    returned the bytes are in peer's memory; peer may read them after that ``sync``. CPU
    puts are complete on return."""
    _check_point_to_point(input, remote, peer, group, "put", "input")
    if input.numel() == 0:
        return Work()
    return group.put(remote, input.view(-1), peer)


def _check_point_to_point(local: torch.Tensor, remote: torch.Tensor, peer: int,
                          group: OdcGroup, op: str, name: str) -> None:
    _check_usable(group)
    if group.config.backend != "odc":
        raise ValueError(f"{op} is one-sided and needs TransportConfig(backend='odc'), not "
                         f"{group.config.backend!r}")
    if not 0 <= peer < group.world_size:
        raise ValueError(f"{op}: peer must be a group rank in [0, {group.world_size}), "
                         f"got {peer}")
    if local.dtype != remote.dtype or local.numel() != remote.numel():
        raise ValueError(f"{op}: {name} ({local.numel()} x {local.dtype}) must match remote "
                         f"({remote.numel()} x {remote.dtype})")
    if not (local.is_contiguous() and remote.is_contiguous()):
        raise ValueError(f"{op}: {name} and remote must be contiguous")
    if local.device.type != remote.device.type:
        raise ValueError(f"{op}: {name} is on {local.device} but remote on {remote.device}")


def sync(group: OdcGroup) -> None:
    """Once-per-minibatch barrier: when it has returned on every member, every
    scatter_accumulate any member issued before its sync has landed, and so has every
    write a member queued on its current CUDA stream (e.g. to its shards) before it."""
    _check_usable(group)
    group.sync()
