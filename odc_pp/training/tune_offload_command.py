"""``odc-pp tune-offload`` (:mod:`odc_pp.planner.offload_tuner`, the planner's view with tp
and pp fixed) with the dry run's memory model: every ranked candidate's peak and its
fits / does-not-fit are what ``pretrain_gpt.py --dry-run`` computes for its printed flags
(:func:`odc_pp.training.plan_memory.rank_peaks`), as in ``odc-pp plan``; ``--hf-config``
is read by ``odc-pp plan``'s loader (:func:`odc_pp.training.hf_model.model_from_hf`). In
the training layer because the dry run is there."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from odc_pp.planner.offload_tuner import main as tune_main
    from .hf_model import model_from_hf
    from .plan_memory import rank_peaks

    return tune_main(argv, rank_memory=rank_peaks, load_hf=model_from_hf)


if __name__ == "__main__":
    sys.exit(main())
