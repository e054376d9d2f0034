"""Training data: tokenizers, JSONL / indexed / synthetic sample sources, the
:class:`Microbatch` handed to the runtime, load balancing and sample assignment
(:func:`plan_minibatch`: ``none``, ``lb-mini`` and ``balanced``).

The names below are imported on first use (PEP 562): ``pretrain_gpt.py`` checks its flags
with the torch-free modules (:mod:`.assignment`'s modes, :mod:`.tokenizers`) before torch
is imported."""

import importlib

_SOURCES = {
    "datasets": ("IndexedTokenDataset", "JsonlDataset", "ShuffledSource", "SyntheticCorpus",
                 "encode_document", "encode_jsonl_file", "load_jsonl_documents"),
    "load_balance": ("AttentionCost", "FittedCost", "SampleCostModel", "TokenCost",
                     "balance_equal_counts", "balance_minibatch", "equal_count_balance",
                     "fit_cost_model", "fit_microbatch_costs", "microbatch_cost",
                     "pack_microbatches", "pack_padded", "replica_costs"),
    "microbatch": ("Microbatch", "count_tokens", "row_token_ids"),
    "assignment": ("LOAD_BALANCE_MODES", "MinibatchPlan", "plan_minibatch"),
    "samples": ("Sample", "collate", "global_batch_indices", "pack", "split_by_tokens",
                "split_fixed"),
    "tokenizers": ("TOKENIZER_TYPES", "ByteLevelTokenizer", "HuggingFaceTokenizer",
                   "build_tokenizer"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
