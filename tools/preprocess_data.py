#!/usr/bin/env python3
"""Tokenize JSONL ({"text": ...} or {"messages": [...]}) into a Megatron indexed dataset.

    python tools/preprocess_data.py --input data.jsonl --output-prefix data/my_text \
        --tokenizer-type ByteLevelTokenizer
then train with ``--data-path data/my_text``.
"""

import sys

from odc_pp.data.preprocess import main

if __name__ == "__main__":
    sys.exit(main())
