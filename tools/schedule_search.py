#!/usr/bin/env python3
"""Thin wrapper: ``python tools/schedule_search.py --pp 8 --microbatches 32 ...`` runs
``odc-pp schedule`` (see ``odc_pp.schedule.cli``)."""

import sys

from odc_pp.schedule.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
