"""odc_pp.odc: ODC sharded data parallelism.

Public API (engine and optimizer are imported lazily, on first access):

* :class:`OdcConfig`, :class:`ShardedDataParallel` (``engine``): shard a list of modules
  over a data-parallel ``OdcGroup``; gather on demand, scatter-accumulate gradients, one
  sync per minibatch; module hooks for plain training or the pipeline runtime's hooks.
* :class:`AdamWConfig`, :class:`ShardedAdamW` (``sharded_optimizer``): AdamW with fp32
  master weights on the owned shards, sharded grad-norm clipping, snapshot/restore.
* Checkpoints of an engine + optimizer: :mod:`odc_pp.training.checkpoint.checkpointing` (atomic,
  checksummed) with :func:`odc_pp.training.checkpoint.resharding.sharded_state` /
  :func:`~odc_pp.training.checkpoint.resharding.restore_optimizer` (exact, or resharded to another
  data-parallel size through :meth:`ShardedDataParallel.layout`).

Load balancing and sample assignment live in :mod:`odc_pp.data`.
"""

from importlib import import_module

_LAZY = {
    "OdcConfig": "engine",
    "ShardedDataParallel": "engine",
    "AdamWConfig": "sharded_optimizer",
    "ShardedAdamW": "sharded_optimizer",
    "UnitLayout": "engine",
}

__all__ = [*_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
