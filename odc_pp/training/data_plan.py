"""Per-iteration data plan: which samples each data-parallel replica runs, in which
microbatches, and the token count of the whole global batch (the loss normalizer).

Every rank computes the same plan from (iteration, seed) alone, so no data is
broadcast and a resumed run replays exactly the batches of an uninterrupted one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from odc_pp.data import (AttentionCost, FittedCost, SampleCostModel, IndexedTokenDataset, JsonlDataset, Microbatch,
                         ShuffledSource, SyntheticCorpus, build_tokenizer, collate,
                         global_batch_indices, pack, plan_minibatch)
from odc_pp.schedule.costs import transformer_layer_flops

from .arguments import ModelArgs, TrainingArgs

__all__ = ["IterationPlan", "DataPlanner", "build_source", "padded_vocab_size",
           "sample_cost_model", "load_sample_cost_model", "packs_sequences"]


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
    if jsonl:
        dataset = JsonlDataset(jsonl, tokenizer, args.model.seq_length)
    else:
        dataset = IndexedTokenDataset(args.data.data_path, args.model.seq_length, tokenizer.pad)
    # Megatron's rule: the vocabulary splits evenly over the tensor-parallel ranks
    vocab = padded_vocab_size(tokenizer.vocab_size, args.model.make_vocab_size_divisible_by *
                              args.parallel.tensor_model_parallel_size)
    if args.model.hf_checkpoint:  # the model's vocabulary is the checkpoint's
        if tokenizer.vocab_size > args.model.vocab_size:
            raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, more than the "
                             f"vocab_size {args.model.vocab_size} of --hf-checkpoint "
                             f"{args.model.hf_checkpoint}; use the checkpoint's tokenizer")
        vocab = args.model.vocab_size
    return ShuffledSource(dataset, seed=args.run.seed), vocab


def sample_cost_model(model: ModelArgs) -> AttentionCost:
    """A sample's training cost ``s + q s^2`` from the project's FLOPs formula
    (:func:`~odc_pp.schedule.costs.transformer_layer_flops`: F + B + W of one layer)."""
    def flops(seq: int) -> float:
        return sum(transformer_layer_flops(1, seq, model.hidden_size, model.ffn_hidden_size))

    quadratic = (flops(2) - 2 * flops(1)) / 2  # flops(s) = linear s + quadratic s^2
    return AttentionCost(quadratic_coef=quadratic / (flops(1) - quadratic))


def load_sample_cost_model(path: str) -> FittedCost:
    """The measured per-token costs of ``--sample-cost-model FILE`` ({"a", "b"[, "c"]})."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return FittedCost(a=float(data["a"]), b=float(data["b"]), c=float(data.get("c", 0.0)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--sample-cost-model {path}: cannot read a cost model "
                         f'{{"a": seconds/token^2, "b": seconds/token}} ({exc})') from exc


def packs_sequences(args: TrainingArgs) -> bool:
    """Whether microbatches are packed rows: --pack-sequences, or lb-mini's default."""
    return args.data.pack_sequences or (args.data.load_balance == "lb-mini"
                                        and not args.data.no_pack_sequences)


class DataPlanner:
    """Global batch -> per-replica microbatches: the frontend's flags mapped onto
    :func:`odc_pp.data.plan_minibatch` (``--load-balance`` none, lb-mini or balanced;
    ``--pack-sequences``, lb-mini's default: one packed row per microbatch). Every mode
    weighs samples and microbatches with one :class:`SampleCostModel`: the measured
    ``--sample-cost-model`` file, else :func:`sample_cost_model`'s FLOPs formula."""

    def __init__(self, args: TrainingArgs, source: ShuffledSource, *, dp: int, pp: int,
                 segment_attention: bool = False) -> None:
        self.args = args
        self.source = source
        self.dp = dp
        self.pp = pp
        self.token_cap = args.data.max_tokens_per_microbatch or args.data.micro_batch_size * args.model.seq_length
        self.packed = packs_sequences(args)
        # packed rows attend per document with the varlen / flex kernels (CUDA, not
        # --packed-attention dense); the dense kernel attends over the whole row
        self.segment_attention = segment_attention and args.model.packed_attention != "dense"
        # sequence parallelism splits every microbatch's sequence over the tp ranks
        self.multiple = args.parallel.tensor_model_parallel_size \
            if args.parallel.sequence_parallel else 1
        self.cost_model: SampleCostModel = (
            load_sample_cost_model(args.data.sample_cost_model) if args.data.sample_cost_model
            else sample_cost_model(args.model))

    def plan(self, iteration: int) -> IterationPlan:
        sample_ids = global_batch_indices(iteration, self.args.data.global_batch_size)
        lengths = [self.source.length(i) for i in sample_ids]
        by_count = None if self.args.data.max_tokens_per_microbatch else self.args.data.micro_batch_size
        plan = plan_minibatch(lengths, self.dp, max_tokens=self.token_cap,
                              mode=self.args.data.load_balance, samples_per_microbatch=by_count,
                              min_microbatches=self.pp, packed=self.packed,
                              segment_attention=self.segment_attention,
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
