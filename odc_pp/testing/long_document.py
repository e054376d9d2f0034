"""Issue 32's long-document check, shared by its test (4096 tokens, in CI) and its
benchmark (16K, ``benchmarks/bench_cp_long_document.py``): ``pretrain_gpt.py``'s entry
point at cp=1 x pp=2 and cp=2 x pp=2 on one document of ``length`` tokens per sample (a
pre-tokenized JSONL file, tiny model, fp32, gloo), with each rank's counted peak
activations (``--log-activation-memory``)."""

from __future__ import annotations

import json
import pathlib
import time

import numpy as np

from .torchrun import TINY_MODEL, launch

__all__ = ["long_document_runs"]


def long_document_runs(length: int, tmp_path, *, iters: int = 2,
                       timeout: float = 300) -> dict:
    """``{"cp1": {...}, "cp2": {...}}``, each with the logged ``losses``, the last
    record's ``peak_activation_mb`` and the ``seconds`` the launch took; raises
    RuntimeError (with the run's log) when a launch fails."""
    tmp_path = pathlib.Path(tmp_path)
    rows = tmp_path / "rows.jsonl"
    generator = np.random.default_rng(0)
    with open(rows, "w", encoding="utf-8") as handle:
        for _ in range(8):
            ids = generator.integers(1, 300, length + 1).tolist()
            handle.write(json.dumps({"input_ids": ids}) + "\n")
    flags = list(TINY_MODEL)
    for name, value in (("--seq-length", str(length)), ("--global-batch-size", "2"),
                        ("--vocab-size", "320")):
        flags[flags.index(name) + 1] = value
    flags.remove("--mock-data")
    flags += ["--data-path", str(rows), "--tokenizer-type", "ByteLevelTokenizer",
              "--max-position-embeddings", str(length), "--train-iters", str(iters),
              "--attention-backend", "sdpa", "--log-activation-memory",
              "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]
    out = {}
    for name, nproc, extra in (("cp1", 2, []), ("cp2", 4, ["--context-parallel-size", "2"])):
        start = time.monotonic()
        run = launch(flags + extra, nproc=nproc, tmp_path=tmp_path, name=name,
                     timeout=timeout)
        if run.returncode != 0:
            raise RuntimeError(f"{name}: {run.describe()}")
        out[name] = {"losses": run.losses(), "seconds": time.monotonic() - start,
                     "peak_activation_mb": run.records()[-1]["peak_activation_mb"],
                     "nproc": nproc}
    return out
