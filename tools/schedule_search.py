#!/usr/bin/env python3
"""Thin wrapper: ``python tools/schedule_search.py --pp 8 --microbatches 32 ...`` runs
``odc-pp schedule`` (see ``odc_pp.schedule.cli``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from odc_pp.schedule.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
