"""LRSchedule's decoupled schedule (--decoupled-lr / --decoupled-min-lr): the same warmup
and decay shape between its own peak and floor; without it lr_at is the plain float."""

import pickle

import pytest

from odc_pp.optim.rates import StepRates, decoupled_rate
from odc_pp.training.lr_schedule import LRSchedule

SHAPE = dict(warmup_iters=3, decay_iters=10)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
def test_decoupled_schedule_has_the_main_schedules_shape(style):
    plain = LRSchedule(lr=1e-3, min_lr=1e-4, style=style, **SHAPE)
    decoupled = LRSchedule(lr=1e-3, min_lr=1e-4, style=style, **SHAPE, decoupled_lr=4e-3,
                           decoupled_min_lr=2e-4)
    own = LRSchedule(lr=4e-3, min_lr=2e-4, style=style, **SHAPE)
    for iteration in range(14):
        rates = decoupled.lr_at(iteration)
        assert isinstance(rates, StepRates)
        assert float(rates) == plain.lr_at(iteration)
        assert rates.decoupled == own.lr_at(iteration)
        assert decoupled_rate(rates) == own.lr_at(iteration)


def test_without_decoupled_lr_the_rate_is_a_plain_float():
    schedule = LRSchedule(lr=1e-3, min_lr=1e-4, **SHAPE)
    assert all(type(schedule.lr_at(i)) is float for i in range(12))
    assert decoupled_rate(0.5) == 0.5


def test_decoupled_min_lr_defaults_to_min_lr():
    schedule = LRSchedule(lr=1e-3, min_lr=1e-4, **SHAPE, decoupled_lr=5e-3)
    assert schedule.lr_at(20).decoupled == pytest.approx(1e-4)


def test_rates_survive_pickling_and_print_both():
    rates = StepRates(1e-3, 2e-3)
    again = pickle.loads(pickle.dumps(rates))
    assert again == rates and again.decoupled == 2e-3
    assert "decoupled=0.002" in repr(rates)


@pytest.mark.parametrize("fields, flag", [
    (dict(decoupled_min_lr=1e-4), "--decoupled-min-lr needs --decoupled-lr"),
    (dict(decoupled_lr=1e-3, decoupled_min_lr=2e-3), "--decoupled-min-lr"),
    (dict(decoupled_lr=1e-5), "--decoupled-lr 1e-05"),
])
def test_bad_decoupled_rates_name_the_flag(fields, flag):
    with pytest.raises(ValueError, match=flag):
        LRSchedule(lr=1e-3, min_lr=1e-4, **SHAPE, **fields)


def test_post_validation_torch_target_gives_decoupled_groups_their_rate():
    import torch

    from odc_pp.optim.post_validation import TorchOptimizerTarget

    main, embedding = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([{"params": [main]},
                                 {"params": [embedding], "decoupled": True}], lr=1.0)
    target = TorchOptimizerTarget(optimizer)
    main.grad, embedding.grad = torch.ones(3), torch.ones(3)
    target.step_eagerly(StepRates(0.1, 0.5))
    assert [group["lr"] for group in optimizer.param_groups] == [0.1, 0.5]
    assert torch.allclose(main, torch.full((3,), 0.9))
    assert torch.allclose(embedding, torch.full((3,), 0.5))
