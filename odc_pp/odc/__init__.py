"""odc_pp.odc: ODC sharded data parallelism.

Public API (engine, optimizer and checkpoints are imported lazily, on first access):

* :class:`OdcConfig`, :class:`ShardedDataParallel` (``engine``): shard a list of modules
  over a data-parallel ``OdcGroup``; gather on demand, scatter-accumulate gradients, one
  sync per minibatch; module hooks for plain training or the pipeline runtime's hooks.
* :class:`AdamWConfig`, :class:`ShardedAdamW` (``sharded_optimizer``): AdamW with fp32
  master weights on the owned shards, sharded grad-norm clipping, snapshot/restore.
* :func:`save_checkpoint`, :func:`load_checkpoint` (``checkpoint``): atomic sharded
  checkpoints, resharding to another data-parallel size.
* :func:`run_workers` (``launch``): run a function on N local gloo processes.

Load balancing and the minibatch planner live in :mod:`odc_pp.data`.
"""

from importlib import import_module

_LAZY = {
    "OdcConfig": "engine",
    "ShardedDataParallel": "engine",
    "AdamWConfig": "sharded_optimizer",
    "ShardedAdamW": "sharded_optimizer",
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "LaunchConfig": "launch",
    "run_workers": "launch",
}

__all__ = [*_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
