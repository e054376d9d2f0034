"""The iteration a resumed run continues from: the one the checkpoint records, never a name.

An odc-pp checkpoint states its iteration in up to five places: the directory's name
(``iter_0000010``), the name of the directory a symlinked name resolves to, ``latest``
(for the checkpoint it names), ``meta.json`` and every rank file (``"iteration"``). A
renamed, copied or symlinked directory makes them disagree, and resuming at the name would
continue the learning-rate schedule and the data order from the wrong iteration with the
state of another one. So every statement present must agree, or the run stops
(:class:`IterationMismatchError`, a ValueError: exit status 2) naming each value and where
it was read; ``--override-resume-iteration N`` resumes at N deliberately (the checks are then
skipped and the recorded iteration is only reported).
"""

from __future__ import annotations

import os
import re

from .checkpointing import LATEST

__all__ = ["OVERRIDE_FLAG", "IterationMismatchError", "recorded_iteration",
           "check_rank_iteration"]

OVERRIDE_FLAG = "--override-resume-iteration"
"""The flag that resumes at a chosen iteration whatever the checkpoint records."""
_ITER = re.compile(r"^iter_(\d{7,})$")
_FIX = (f"resume from the checkpoint under its own name (rename it back and write that "
        f"iteration into {LATEST}), or pass {OVERRIDE_FLAG} N to resume at iteration N "
        f"deliberately")


class IterationMismatchError(ValueError):
    """A checkpoint states different iterations in different places (the message names
    every value and the path it was read from)."""


def _statements(directory: str, meta: dict) -> list[tuple[str, int]]:
    """(where, iteration) for the name, a symlink's target, ``latest`` and meta.json."""
    directory = os.path.normpath(directory)
    load, name = os.path.split(directory)
    found = []
    match = _ITER.match(name)
    if match:
        found.append((f"the directory name {directory}", int(match.group(1))))
    real = os.path.realpath(directory)
    if real != os.path.join(os.path.realpath(load or "."), name):
        target = _ITER.match(os.path.basename(real))
        if target:
            found.append((f"the symlink target {real}", int(target.group(1))))
    latest = os.path.join(load, LATEST)
    try:
        with open(latest) as handle:
            text = handle.read().strip()
    except OSError:
        text = ""
    if match and text.isdigit() and int(text) == int(match.group(1)):
        found.append((latest, int(text)))
    if "iteration" in meta:
        found.append((os.path.join(directory, "meta.json"), int(meta["iteration"])))
    return found


def recorded_iteration(directory: str, meta: dict) -> int:
    """The iteration the checkpoint ``directory`` (an ``iter_*`` path under ``--load``,
    possibly a symlink) records in ``meta`` (its meta.json), after checking that its name,
    the name it resolves to and ``latest`` (when it names this checkpoint) agree;
    :class:`IterationMismatchError` otherwise."""
    statements = _statements(directory, meta)
    if not statements:
        raise IterationMismatchError(f"checkpoint {directory} records no iteration (no "
                                     f"'iteration' in its meta.json, no iter_* name); pass "
                                     f"{OVERRIDE_FLAG} N to resume it at iteration N")
    if len({value for _, value in statements}) > 1:
        said = "; ".join(f"{where} says {value}" for where, value in statements)
        raise IterationMismatchError(f"checkpoint {directory} states different iterations "
                                     f"({said}): it was renamed, copied or symlinked, and "
                                     f"resuming would continue the learning-rate schedule "
                                     f"and the data order from the wrong iteration; {_FIX}")
    return statements[-1][1]


def check_rank_iteration(state: dict, path: str, iteration: int | None) -> None:
    """A rank file's state (read from ``path``) records ``iteration`` when it records one
    (None: nothing to compare, e.g. under ``--override-resume-iteration``);
    :class:`IterationMismatchError` naming both values otherwise."""
    if iteration is None or "iteration" not in state:
        return
    if int(state["iteration"]) != iteration:
        meta = os.path.join(os.path.dirname(path), "meta.json")
        raise IterationMismatchError(f"checkpoint file {path} records iteration "
                                     f"{int(state['iteration'])}, but {meta} records "
                                     f"{iteration}: the rank files come from another "
                                     f"checkpoint; {_FIX}")
