"""``python -m odc_pp.train FLAGS``: the one training entry point of odc-pp.

It trains a megatron-core GPT with zero-bubble pipeline parallelism x ODC data parallelism
from Megatron's flags, and works the same from a checkout or a ``pip install``-ed odc-pp.
Under torchrun, name it as a module:

    torchrun --standalone --nproc-per-node 4 -m odc_pp.train \\
        --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 \\
        --pipeline-model-parallel-size 2 --pipeline-schedule zbv --dp-mode odc \\
        --load-balance lb-mini --mock-data --vocab-size 128 --global-batch-size 16 \\
        --train-iters 50 --lr 3e-3

``pretrain_gpt.py`` at the repository root is the same entry point under Megatron-LM's
script name; the demo and the tests' torchrun launcher run this module. Exit status: 0
done, 2 bad flags, 3 stopped (non-finite training), 4 interrupted by a signal, 1 a failure
on some rank (the message names it).
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and train; returns the exit status.

    The flags are checked before torch and megatron-core are imported (a bad flag is
    reported within a second: :mod:`odc_pp.training.flag_check`), and third-party
    warnings are shown once per kind, on the first rank
    (:mod:`odc_pp.training.third_party_warnings`)."""
    from odc_pp.training.flag_check import check_flags
    from odc_pp.training.third_party_warnings import install_warning_filter

    argv = list(sys.argv[1:] if argv is None else argv)
    checked = check_flags(argv)
    if isinstance(checked, int):
        return checked
    install_warning_filter()
    from odc_pp.training import pretrain

    return pretrain(argv, checked=checked)


if __name__ == "__main__":
    sys.exit(main())
