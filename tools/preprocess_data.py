#!/usr/bin/env python3
"""Megatron-LM's tools/preprocess_data.py: tokenize JSONL into Megatron indexed datasets,
the same flags and byte for byte the same files (``odc_pp/data/preprocess.py``).

    python tools/preprocess_data.py --input data.jsonl --output-prefix data/my \
        --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt \
        --append-eod --workers 4 [--json-keys text]
then train with ``--data-path data/my_text_document``.
"""

import sys

from odc_pp.data.preprocess import main

if __name__ == "__main__":
    sys.exit(main())
