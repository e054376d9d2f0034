"""Launchers shared by the tests and the benchmarks (nothing in the library imports them):

* :mod:`odc_pp.testing.launch` -- ``run_workers(fn, world_size, *args)``: gloo processes
  on this machine, each running a Python function, with deadlines on every wait;
* :mod:`odc_pp.testing.torchrun` -- ``launch(flags, nproc=...)``: ``odc_pp.train`` on
  ``nproc`` ranks with a hard timeout, through the zygote launcher
  (:mod:`odc_pp.testing.zygote`, :mod:`odc_pp.testing.zygote_server`: torchrun's worker
  environment, ranks forked from a preloaded process) or ``torchrun --standalone``, and
  ``TINY_MODEL``'s flags;
* :mod:`odc_pp.testing.bench` -- what a timed benchmark records (load average, median
  with min-max, rotated round order) and how it writes its JSON.
"""

__all__ = ["bench", "launch", "torchrun", "zygote", "zygote_server"]
