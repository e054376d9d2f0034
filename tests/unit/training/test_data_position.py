"""odc_pp/training/data_position.py: the samples consumed before each iteration -- the same
batches as before for a fresh run, and on resume the checkpoint's consumed samples whatever
the batch flags (issue 53, item 1: Megatron's consumed_train_samples)."""

from __future__ import annotations

from odc_pp.data import global_batch_indices
from odc_pp.training.data_position import DataPosition
from odc_pp.training.rampup import BatchRampup


def _ramp(start=2, increment=2, samples=12, gbs=8) -> BatchRampup:
    return BatchRampup(start=start, increment=increment, samples=samples, global_batch_size=gbs)


def _ids(position: DataPosition, iterations) -> list[int]:
    return [i for iteration in iterations for i in position.sample_ids(iteration)]


def test_a_fresh_run_takes_the_batches_it_always_took():
    plain = DataPosition(global_batch_size=4)
    for iteration in range(6):
        assert plain.sample_ids(iteration) == global_batch_indices(iteration, 4)
        assert plain.schedule_iteration(iteration) == iteration
    ramp = _ramp()
    ramped = DataPosition(global_batch_size=8, rampup=ramp)
    assert [ramped.consumed_before(i) for i in range(7)] == \
        [ramp.consumed_before(i) for i in range(7)]


def test_resume_continues_from_the_recorded_samples_whatever_the_batch():
    saved = DataPosition(global_batch_size=4)
    record = saved.record(5)
    assert record == {"consumed_samples": 20, "global_batch_size": 4,
                      "rampup_batch_size": None}
    bigger = DataPosition(global_batch_size=8)
    line = bigger.resume(5, record)
    assert _ids(bigger, [5, 6]) == list(range(20, 36))  # nothing skipped
    assert line == ("data: iteration 5 continues from sample 20 (the samples the checkpoint "
                    "records as consumed); global batch 4 -> 8 from here on "
                    "(--global-batch-size 4 -> 8); no sample is skipped or repeated")
    same = DataPosition(global_batch_size=4)
    assert same.resume(5, record).endswith("; global batch 4")
    assert same.sample_ids(5) == list(range(20, 24))


def test_a_mid_ramp_checkpoint_resumes_without_its_ramp_or_with_another():
    ramped = DataPosition(global_batch_size=8, rampup=_ramp())
    record = ramped.record(3)  # batches 2, 2, 4
    assert record["consumed_samples"] == 8 and record["rampup_batch_size"] == [2, 2, 12]
    plain = DataPosition(global_batch_size=8)
    line = plain.resume(3, record)
    assert plain.sample_ids(3) == list(range(8, 16))
    assert "global batch 6 -> 8 from here on (--rampup-batch-size 2 2 12 -> none)" in line
    other = DataPosition(global_batch_size=8, rampup=_ramp(start=4, increment=4, samples=16))
    line = other.resume(3, record)
    assert other.sample_ids(3) == list(range(8, 12))  # the other ramp's batch at 8 samples
    assert other.sample_ids(4)[0] == 12
    assert "(--rampup-batch-size 2 2 12 -> 4 4 16)" in line


def test_skipping_or_repeating_takes_the_override_and_old_checkpoints_are_derived():
    record = DataPosition(global_batch_size=4).record(5)
    skip = DataPosition(global_batch_size=4)
    assert "--override-consumed-samples; the checkpoint records 20: samples 20-31 are " \
           "skipped" in skip.resume(5, record, override=32)
    assert skip.sample_ids(5) == list(range(32, 36))
    again = DataPosition(global_batch_size=4)
    assert "samples 12-19 are seen again" in again.resume(5, record, override=12)
    old = DataPosition(global_batch_size=4, rampup=_ramp(gbs=4, samples=4))
    line = old.resume(3, None)
    assert old.consumed_before(3) == DataPosition(
        global_batch_size=4, rampup=_ramp(gbs=4, samples=4)).consumed_before(3)
    assert "records no consumed samples: assumed what this run's batches consume in 3 " \
           "iterations" in line
