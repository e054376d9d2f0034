"""Training data: tokenizers, JSONL / indexed / synthetic sample sources, the
:class:`Microbatch` handed to the runtime, load balancing and sample assignment
(:func:`plan_minibatch`: ``none``, ``lb-mini`` and ``balanced``)."""

from .datasets import (IndexedTokenDataset, JsonlDataset, ShuffledSource, SyntheticCorpus,
                       encode_document, encode_jsonl_file, load_jsonl_documents)
from .load_balance import (AttentionCost, FittedCost, SampleCostModel, TokenCost,
                           balance_equal_counts, balance_minibatch, equal_count_balance,
                           fit_cost_model, fit_microbatch_costs, microbatch_cost,
                           pack_microbatches, pack_padded, replica_costs)
from .microbatch import Microbatch, count_tokens, row_token_ids
from .assignment import LOAD_BALANCE_MODES, MinibatchPlan, plan_minibatch
from .samples import (Sample, collate, global_batch_indices, pack, split_by_tokens,
                      split_fixed)
from .tokenizers import (TOKENIZER_TYPES, ByteLevelTokenizer, HuggingFaceTokenizer,
                         build_tokenizer)

__all__ = ["AttentionCost", "ByteLevelTokenizer", "FittedCost", "SampleCostModel",
           "HuggingFaceTokenizer", "IndexedTokenDataset", "JsonlDataset", "LOAD_BALANCE_MODES",
           "Microbatch", "MinibatchPlan", "Sample", "ShuffledSource", "SyntheticCorpus",
           "TOKENIZER_TYPES", "TokenCost", "balance_equal_counts", "balance_minibatch",
           "build_tokenizer", "collate", "count_tokens", "row_token_ids", "encode_document",
           "encode_jsonl_file", "equal_count_balance", "fit_cost_model", "fit_microbatch_costs",
           "microbatch_cost", "pack_padded",
           "global_batch_indices", "load_jsonl_documents", "pack", "pack_microbatches",
           "plan_minibatch", "replica_costs", "split_by_tokens", "split_fixed"]
