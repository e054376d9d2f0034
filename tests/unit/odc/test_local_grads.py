"""grad_accumulation 'local' of odc_pp.odc.engine (issue 29: no redundant copies): at dp=1
the gathered parameters are the shard and the weight gradients land in the owner's fp32
accumulator through ``param.main_grad``, with no ``.grad`` left and no push; the sum over
microbatches equals plain autograd's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from odc_pp.odc.engine import OdcConfig, ShardedDataParallel, accumulates_locally
from odc_pp.odc.transport_fake import FakeOdcGroup


def _engine(grad_accumulation: str, deterministic: bool = True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    group = FakeOdcGroup(rank=0, world_size=1, deterministic=deterministic)
    engine = ShardedDataParallel([model], OdcConfig(unit_driver="pipeline",
                                                    grad_accumulation=grad_accumulation),
                                 group)
    return model, engine, reference


def _minibatch(model, engine, inputs):
    engine.begin_minibatch()
    for microbatch, x in enumerate(inputs):
        engine.before_forward(0, microbatch)
        model(x).square().sum().backward()
        engine.after_weight_grad(0, microbatch)
    engine.finish_minibatch()
    return engine.owned_grads()[0].clone()


def test_dp1_has_one_parameter_copy_and_one_fp32_gradient():
    model, engine, reference = _engine("auto")
    unit = engine.units[0]
    assert engine.local_grads and unit.aliased
    assert sum(segment.nbytes for segment in unit.segments) == 0
    weight = model[0].weight
    assert weight.untyped_storage().data_ptr() == unit.param_shard.untyped_storage().data_ptr()
    assert weight.main_grad.untyped_storage().data_ptr() == \
        unit.grad_acc.untyped_storage().data_ptr()
    inputs = [torch.randn(3, 8) for _ in range(3)]
    local = _minibatch(model, engine, inputs)
    assert all(p.grad is None for p in model.parameters())
    assert unit.pushes == 0  # the owner's accumulator: nothing to push
    for x in inputs:
        reference(x).square().sum().backward()
    expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
    torch.testing.assert_close(local, expected, rtol=1e-6, atol=1e-6)
    engine.finish_step()
    assert not unit.grad_acc.any() and weight.main_grad.abs().sum() == 0


def test_the_default_follows_the_transport():
    pipeline = OdcConfig(unit_driver="pipeline")
    assert accumulates_locally(pipeline, dp=1, deterministic=False)
    assert accumulates_locally(pipeline, dp=4, deterministic=True)
    assert not accumulates_locally(pipeline, dp=4, deterministic=False)  # overlapped pushes
    assert not accumulates_locally(OdcConfig(unit_driver="pipeline", mode="collective"),
                                   dp=4, deterministic=True)  # the FSDP baseline
    assert not accumulates_locally(OdcConfig(), dp=1, deterministic=True)  # module hooks
    with pytest.raises(ValueError, match="unit_driver='pipeline'"):
        OdcConfig(grad_accumulation="local")
