"""Per-iteration data plan: which samples each data-parallel replica runs, in which
microbatches, and the token count of the whole global batch (the loss normalizer).

Every rank computes the same plan from (iteration, seed) alone, so no data is
broadcast and a resumed run replays exactly the batches of an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass

from odc_pp.data import (AttentionCost, IndexedTokenDataset, JsonlDataset, Microbatch,
                         ShuffledSource, SyntheticCorpus, build_tokenizer, collate,
                         global_batch_indices, pack, plan_minibatch)
from odc_pp.schedule.costs import transformer_layer_flops

from .arguments import ModelArgs, TrainingArgs

__all__ = ["IterationPlan", "DataPlanner", "build_source", "model_vocab_size",
           "padded_vocab_size",
           "sample_cost_model"]


@dataclass
class IterationPlan:
    replicas: list[list[list[int]]]
    """[dp rank][microbatch] -> global sample ids."""
    total_loss_tokens: float
    """Scored tokens of the whole global batch (every replica's)."""
    total_tokens: int
    """Input positions of the whole global batch (padding excluded)."""

    @property
    def max_microbatches(self) -> int:
        return max(len(r) for r in self.replicas)


def padded_vocab_size(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def build_source(args: TrainingArgs) -> tuple[ShuffledSource, int]:
    """(sample source, model vocabulary size) for the data flags."""
    if args.data.mock_data:
        corpus = SyntheticCorpus(vocab_size=args.model.vocab_size, seq_length=args.model.seq_length,
                                 seed=args.run.seed)
        return ShuffledSource(corpus, seed=args.run.seed), args.model.vocab_size
    tokenizer = build_tokenizer(args.data.tokenizer_type, args.data.tokenizer_model)
    jsonl = [p for p in args.data.data_path if p.endswith((".jsonl", ".json"))]
    if jsonl and len(jsonl) != len(args.data.data_path):
        raise ValueError("--data-path mixes JSONL files and indexed-dataset prefixes; "
                         "preprocess the JSONL with tools/preprocess_data.py")
    vocab = model_vocab_size(args, tokenizer)
    if jsonl:  # pre-tokenized ids are bounded by the model's embedding, not the tokenizer
        dataset = JsonlDataset(jsonl, tokenizer, args.model.seq_length, vocab_size=vocab)
    else:
        dataset = IndexedTokenDataset(args.data.data_path, args.model.seq_length, tokenizer.pad)
    return ShuffledSource(dataset, seed=args.run.seed), vocab


def model_vocab_size(args: TrainingArgs, tokenizer) -> int:
    """The model's embedding rows: --hf-checkpoint's vocab_size or --vocab-size when given
    (it must hold the tokenizer's ids), else the tokenizer's vocabulary padded to
    --make-vocab-size-divisible-by x tp (Megatron's rule)."""
    given = args.model.vocab_size
    if given is None:
        return padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by *
                                 args.parallel.tensor_model_parallel_size)
    source = (f"the vocab_size {given} of --hf-checkpoint {args.model.hf_checkpoint}"
              if args.model.hf_checkpoint else f"--vocab-size {given}")
    if tokenizer.vocab_size > given:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, more than {source}; "
                         f"use the model's tokenizer (--tokenizer-model) or a larger vocabulary")
    return given


def sample_cost_model(model: ModelArgs) -> AttentionCost:
    """A sample's training cost ``s + q s^2`` from the project's FLOPs formula
    (:func:`~odc_pp.schedule.costs.transformer_layer_flops`: F + B + W of one layer)."""
    def flops(seq: int) -> float:
        return sum(transformer_layer_flops(1, seq, model.hidden_size, model.ffn_hidden_size))

    quadratic = (flops(2) - 2 * flops(1)) / 2  # flops(s) = linear s + quadratic s^2
    return AttentionCost(quadratic_coef=quadratic / (flops(1) - quadratic))


class DataPlanner:
    """Global batch -> per-replica microbatches: the frontend's flags mapped onto
    :func:`odc_pp.data.plan_minibatch` (``--load-balance`` none, lb-mini or balanced;
    ``--pack-sequences``: one packed row per microbatch, planned with
    :func:`sample_cost_model`)."""

    def __init__(self, args: TrainingArgs, source: ShuffledSource, *, dp: int, pp: int) -> None:
        self.args = args
        self.source = source
        self.dp = dp
        self.pp = pp
        self.token_cap = args.data.max_tokens_per_microbatch or args.data.micro_batch_size * args.model.seq_length
        self.packed = args.data.pack_sequences
        # sequence parallelism splits every microbatch's sequence over the tp ranks
        self.multiple = args.parallel.tensor_model_parallel_size \
            if args.parallel.sequence_parallel else 1
        self.cost_model = sample_cost_model(args.model) if self.packed else None

    def plan(self, iteration: int) -> IterationPlan:
        sample_ids = global_batch_indices(iteration, self.args.data.global_batch_size)
        lengths = [self.source.length(i) for i in sample_ids]
        by_count = None if self.args.data.max_tokens_per_microbatch else self.args.data.micro_batch_size
        plan = plan_minibatch(lengths, self.dp, max_tokens=self.token_cap,
                              mode=self.args.data.load_balance, samples_per_microbatch=by_count,
                              min_microbatches=self.pp, packed=self.packed,
                              cost_model=self.cost_model)
        replicas = [[[sample_ids[p] for p in group] for group in replica]
                    for replica in plan.microbatches]
        samples = [self.source[i] for i in sample_ids]
        return IterationPlan(replicas=replicas,
                             total_loss_tokens=float(sum(s.num_loss_tokens for s in samples)),
                             total_tokens=int(sum(lengths)))

    def microbatches(self, groups: list[list[int]]) -> list[Microbatch]:
        if self.packed:
            return [pack([self.source[i] for i in group], pad_id=self.source.pad_id,
                         multiple=self.multiple) for group in groups]
        return [collate([self.source[i] for i in group], pad_id=self.source.pad_id,
                        multiple=self.multiple) for group in groups]
