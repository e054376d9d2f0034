"""Training data: tokenizers, JSONL / indexed / synthetic sample sources, microbatching."""

from .datasets import (IndexedTokenDataset, JsonlDataset, ShuffledSource, SyntheticCorpus,
                       encode_document, load_jsonl_documents)
from .samples import (Microbatch, Sample, collate, global_batch_indices, split_by_tokens,
                      split_fixed)
from .tokenizers import (TOKENIZER_TYPES, ByteLevelTokenizer, HuggingFaceTokenizer,
                         build_tokenizer)

__all__ = ["ByteLevelTokenizer", "HuggingFaceTokenizer", "IndexedTokenDataset", "JsonlDataset",
           "Microbatch", "Sample", "ShuffledSource", "SyntheticCorpus", "TOKENIZER_TYPES",
           "build_tokenizer", "collate", "encode_document", "global_batch_indices",
           "load_jsonl_documents", "split_by_tokens", "split_fixed"]
