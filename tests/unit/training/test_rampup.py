"""--rampup-batch-size: the per-iteration global batch against megatron-core's
RampupBatchsizeNumMicroBatchesCalculator (the reference), the data plan's samples, the
--train-samples conversion and the flag checks."""

import pytest

from odc_pp.training.arguments import parse_args
from odc_pp.training.data_plan import BatchAssigner, build_source
from odc_pp.training.data_position import DataPosition
from odc_pp.training.rampup import BatchRampup

calculators = pytest.importorskip("megatron.core.num_microbatches_calculator")

BASE = ["--mock-data", "--vocab-size", "64", "--seq-length", "32"]


@pytest.mark.parametrize("start,increment,samples,gbs,mbs,dp", [
    (16, 16, 5859375 // 1000, 1536, 1, 16), (2, 2, 16, 8, 1, 2), (4, 4, 100, 64, 2, 2),
    (3, 6, 50, 27, 3, 1), (8, 8, 1, 32, 1, 8), (1, 1, 7, 5, 1, 1)])
def test_batch_sizes_match_megatron_core(start, increment, samples, gbs, mbs, dp):
    reference = calculators.RampupBatchsizeNumMicroBatchesCalculator(
        global_batch_size=gbs, micro_batch_size=mbs, data_parallel_size=dp,
        decrease_batch_size_if_needed=False, rank=1, start_global_batch_size=start,
        batch_size_increment=increment, ramup_samples=samples)
    ours = BatchRampup(start=start, increment=increment, samples=samples,
                       global_batch_size=gbs)
    assert ours.divisibility_problem(mbs, dp) is None
    consumed = 0
    for iteration in range(samples // start + 20):
        reference.update(consumed, consistency_check=True)
        size = reference.get_current_global_batch_size()
        assert ours.consumed_before(iteration) == consumed, iteration
        assert ours.batch_size_of(iteration) == size, iteration
        assert reference.get() == size // (mbs * dp)  # microbatches per replica
        consumed += size
    assert ours.batch_size_of(iteration) == gbs


def test_an_indivisible_size_is_refused_as_megatron_asserts():
    reference = calculators.RampupBatchsizeNumMicroBatchesCalculator(
        global_batch_size=12, micro_batch_size=1, data_parallel_size=4,
        decrease_batch_size_if_needed=False, rank=1, start_global_batch_size=4,
        batch_size_increment=2, ramup_samples=12)
    with pytest.raises(AssertionError):
        for consumed in range(0, 40, 2):
            reference.update(consumed, consistency_check=True)
    ramp = BatchRampup(start=4, increment=2, samples=12, global_batch_size=12)
    assert "global batch size 6 of the ramp is not divisible by --micro-batch-size 1 x " \
           "data-parallel size 4" in ramp.divisibility_problem(1, 4)
    args = parse_args(BASE + ["--global-batch-size", "12", "--rampup-batch-size", "4", "2",
                              "12"])
    with pytest.raises(ValueError, match="--rampup-batch-size: global batch size 6"):
        args.resolve(4).layout.dp


@pytest.mark.parametrize("extra,message", [
    (["--rampup-batch-size", "2", "2"], "takes three numbers"),
    (["--rampup-batch-size", "3", "2", "10"], "minus START 3 must be a positive multiple"),
    (["--rampup-batch-size", "0", "2", "10"], "START, INCREMENT and SAMPLES must be > 0"),
    (["--rampup-batch-size", "2", "2", "0"], "START, INCREMENT and SAMPLES must be > 0")])
def test_bad_ramps_name_the_flag(extra, message):
    with pytest.raises(ValueError, match=message):
        parse_args(BASE + ["--global-batch-size", "8", *extra])


def test_train_samples_count_the_ramp_iterations_as_megatron():
    # 3 steps of 2 over 12 samples: 4 samples per step; consumed 0 2 4 8 14 (> 12) 22
    ramp = BatchRampup(start=2, increment=2, samples=12, global_batch_size=8)
    assert [ramp.batch_size_of(i) for i in range(6)] == [2, 2, 4, 6, 8, 8]
    # while consumed <= 12: 0, 2, 4, 8 -> 4 iterations, 14 consumed; then (40 - 14) // 8
    assert ramp.train_iters(40) == 4 + 3
    args = parse_args(BASE + ["--global-batch-size", "8", "--rampup-batch-size", "2", "2",
                              "12", "--train-samples", "40"])
    assert args.run.train_iters == 7


def test_data_plan_takes_the_next_samples_of_each_ramped_batch():
    args = parse_args(BASE + ["--global-batch-size", "8", "--rampup-batch-size", "2", "2",
                              "12", "--load-balance", "lb-mini"])
    source, _ = build_source(args)
    planner = BatchAssigner(args, source, dp=2, pp=1, position=DataPosition.of(args.data))
    start = 0
    for iteration, size in enumerate([2, 2, 4, 6, 8, 8]):
        plan = planner.plan(iteration)
        ids = sorted(i for replica in plan.replicas for mb in replica for i in mb)
        assert ids == list(range(start, start + size)), iteration
        start += size
