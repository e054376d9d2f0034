"""The documented limits of the ``odc-pp`` command-line tools and their argparse types.

Every numeric argument of ``odc-pp schedule`` and ``odc-pp tune-offload`` is parsed by one
of these types, so out-of-range input fails at once with ``error: argument --flag: ...``
(exit status 2) instead of overflowing or running for minutes:

* ``--pp`` at most :data:`MAX_PP`, ``--microbatches`` / ``--num-microbatches`` at most
  :data:`MAX_MICROBATCHES`, and the work ``pp x microbatches x model chunks`` at most
  :data:`MAX_WORK` (:func:`check_work`; about 10 s of zb-auto search on one core);
* times (``--cost-*``) at most :data:`MAX_TIME`; other numbers have their own bound.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["MAX_PP", "MAX_MICROBATCHES", "MAX_CHUNKS", "MAX_WORK", "MAX_TIME",
           "bounded_int", "bounded_float", "check_work"]

MAX_PP = 1024
"""Most pipeline ranks a schedule is built for."""
MAX_MICROBATCHES = 8192
"""Most microbatches per minibatch."""
MAX_CHUNKS = 64
"""Most model chunks per rank."""
MAX_WORK = 16384
"""Most ``pp x microbatches x chunks`` (F/B/W triples of one schedule)."""
MAX_TIME = 1e12
"""Largest time (any unit) of one F, B, W or transfer: sums over a schedule stay finite."""


def bounded_int(low: int, high: int):
    """argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {text}")
        return value
    return parse


def bounded_float(low: float, high: float, *, open_low: bool = False):
    """argparse type: a finite number in [low, high] ((low, high] with ``open_low``)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        low_ok = value > low if open_low else value >= low
        if not (math.isfinite(value) and low_ok and value <= high):
            interval = f"{'(' if open_low else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"must be a finite number in {interval}, got "
                                             f"{text}")
        return value
    return parse


def check_work(pp: int, microbatches: int, chunks: int) -> None:
    """ValueError when ``pp x microbatches x chunks`` exceeds :data:`MAX_WORK`."""
    work = pp * microbatches * chunks
    if work > MAX_WORK:
        raise ValueError(f"--pp {pp} x {microbatches} microbatches x {chunks} model chunks = "
                         f"{work} exceeds the limit of {MAX_WORK} (odc_pp/schedule/"
                         f"cli_bounds.py): use fewer pipeline ranks or microbatches")
