"""Launchers shared by the tests and the benchmarks (nothing in the library imports them):

* :mod:`odc_pp.testing.launch` -- ``run_workers(fn, world_size, *args)``: gloo processes
  on this machine, each running a Python function, with deadlines on every wait;
* :mod:`odc_pp.testing.torchrun` -- ``launch(flags, nproc=...)``: ``pretrain_gpt.py``
  under ``torchrun --standalone`` with a hard timeout, and ``TINY_MODEL``'s flags.
"""

__all__ = ["launch", "torchrun"]
