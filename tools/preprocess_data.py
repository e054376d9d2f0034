#!/usr/bin/env python3
"""Tokenize JSONL ({"text": ...} or {"messages": [...]}) into a Megatron indexed dataset.

    python tools/preprocess_data.py --input data.jsonl --output-prefix data/my_text \
        --tokenizer-type ByteLevelTokenizer
then train with ``--data-path data/my_text``.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from odc_pp.data.preprocess import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
