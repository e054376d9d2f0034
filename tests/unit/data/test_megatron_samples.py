"""Megatron's sample construction (--sample-construction megatron, the default for
indexed data): every global batch holds the tokens, loss mask, positions and attention
of megatron-core's own ``GPTDataset`` on the same .bin/.idx, seed and split (built by
``BlendedMegatronDatasetBuilder``, the reference), the EOD flags included; --mock-data
under it gives full --seq-length samples; the post-training path keeps one document per
sample and the log's first lines say which construction is in use."""

import json

import numpy as np
import pytest
import torch

from odc_pp.data.preprocess import preprocess_jsonl
from odc_pp.training.arguments import parse_args_with_notes
from odc_pp.training.data_plan import (BatchAssigner, build_source, build_valid_source,
                                       megatron_num_samples)

SEQ, GBS, ITERS, SEED, SPLIT = 32, 4, 80, 7, "90,10,0"


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """60 byte-level documents of 3-150 characters (each + EOD 256), as
    tools/preprocess_data.py writes them."""
    root = tmp_path_factory.mktemp("indexed")
    rng = np.random.default_rng(0)
    with open(root / "docs.jsonl", "w") as handle:
        for _ in range(60):
            text = "".join(chr(97 + int(c)) for c in rng.integers(0, 26, int(rng.integers(3, 150))))
            handle.write(json.dumps({"text": text}) + "\n")
    preprocess_jsonl([str(root / "docs.jsonl")], str(root / "docs"),
                     tokenizer_type="ByteLevelTokenizer")
    return str(root / "docs")


def _args(*flags):
    args, notes = parse_args_with_notes(list(flags))
    return args.resolve(2).args, notes


class _ByteTokenizer:
    """The special tokens of odc-pp's ByteLevelTokenizer, as megatron-core reads them."""
    vocab_size, eod, pad = 258, 256, 257
    unique_identifiers = {"class": "ByteLevelTokenizer"}


def _megatron(prefix, tmp_path, args, **eod_flags):
    """megatron-core's train and valid GPTDatasets for ``args`` (sizes as Megatron's
    training loop asks them)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import \
        BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    flags = dict(reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
    flags.update(eod_flags)
    config = GPTDatasetConfig(random_seed=SEED, sequence_length=SEQ, blend=([prefix], None),
                              split=SPLIT, path_to_cache=str(tmp_path / "cache"),
                              tokenizer=_ByteTokenizer(), **flags)
    sizes = [megatron_num_samples(args, 0), megatron_num_samples(args, 1), 0]
    train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True,
                                                    config).build()
    return train, valid


def _check_batches(planner, reference, iterations, *, attention=False):
    """Every global batch of ``planner`` holds ``reference``'s samples k*GBS..(k+1)*GBS-1:
    the same tokens, labels, loss mask and positions (and attention), and the same
    token counts per step."""
    for iteration in range(iterations):
        plan = planner.plan(iteration)
        ids = sorted(i for replica in plan.replicas for group in replica for i in group)
        assert ids == list(range(iteration * GBS, (iteration + 1) * GBS))
        expected = [reference[i] for i in ids]
        assert plan.total_tokens == sum(e["tokens"].numel() for e in expected) == GBS * SEQ
        assert plan.total_loss_tokens == sum(float(e["loss_mask"].sum()) for e in expected)
        for replica in plan.replicas:
            for group, mb in zip(replica, planner.microbatches(replica)):
                for row, sample_id in enumerate(group):
                    ref = reference[sample_id]
                    assert torch.equal(mb.tokens[row], ref["tokens"])
                    assert torch.equal(mb.labels[row], ref["labels"])
                    assert torch.equal(mb.loss_mask[row], ref["loss_mask"])
                    positions = mb.position_ids[row] if mb.position_ids is not None \
                        else torch.arange(SEQ)
                    assert torch.equal(positions, ref["position_ids"])
                    if attention:
                        seg = mb.segment_ids[row]
                        allowed = (seg[:, None] == seg[None, :]) & \
                            torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
                        assert torch.equal(allowed, ~ref["attention_mask"][0])


def test_tokens_per_step_equal_megatron_gpt_dataset(prefix, tmp_path):
    args, notes = _args("--data-path", prefix, "--seq-length", str(SEQ), "--global-batch-size",
                        str(GBS), "--train-iters", str(ITERS), "--seed", str(SEED),
                        "--split", SPLIT, "--eval-iters", "2", "--eval-interval", "10")
    assert any("Megatron's construction" in n for n in notes), notes
    train, valid = _megatron(prefix, tmp_path, args)
    source, _ = build_source(args)
    # more samples than one epoch: the run re-reads documents in Megatron's epoch order
    assert len(train) == len(source.dataset) >= ITERS * GBS
    assert len(source.dataset.indices.document_index) == 3 * 54  # 3 epochs of 90% of 60
    _check_batches(BatchAssigner(args, source, dp=2, pp=1), train, ITERS)
    valid_source = build_valid_source(args)
    assert len(valid_source.dataset) == len(valid)
    _check_batches(BatchAssigner(args, valid_source, dp=2, pp=1), valid, len(valid) // GBS)


def test_eod_flags_equal_megatron(prefix, tmp_path):
    args, notes = _args("--data-path", prefix, "--seq-length", str(SEQ), "--global-batch-size",
                        str(GBS), "--train-iters", "6", "--seed", str(SEED), "--split", SPLIT,
                        "--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss")
    assert any("--reset-position-ids, --reset-attention-mask, --eod-mask-loss" in n
               for n in notes), notes
    train, _ = _megatron(prefix, tmp_path, args, reset_position_ids=True,
                         reset_attention_mask=True, eod_mask_loss=True)
    planner = BatchAssigner(args, build_source(args)[0], dp=2, pp=1)
    # the flags matter on these samples: some inputs are EODs
    assert any(float(train[i]["loss_mask"].sum()) < SEQ for i in range(6 * GBS))
    _check_batches(planner, train, 6, attention=True)


def test_mock_data_megatron_gives_full_samples():
    common = ("--mock-data", "--vocab-size", "64", "--seq-length", "128",
              "--global-batch-size", "8", "--train-iters", "4")
    megatron, notes = _args(*common, "--sample-construction", "megatron")
    assert any("Megatron's construction" in n and "--mock-data" in n for n in notes)
    long_tailed, notes = _args(*common)
    assert any("one document per sample" in n and "--mock-data" in n for n in notes)
    full = BatchAssigner(megatron, build_source(megatron)[0], dp=2, pp=1).plan(0)
    tail = BatchAssigner(long_tailed, build_source(long_tailed)[0], dp=2, pp=1).plan(0)
    assert full.total_tokens == 8 * 128 and full.total_loss_tokens == 8 * 128
    assert tail.total_tokens < 0.7 * full.total_tokens
    sample = build_source(megatron)[0][0]
    assert len(sample.tokens) == 129 and (sample.tokens == 0).any()  # documents + EOD 0


def test_construction_defaults_and_the_post_training_path(prefix, tmp_path):
    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text(json.dumps({"text": "hello world"}) + "\n")
    cases = {("--data-path", prefix): "Megatron's construction",
             ("--data-path", str(jsonl)): "one document per sample",
             ("--data-path", prefix, "--load-balance", "lb-mini"): "packed rows",
             ("--data-path", prefix, "--sample-construction", "document"):
                 "--sample-construction document"}
    for flags, said in cases.items():
        _, notes = _args(*flags, "--seq-length", str(SEQ), "--global-batch-size", str(GBS))
        assert any(said in n for n in notes), (flags, notes)
    args, _ = _args("--data-path", prefix, "--seq-length", "512", "--global-batch-size", "4",
                    "--sample-construction", "document")
    source, _ = build_source(args)
    lengths = [source.length(i) for i in range(4)]
    assert all(length < 512 for length in lengths)  # one document each, not concatenated
    for flags, named in (((("--pack-sequences",)), "--pack-sequences"),
                         (("--load-balance", "lb-mini"), "--load-balance lb-mini")):
        with pytest.raises(ValueError, match=named):
            _args("--data-path", prefix, "--sample-construction", "megatron", *flags)
    with pytest.raises(ValueError, match="is JSONL"):
        _args("--data-path", str(jsonl), "--sample-construction", "megatron")
