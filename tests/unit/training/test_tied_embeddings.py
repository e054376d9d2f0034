"""Tied embeddings by default (issue 33): Megatron ties the embedding and the output layer
unless --untie-embeddings-and-output-weights; the tied copies of a model tied across
pipeline stages are compared at every save (:meth:`TiedGradients.differing`), and
tools/export_megatron.py writes a tied model without an output layer, refusing copies
that differ."""

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from odc_pp.odc.tied import TiedGradients
from odc_pp.testing.torchrun import ROOT
from odc_pp.training.arguments import parse_args
from odc_pp.training.model_setup import model_config

sys.path.insert(0, os.path.join(ROOT, "tools"))
from export_megatron import tied_in_meta, without_tied_copy  # noqa: E402

SIZE = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
        "--seq-length", "8", "--mock-data", "--vocab-size", "32"]
OUTPUT, EMBEDDING = "model.output_layer.weight", "model.embedding.word_embeddings.weight"


def _tied(flags) -> bool:
    args = parse_args(SIZE + flags)
    return model_config(args.model, vocab_size=32, device="cpu", num_stages=2).tie_embeddings


def test_tied_unless_untied_as_megatron():
    assert _tied([])
    assert not _tied(["--untie-embeddings-and-output-weights"])
    assert not _tied(["--untie-embeddings"])


def _unit(index, names, values, start, end):
    """A unit of the engine as TiedGradients sees it: its owned range [start, end) (one
    piece at shard position 0, odc_pp.odc.shard_map)."""
    params = [torch.nn.Parameter(value.clone()) for value in values]
    offsets = [0]
    for value in values[:-1]:
        offsets.append(offsets[-1] + value.numel())
    return SimpleNamespace(index=index, names=names, params=params,
                           shapes=[tuple(v.shape) for v in values], offsets=offsets,
                           owned=[(start, end, 0)], grad_acc=torch.zeros(end - start))


def test_differing_compares_the_owned_pieces_of_both_copies():
    weight = torch.arange(12.0).reshape(4, 3)
    bias = torch.ones(2)
    # unit 0: [embedding (12), bias (2)], owned [5, 14); unit 1: [bias, output copy], owned
    # [0, 14): this rank owns the copy whole and the embedding's elements 5..11 only
    first = _unit(0, [EMBEDDING, "b"], [weight, bias], 5, 14)
    last = _unit(1, ["b", OUTPUT], [bias, weight], 0, 14)
    tied = TiedGradients([first, last], [(0, EMBEDDING), (1, OUTPUT)], None)
    owned = [torch.cat([weight.reshape(-1), bias])[5:14], torch.cat([bias, weight.reshape(-1)])]
    # the embedding's elements 0..4 are not owned here (another rank's): seen as zeros
    assert tied.differing(owned) == 4.0
    assert tied.differing(owned, window=5) == 4.0  # assembled 5 elements at a time
    first.owned = [(0, 14, 0)]
    owned[0] = torch.cat([weight.reshape(-1), bias])
    assert tied.differing(owned) == 0.0 and tied.differing(owned, window=5) == 0.0
    owned[1] = owned[1].clone()
    owned[1][2 + 7] += 0.5  # one element of the copy
    assert tied.differing(owned) == 0.5 and tied.differing(owned, window=5) == 0.5
    assert tied.differing(owned, window=7) == 0.5  # windows that end mid-copy


def test_export_drops_an_equal_copy_and_refuses_a_differing_one():
    embedding = torch.randn(8, 4)
    state = {EMBEDDING: embedding, OUTPUT: embedding.clone(), "x": torch.zeros(1)}
    assert sorted(without_tied_copy(state, "ckpt")) == sorted([EMBEDDING, "x"])
    state[OUTPUT][3, 1] += 1e-6
    with pytest.raises(ValueError, match="--untie-embeddings-and-output-weights"):
        without_tied_copy(state, "ckpt")


def test_export_takes_the_tie_from_the_meta():
    assert tied_in_meta({"tie_embeddings": True}, {OUTPUT: 0})
    assert not tied_in_meta({"tie_embeddings": False}, {})
    assert tied_in_meta({}, {}) and not tied_in_meta({}, {OUTPUT: 0})  # older checkpoints

