"""The superseded runs of ``benchmarks/results/history/``: one JSON file per benchmark,
``{"benchmark", "about", "runs": [{"file", "command", "date", "commit", "pooled"?,
"record"}]}``, each run a result file that once lay in ``benchmarks/results/`` under
its ``file`` name (its ``record``, unchanged). Log files are kept the same way:
``{"about", "added", "logs": {old path: text}}``.

``runs(paths)`` reads result files and history files alike, for the scripts that pool
several runs (``bench_runtime.py --pool``)."""

from __future__ import annotations

import json
import os

__all__ = ["is_history", "runs"]


def is_history(doc) -> bool:
    """Whether a loaded JSON document is a history file of runs."""
    return isinstance(doc, dict) and isinstance(doc.get("runs"), list) and \
        all(isinstance(run, dict) and "record" in run for run in doc["runs"])


def runs(paths: list[str], *, pooled_only: bool = True) -> list[tuple[str, dict]]:
    """(name, record) of every run in ``paths``: a result file is one run, named by its
    file name; a history file gives its runs (with ``pooled_only``, those marked
    ``"pooled": true``), named by their former file names."""
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
        if is_history(doc):
            out += [(run["file"], run["record"]) for run in doc["runs"]
                    if run.get("pooled") or not pooled_only]
        else:
            out.append((os.path.basename(path), doc))
    return out
