"""The ``odc-pp`` console script: ``odc-pp schedule ...``, ``odc-pp tune-offload ...``,
``odc-pp plan ...``, ``odc-pp memory ...`` (the memory dry run, odc_pp.training.dry_run)."""

from __future__ import annotations

import importlib
import sys

__all__ = ["main"]

# subcommand -> module whose ``main(argv)`` runs it (imported lazily: keeps start-up fast)
SUBCOMMANDS = {
    "schedule": "odc_pp.schedule.cli",
    "tune-offload": "odc_pp.training.tune_offload_command",
    "plan": "odc_pp.plan_command",
    "memory": "odc_pp.training.dry_run",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        names = ", ".join(SUBCOMMANDS)
        print(f"usage: odc-pp {{{names}}} [options]   (odc-pp SUBCOMMAND --help)",
              file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    from odc_pp.training.third_party_warnings import install_warning_filter

    install_warning_filter()  # megatron-core's import warnings: one line per kind
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
