"""The fp16 loss scalers against megatron-core's grad scalers (the reference)."""

from __future__ import annotations

import random

import pytest
import torch

from odc_pp.optim.loss_scale import (ConstantLossScaler, DynamicLossScaler, LossScaleConfig,
                                     build_loss_scaler)

grad_scaler = pytest.importorskip("megatron.core.optimizer.grad_scaler")


@pytest.fixture
def cpu_tensors(monkeypatch):
    """megatron-core's scalers put their tensors on 'cuda': build them on the CPU."""
    real = torch.tensor

    def tensor(*args, **kwargs):
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)


def _flags(seed: int, count: int) -> list[bool]:
    rng = random.Random(seed)
    flags, p = [], 0.5
    for _ in range(count):  # bursts of overflows and long clean stretches
        p = rng.choice([0.02, 0.5, 0.9]) if rng.random() < 0.05 else p
        flags.append(rng.random() < p)
    return flags


@pytest.mark.parametrize("initial,minimum,window,hysteresis", [
    (2.0 ** 32, 1.0, 1000, 2), (2.0 ** 16, 1.0, 5, 1), (3000.0, 7.0, 3, 3), (1.5, 1.0, 2, 2)])
def test_dynamic_matches_megatron(cpu_tensors, initial, minimum, window, hysteresis):
    ours = DynamicLossScaler(LossScaleConfig(initial_scale=initial, min_scale=minimum,
                                             growth_interval=window, hysteresis=hysteresis))
    reference = grad_scaler.DynamicGradScaler(
        initial_scale=initial, min_scale=minimum, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=window, hysteresis=hysteresis)
    flags = _flags(hash((initial, window)) % 1000, 3000) + [True] * 60 + [False] * 2100
    changes = 0
    for step, found_inf in enumerate(flags):
        before = ours.scale
        ours.update(found_inf)
        reference.update(found_inf)
        changes += ours.scale != before
        assert ours.scale == float(reference.scale), f"step {step}"
        assert ours.inv_scale == float(reference.inv_scale)
        assert (ours.growth_tracker, ours.hysteresis_tracker) == \
            (reference._growth_tracker, reference._hysteresis_tracker)
    assert changes > 10  # the sequence moved the scale both ways
    assert ours.at_floor is False


def test_floor_and_state_round_trip():
    scaler = DynamicLossScaler(LossScaleConfig(initial_scale=8.0, min_scale=2.0, hysteresis=1))
    for _ in range(5):
        scaler.update(True)
    assert scaler.scale == 2.0 and scaler.at_floor
    scaler.update(False)
    copy = DynamicLossScaler(LossScaleConfig(initial_scale=8.0, min_scale=2.0, hysteresis=1))
    copy.load_state_dict(scaler.state_dict())
    assert copy.state_dict() == scaler.state_dict() == {
        "scale": 2.0, "growth_tracker": 1, "hysteresis_tracker": -4}


def test_constant_scale_never_moves():
    scaler = build_loss_scaler(LossScaleConfig(loss_scale=1024.0))
    assert isinstance(scaler, ConstantLossScaler) and not scaler.dynamic
    for found_inf in (True, True, False):
        scaler.update(found_inf)
    assert scaler.scale == 1024.0 and scaler.inv_scale == 1 / 1024


@pytest.mark.parametrize("kwargs,flag", [
    ({"loss_scale": 0.0}, "--loss-scale"), ({"min_scale": 4.0, "initial_scale": 2.0},
                                            "--min-loss-scale"),
    ({"growth_interval": 0}, "--loss-scale-window"), ({"hysteresis": 0}, "--hysteresis")])
def test_bad_config_names_the_flag(kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        LossScaleConfig(**kwargs)
