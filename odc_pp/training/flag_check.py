"""``pretrain_gpt.py``'s flags checked before torch and megatron-core are imported: under
torchrun a mistyped flag is reported at once, by the first rank, above the launcher's
failure banner (importing torch and megatron-core takes seconds per process, longer when
many ranks start together on one host).

Everything :func:`check_flags` runs is torch-free: the parser and its checks
(:mod:`.arguments`, :mod:`.arg_sections`, :mod:`.argument_checks`) and the layout's
size checks against torchrun's ``WORLD_SIZE`` (:mod:`.launch_env`). What it resolves (the
:class:`~odc_pp.training.job.Job`, and the parse's notes) is handed to the training entry,
which does not resolve the flags again."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from .launch_env import read_env

__all__ = ["check_flags", "CheckedFlags", "PEER_WAIT_S"]

PEER_WAIT_S = 3.0
"""How long the other ranks wait before exiting on bad flags: torchrun stops every rank
once one exits, so the first rank's message comes first."""


@dataclass(frozen=True, kw_only=True)
class CheckedFlags:
    """Flags that passed :func:`check_flags`, resolved for this job's size."""

    job: object
    """The :class:`~odc_pp.training.job.Job` (resolved once, here)."""
    notes: tuple[str, ...] = ()
    """The parse's notes (what happened to each Megatron flag), for the log."""


def check_flags(argv: list[str], *, err=None) -> int | CheckedFlags | None:
    """Parse ``argv`` and resolve the job for its size: the :class:`CheckedFlags` when the
    flags are good, else 2 after the first rank printed the one error (``--help``:
    argparse prints and exits with status 0). None for ``--dry-run``, which is left to the
    dry run's own parser (it takes flags of its own)."""
    if "--dry-run" in argv:
        return None
    from .arguments import parse_args_with_notes

    env = read_env()
    try:
        args, notes = parse_args_with_notes(argv)
        job = args.resolve(env.world_size, env.local_world_size)
    except ValueError as exc:
        if env.rank == 0:
            print(f"pretrain_gpt.py: error: {exc}", file=err or sys.stderr, flush=True)
        else:  # let rank 0 print first: torchrun stops the others when one exits
            time.sleep(PEER_WAIT_S)
        return 2
    return CheckedFlags(job=job, notes=tuple(notes))
