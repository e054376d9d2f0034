"""--fp16 and Megatron's loss-scale flags: parsed natively, checked with one line naming the
flag, the compute dtype follows."""

import pytest

from odc_pp.optim.loss_scale import ConstantLossScaler, DynamicLossScaler, build_loss_scaler
from odc_pp.training.arguments import loss_scale_config, parse_args
from odc_pp.training.logging_utils import format_record

BASE = ["--mock-data", "--vocab-size", "64"]


def test_fp16_flags_parse_with_megatron_defaults():
    args = parse_args(BASE + ["--fp16"])
    assert args.model.compute_dtype == "float16"
    assert parse_args(BASE + ["--bf16"]).model.compute_dtype == "bfloat16"
    assert parse_args(BASE).model.compute_dtype == "float32"
    scaler = build_loss_scaler(loss_scale_config(args.optimizer))
    assert isinstance(scaler, DynamicLossScaler) and scaler.scale == 2.0 ** 32
    assert (scaler.min_scale, scaler.config.growth_interval, scaler.config.hysteresis) == \
        (1.0, 1000, 2)
    fixed = parse_args(BASE + ["--fp16", "--loss-scale", "4096"])
    assert isinstance(build_loss_scaler(loss_scale_config(fixed.optimizer)), ConstantLossScaler)


@pytest.mark.parametrize("extra,message", [
    (["--bf16"], "--fp16 and --bf16 contradict"),
    (["--enable-optimizer-post-validation"], "--fp16 does not compose with "
                                             "--enable-optimizer-post-validation"),
    (["--hysteresis", "0"], "--hysteresis must be >= 1"),
    (["--loss-scale-window", "0"], "--loss-scale-window must be >= 1"),
    (["--min-loss-scale", "8", "--initial-loss-scale", "4"], "--min-loss-scale 8.0 must be"),
    (["--loss-scale", "-1"], "--loss-scale must be > 0")])
def test_bad_fp16_combinations_name_the_flag(extra, message):
    with pytest.raises(ValueError, match=message):
        parse_args(BASE + ["--fp16", *extra])


def test_iteration_line_shows_the_loss_scale_as_megatron():
    record = {"iteration": 3, "loss": 2.0, "lr": 1e-3, "grad_norm": float("inf"),
              "tokens_per_s": 10.0, "step_s": 0.1, "loss_scale": 512.0,
              "skipped_iterations": 1}
    assert format_record(record).endswith(
        "loss scale: 512.0 | number of skipped iterations:   1")
    del record["loss_scale"], record["skipped_iterations"]
    assert "loss scale" not in format_record(record)
