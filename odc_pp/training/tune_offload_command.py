"""``odc-pp tune-offload`` (:mod:`odc_pp.planner.offload_tuner`, the planner's view with tp
and pp fixed) with the dry run's memory model: every ranked candidate's peak and its
fits / does-not-fit are what ``pretrain_gpt.py --dry-run`` computes for its printed flags
(:func:`odc_pp.training.plan_memory.rank_peaks`), as in ``odc-pp plan``. In the training
layer because the dry run is there."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from odc_pp.planner.offload_tuner import main as tune_main
    from .plan_memory import rank_peaks

    return tune_main(argv, rank_memory=rank_peaks)


if __name__ == "__main__":
    sys.exit(main())
