"""The keyed dropout masks (odc_pp/megatron/dropout.py) and the token ids they are keyed by."""

import numpy as np
import pytest
import torch

from odc_pp.data import collate, pack, row_token_ids
from odc_pp.data.samples import Sample
from odc_pp.megatron.dropout import (DropoutScope, KeyedAttentionDropout, KeyedDropout,
                                     dropout_scope, mix32, restored_scope,
                                     site_key)


def _sample(length: int, start: int = 1) -> Sample:
    tokens = np.arange(start, start + length + 1, dtype=np.int64)
    return Sample(tokens=tokens, loss_mask=np.ones(length, dtype=np.float32))


def test_mix32_is_the_same_on_ints_and_tensors():
    values = [0, 1, 2, 12345, 2 ** 32 - 1]
    got = mix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got == [mix32(v) for v in values]
    assert all(0 <= v < 2 ** 32 for v in got) and len(set(got)) == len(got)


def _dropped(x, ids, *, seed=7, layer=0, site="mlp_output"):
    with restored_scope(DropoutScope(seed=seed, token_ids=ids, layer=layer)):
        return KeyedDropout(0.1, site=site)(x)


def test_the_drop_rate_is_p_and_masks_depend_on_every_key():
    ids = row_token_ids(4, 256)
    x = torch.ones(256, 4, 512)
    first = _dropped(x, ids)
    dropped = float((first == 0).float().mean())
    assert abs(dropped - 0.1) < 0.003, dropped
    assert torch.allclose(first[first != 0], torch.full_like(first[first != 0], 1 / 0.9))
    assert torch.equal(_dropped(x, ids), first)  # a function of the keys alone
    others = [_dropped(x, ids, layer=1), _dropped(x, ids, site="attention_output"),
              _dropped(x, ids, seed=8), _dropped(x, row_token_ids(4, 256, first_sample=4))]
    for other in others:  # another layer, site, seed or samples: an independent mask
        both = float(((first == 0) & (other == 0)).float().mean())
        assert abs(both - 0.01) < 0.002, both


def test_a_sequence_parallel_shard_gets_its_slice_of_the_full_mask():
    ids = row_token_ids(2, 16, first_sample=3)
    x = torch.randn(16, 2, 8)
    with dropout_scope(seed=1, token_ids=ids):
        full = KeyedDropout(0.5)(x)
    with dropout_scope(seed=1, token_ids=ids, tp_rank=1, tp_size=2):
        shard = KeyedDropout(0.5)(x[8:])
    assert torch.equal(shard, full[8:])


def test_attention_heads_are_keyed_globally():
    ids = row_token_ids(1, 8)
    probs = torch.rand(1, 4, 8, 8)
    with dropout_scope(seed=2, token_ids=ids):
        full = KeyedAttentionDropout(0.3)(probs)
    with dropout_scope(seed=2, token_ids=ids, tp_rank=1, tp_size=2):
        part = KeyedAttentionDropout(0.3)(probs[:, 2:])
    assert torch.equal(part, full[:, 2:])


def test_a_sample_keeps_its_token_ids_in_any_microbatch():
    a, b = _sample(5), _sample(3, start=20)
    rows = collate([a, b], pad_id=0, sample_ids=[11, 40]).global_token_ids
    assert rows[1, :3].tolist() == [(40 << 32) + i for i in range(3)]
    assert rows[1, 3:].tolist() == [-1, -1]
    packed = pack([b, a], sample_ids=[40, 11], multiple=6).global_token_ids
    assert packed[0, :3].tolist() == rows[1, :3].tolist()
    assert packed[0, 3:8].tolist() == rows[0].tolist() and packed[0, 8:].tolist() == [-1] * 4
    assert collate([a], pad_id=0).global_token_ids is None


def test_dropout_without_token_ids_names_what_is_missing():
    with dropout_scope(seed=1, token_ids=None):
        with pytest.raises(ValueError, match="global_token_ids"):
            KeyedDropout(0.1)(torch.ones(4, 1, 2))
    module = KeyedDropout(0.1).eval()
    assert torch.equal(module(torch.ones(4, 1, 2)), torch.ones(4, 1, 2))  # eval: no scope
    assert site_key(1, 0, "attention") != site_key(1, 0, "mlp_output")
