"""A fake ODC group for the memory dry run (:mod:`odc_pp.training.dry_run`).

:class:`FakeOdcGroup` stands for rank ``rank`` of a ``world_size``-member group without
peers, shared memory or devices: symmetric tensors are plain ``torch.empty`` (fake tensors
under ``FakeTensorMode``), gathers and syncs move nothing. Deterministic mode keeps what
the real staged accumulation (:mod:`~odc_pp.odc.transport_staged`) keeps: one fp32 buffer
the size of each staged input, from its first stage after a sync to the next sync, so the
engine's memory under the dry run is the real engine's. Never use it for training.
"""

from __future__ import annotations

import torch

from odc_pp.odc.transport_group import OdcGroup, TransportConfig
from odc_pp.odc.transport_path import Work

__all__ = ["FakeOdcGroup"]


class FakeOdcGroup(OdcGroup):
    """One member's view of a group whose peers do not exist (memory accounting only)."""

    def __init__(self, *, rank: int, world_size: int, deterministic: bool,
                 backend: str = "odc") -> None:
        # deliberately not OdcGroup.__init__: no process group, segments or paths
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        # backend: the one the engine's mode asks for (DataParallelMode.transport)
        self.config = TransportConfig(backend=backend, deterministic=deterministic)
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._destroyed = False
        self.staging: dict[tuple[int, int], torch.Tensor] = {}
        """fp32 staging buffers (deterministic), keyed by (accumulator id, numel)."""

    def allocate(self, shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    def release(self, tensor: torch.Tensor) -> None:
        return None

    def gather(self, output: torch.Tensor, shard: torch.Tensor, async_op: bool = False) -> Work:
        return Work()

    def get(self, output: torch.Tensor, remote: torch.Tensor, peer: int) -> None:
        return None

    def get_many(self, pieces: list, *, async_op: bool = False) -> Work:
        return Work()

    def scatter_accumulate(self, accumulator: torch.Tensor, input: torch.Tensor, *,
                           retain: bool = False) -> Work:
        if retain:
            return Work()  # staged by reference (StagedAccumulation.stage): no bytes
        if self.config.deterministic:
            key = (id(accumulator.untyped_storage()), input.numel())
            if key not in self.staging:
                self.staging[key] = torch.zeros(input.numel(), dtype=torch.float32,
                                                device=input.device)
            self.staging[key].add_(input.reshape(-1))
        return Work()

    def staged_bytes(self) -> int:
        return sum(buffer.numel() * 4 for buffer in self.staging.values())

    def sync(self) -> None:
        self.epoch += 1
        self.staging.clear()  # as StagedAccumulation.apply: freed at the sync

    def destroy(self) -> None:
        self._destroyed = True
        self.staging.clear()
