"""Per-iteration data plan: which samples each data-parallel replica runs, in which
microbatches, and the token count of the whole global batch (the loss normalizer).

Every rank computes the same plan from (iteration, seed) and the data position
(:class:`~odc_pp.training.data_position.DataPosition`: the samples consumed before the
iteration) alone, so no data is broadcast and a resumed run replays exactly the batches of
an uninterrupted one.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

from odc_pp.data import (AttentionCost, FittedCost, SampleCostModel, IndexedTokenDataset, JsonlDataset, Microbatch,
                         ShuffledSource, SyntheticCorpus, build_tokenizer, collate,
                         global_batch_indices, pack, plan_minibatch)
from odc_pp.data.blending import BlendedSource, parse_blend
from odc_pp.data.lanes import Slot, lane_slots
from odc_pp.data.samples import empty_row
from odc_pp.data.concatenated import ConcatenatedSamples, EodHandling, SyntheticDocuments
from odc_pp.data.splits import DocumentRange, split_bounds
from odc_pp.data.tokenizer_identity import describe_tokenizer, tokenizer_mismatches
from .throughput import ModelShape

from .arguments import ModelArgs, TrainingArgs
from .context_split import cp_pad_multiple, split_microbatch
from .data_position import DataPosition
from .sample_construction import sample_construction

__all__ = ["IterationPlan", "BatchAssigner", "build_source", "build_valid_source",
           "model_vocab_size", "padded_vocab_size", "sample_cost_model",
           "load_sample_cost_model", "packs_sequences", "megatron_num_samples",
           "data_tokenizer", "tokenizer_log_line"]


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


def data_tokenizer(args: TrainingArgs):
    """The tokenizer of the data flags (--tokenizer-type, --tokenizer-model,
    --vocab-file / --merge-file)."""
    return _tokenizer(args.data.tokenizer_type, args.data.tokenizer_model,
                      args.data.vocab_file, args.data.merge_file)


@functools.lru_cache(maxsize=4)
def _tokenizer(kind: str, model: str | None, vocab_file: str | None, merge_file: str | None):
    """Built once per flags (the train and valid data and the log line share it)."""
    return build_tokenizer(kind, model, vocab_file=vocab_file, merge_file=merge_file)


def megatron_num_samples(args: TrainingArgs, part: int) -> int | None:
    """The samples Megatron asks its train (``part`` 0) or valid (1) dataset for:
    --train-iters x global batch; (train iters // --eval-interval + 1) x --eval-iters x
    global batch. None while the global batch is not known (one epoch)."""
    iters, batch = args.run.train_iters, args.data.global_batch_size
    if iters is None or batch is None:
        return None
    if part == 0:
        return iters * batch
    return (iters // args.data.eval_interval + 1) * args.data.eval_iters * batch


def _eod_handling(args: TrainingArgs, eod: int) -> EodHandling:
    return EodHandling(eod=eod, reset_position_ids=args.data.reset_position_ids,
                       reset_attention_mask=args.data.reset_attention_mask,
                       eod_mask_loss=args.data.eod_mask_loss)


def _mock_source(args: TrainingArgs, part: int) -> ShuffledSource:
    """--mock-data: the synthetic corpus, one document per sample, or under
    --sample-construction megatron its documents concatenated into full samples."""
    seed = args.run.seed + part
    corpus = SyntheticCorpus(vocab_size=args.model.vocab_size,
                             seq_length=args.model.seq_length, seed=seed)
    if sample_construction(args.data) != "megatron":
        return ShuffledSource(corpus, seed=seed)
    wanted = megatron_num_samples(args, part) or 1000
    table = SyntheticDocuments(corpus, (wanted + 1) * args.model.seq_length + 1)
    samples = ConcatenatedSamples(table, np.arange(len(table)), seq_length=args.model.seq_length,
                                  num_samples=wanted, seed=seed,
                                  eod=_eod_handling(args, 0), pad_id=0)
    return ShuffledSource(samples, seed=seed, shuffle=False)


def build_source(args: TrainingArgs) -> tuple[ShuffledSource, int]:
    """(sample source, model vocabulary size) for the data flags (with --split: its
    train part)."""
    if args.data.mock_data:
        return _mock_source(args, 0), args.model.vocab_size
    tokenizer = data_tokenizer(args)
    vocab = model_vocab_size(args, tokenizer)
    source = _source(args, args.data.data_path, tokenizer, "--data-path", part=0, vocab=vocab)
    return source, vocab


def build_valid_source(args: TrainingArgs) -> ShuffledSource | None:
    """The validation samples: --valid-data-path, the valid part of --split, or for
    --mock-data a second synthetic stream; None when there are none (or --eval-iters 0)."""
    if args.data.eval_iters == 0:
        return None
    if args.data.mock_data:
        return _mock_source(args, 1)
    if not args.data.valid_data_path and args.data.split is None:
        return None
    tokenizer = data_tokenizer(args)
    vocab = model_vocab_size(args, tokenizer)
    if args.data.valid_data_path:
        return _source(args, args.data.valid_data_path, tokenizer, "--valid-data-path",
                       vocab=vocab)
    return _source(args, args.data.data_path, tokenizer, "--data-path", part=1, vocab=vocab)


def _source(args: TrainingArgs, items: list[str], tokenizer, flag: str,
            part: int | None = None, vocab: int | None = None):
    """The shuffled source of ``items`` (paths, or Megatron's blend ``W1 P1 W2 P2``:
    each dataset shuffled on its own, then blended); ``part``: with --split, that part
    (0 train, 1 valid) of each dataset's documents; None when the part is empty.
    ``vocab``: the model's embedding rows, which bound pre-tokenized ids."""
    blend = parse_blend(items)
    weights, paths = blend if blend else ([1.0], [items])
    sources = []
    for index, path in enumerate(paths):
        dataset = _documents(args, [path] if blend else path, tokenizer, flag, vocab)
        if sample_construction(args.data) == "megatron":
            samples = _concatenated(args, dataset, tokenizer, part,
                                    valid=flag == "--valid-data-path")
            if samples is None:
                return None
            sources.append(ShuffledSource(samples, seed=args.run.seed, shuffle=False))
            continue
        if part is not None and args.data.split is not None:
            documents = split_bounds(args.data.split, len(dataset))[part]
            if len(documents) == 0 and part > 0:
                return None
            dataset = DocumentRange(dataset, documents, name=("train", "valid")[part])
        sources.append(ShuffledSource(dataset, seed=args.run.seed + index))
    return BlendedSource(sources, weights) if blend else sources[0]


def _concatenated(args: TrainingArgs, dataset, tokenizer, part: int | None, *,
                  valid: bool = False) -> ConcatenatedSamples | None:
    """Megatron's samples of an indexed ``dataset``: with --split, of the documents of
    its ``part`` (None when that part is empty); the samples the run consumes requested
    as Megatron requests them (:func:`megatron_num_samples`; ``valid``: validation
    data)."""
    documents = np.arange(len(dataset.sequence_lengths))
    if part is not None and args.data.split is not None:
        documents = documents[split_bounds(args.data.split, len(documents))[part]]
        if len(documents) == 0:
            if part > 0:
                return None
            raise ValueError(f"the train part of --split {args.data.split} has no documents")
    return ConcatenatedSamples(dataset, documents, seq_length=args.model.seq_length,
                               num_samples=megatron_num_samples(args, 1 if valid else part or 0),
                               seed=args.run.seed, eod=_eod_handling(args, tokenizer.eod),
                               pad_id=tokenizer.pad)


def _documents(args: TrainingArgs, paths: list[str], tokenizer, flag: str,
               vocab: int | None):
    """The JSONL or indexed dataset of ``paths`` (one kind)."""
    jsonl = [p for p in paths if p.endswith((".jsonl", ".json"))]
    if jsonl and len(jsonl) != len(paths):
        raise ValueError(f"{flag} mixes JSONL files and indexed-dataset prefixes; "
                         "preprocess the JSONL with tools/preprocess_data.py")
    if jsonl:
        # pre-tokenized ids are bounded by the model's embedding, not the tokenizer
        return JsonlDataset(jsonl, tokenizer, args.model.seq_length, vocab_size=vocab,
                            max_dropped_fraction=args.data.max_dropped_records_fraction,
                            drop_unscored=args.data.drop_unscored_samples, flag=flag)
    return IndexedTokenDataset(paths, args.model.seq_length, tokenizer.pad, vocab_size=vocab,
                               flag=flag)


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
    _check_specials(args, tokenizer, given)
    return given


def _check_specials(args: TrainingArgs, tokenizer, vocab: int) -> None:
    """ValueError when the tokenizer's special ids do not fit the model (eod / pad outside
    the embedding; eos / pad other than --hf-checkpoint's config says)."""
    from .model_setup import hf_config_of

    problems = tokenizer_mismatches(tokenizer, vocab_size=vocab,
                                    hf_config=hf_config_of(args.model))
    if problems:
        name = args.data.tokenizer_model or args.data.tokenizer_type
        model = f"--hf-checkpoint {args.model.hf_checkpoint}" if args.model.hf_checkpoint \
            else f"the model (--vocab-size {vocab})"
        raise ValueError(f"the tokenizer {name} is not the one of {model}: "
                         f"{'; '.join(problems)}; give the model's own tokenizer "
                         f"(--tokenizer-model)")


def tokenizer_log_line(args: TrainingArgs, vocab: int) -> str:
    """The first log line of a run: the tokenizer it uses and the model's vocabulary."""
    if args.data.mock_data:
        return f"tokenizer: none (--mock-data: synthetic token ids), model vocabulary {vocab}"
    line = describe_tokenizer(args.data.tokenizer_type, args.data.tokenizer_model,
                              data_tokenizer(args), hf_checkpoint=args.model.hf_checkpoint)
    return f"{line}; model vocabulary {vocab}"


def sample_cost_model(model: ModelArgs) -> AttentionCost:
    """A sample's training cost ``s + q s^2`` from the project's FLOPs formula
    (:meth:`~odc_pp.training.throughput.ModelShape.layer_flops`: F + B + W of one layer,
    GQA and SwiGLU counted)."""
    shape = ModelShape.of(model, vocab_size=0)

    def flops(seq: int) -> float:
        return sum(shape.layer_flops(1, seq))

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


class BatchAssigner:
    """Global batch -> per-replica microbatches: the frontend's flags mapped onto
    :func:`odc_pp.data.plan_minibatch` (``--load-balance`` none, lb-mini or balanced;
    ``--pack-sequences``, lb-mini's default: one packed row per microbatch). Every mode
    weighs samples and microbatches with one :class:`SampleCostModel`: the measured
    ``--sample-cost-model`` file, else :func:`sample_cost_model`'s FLOPs formula."""

    def __init__(self, args: TrainingArgs, source: ShuffledSource, *, dp: int, pp: int,
                 segment_attention: bool = False, position: DataPosition | None = None) -> None:
        self.args = args
        self.position = position
        """Training: iteration ``i`` takes the next ``position.batch_size_of(i)`` samples
        after those consumed before it (None: global batch ``i`` of --global-batch-size,
        the validation batches)."""
        self.source = source
        self.dp = dp
        self.pp = pp
        self.token_cap = args.data.max_tokens_per_microbatch or args.data.micro_batch_size * args.model.seq_length
        self.packed = packs_sequences(args)
        # packed rows attend per document with the varlen / flex kernels (CUDA, not
        # --packed-attention dense); the dense kernel attends over the whole row
        self.segment_attention = segment_attention and args.model.packed_attention != "dense"
        # sequence parallelism splits every microbatch's sequence over the tp ranks
        # and context parallelism over 2 x cp load-balanced chunks
        self.multiple = cp_pad_multiple(
            context_parallel_size=args.parallel.context_parallel_size,
            multiple=args.parallel.tensor_model_parallel_size
            if args.parallel.sequence_parallel else 1)
        self.cost_model: SampleCostModel = (
            load_sample_cost_model(args.data.sample_cost_model) if args.data.sample_cost_model
            else sample_cost_model(args.model))

    def plan(self, iteration: int) -> IterationPlan:
        if self.position is None:
            sample_ids = global_batch_indices(iteration, self.args.data.global_batch_size)
        else:
            sample_ids = self.position.sample_ids(iteration)
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
        scored = float(sum(s.num_loss_tokens for s in samples))
        if scored == 0:  # kept unscored samples only (--drop-unscored-samples drops them)
            raise ValueError(
                f"global batch {iteration} (samples {sample_ids[0]}-{sample_ids[-1]}) has no "
                f"scored token: truncation at --seq-length {self.args.model.seq_length} cut "
                f"off every scored token of its samples (counted in the 'data:' lines at "
                f"start-up); give --drop-unscored-samples or a longer --seq-length")
        return IterationPlan(replicas=replicas, total_loss_tokens=scored,
                             total_tokens=int(sum(lengths)))

    def lane_slots(self, rows: list[list[int]], *, lanes: int) -> list[Slot]:
        """--dynamic-context-parallel: the slots (odc_pp.data.lanes) of the replica whose
        packed rows are ``rows``, over ``lanes`` context-parallel ranks."""
        return lane_slots(rows, self.source.length, lanes=lanes,
                          lane_tokens=self.token_cap // lanes)

    def lane_microbatches(self, slots: list[Slot], *, lane: int,
                          lanes: int) -> list[Microbatch]:
        """Context-parallel rank ``lane``'s microbatch of each of ``slots``: its part of a
        split row, its own lane row, or an empty row."""
        out = []
        for slot in slots:
            if slot.split:
                out.append(split_microbatch(self.microbatches([slot.groups[0]])[0],
                                            lane, lanes))
            elif slot.groups[lane]:
                out.append(self.microbatches([slot.groups[lane]])[0])
            else:
                out.append(empty_row(self.multiple, pad_id=self.source.pad_id))
        return out

    def microbatches(self, groups: list[list[int]]) -> list[Microbatch]:
        if self.packed:
            return [pack([self.source[i] for i in group], pad_id=self.source.pad_id,
                         multiple=self.multiple, sample_ids=group) for group in groups]
        return [collate([self.source[i] for i in group], pad_id=self.source.pad_id,
                        multiple=self.multiple, sample_ids=group) for group in groups]
