"""Issue 32's long document at the issue's length: ``pretrain_gpt.py``'s entry point at
cp=1 x pp=2 and cp=2 x pp=2 (tiny model, fp32, gloo on this CPU) on one document of
``--length`` tokens per sample (default 16384). Writes the logged losses, their largest
relative difference, each run's counted peak activations (``--log-activation-memory``)
and their ratio. The CI test (tests/e2e/training/test_context_parallel_training.py) runs
the same function (odc_pp.testing.long_document) at 4096 tokens.

    python benchmarks/bench_cp_long_document.py [--length 16384] --json PATH
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from odc_pp.testing.long_document import long_document_runs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", required=True, help="output path")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = long_document_runs(args.length, tmp, timeout=args.timeout)
    cp1, cp2 = runs["cp1"], runs["cp2"]
    difference = max(abs(a - b) / abs(b) for a, b in zip(cp2["losses"], cp1["losses"]))
    result = {"length": args.length, "runs": runs,
              "max_relative_loss_difference": difference,
              "activation_ratio": cp2["peak_activation_mb"] / cp1["peak_activation_mb"],
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_average": os.getloadavg()}}
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))
    return 0 if difference <= 1e-6 and result["activation_ratio"] <= 0.55 else 1


if __name__ == "__main__":
    raise SystemExit(main())
