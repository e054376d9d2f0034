"""Evaluation (--eval-interval / --eval-iters, --split, --valid-data-path): Megatron's
split boundaries, the forward-only schedule, and end to end the eval loss at --lr 0
equals the training loss of the same samples on pipelined layouts."""

import dataclasses
import json
import random

import pytest

from odc_pp.testing.torchrun import launch


def test_split_bounds_are_megatrons():
    from odc_pp.data.splits import DocumentRange, split_bounds

    assert split_bounds("969,30,1", 1000) == [range(0, 969), range(969, 999), range(999, 1000)]
    # rounding: 3 x round(3.33) = 9 documents; the excess (-1) moves the ends back
    assert split_bounds("1,1,1", 10) == [range(0, 4), range(4, 7), range(7, 10)]
    assert split_bounds("98,2,0", 40) == [range(0, 39), range(39, 40), range(40, 40)]
    assert split_bounds("100", 7) == [range(0, 7), range(7, 7), range(7, 7)]
    with pytest.raises(ValueError, match="--split"):
        split_bounds("a,b", 10)

    class Docs:
        pad_id = 0

        def __len__(self):
            return 10

        def length(self, index):
            return index + 1

        def __getitem__(self, index):
            return index

    valid = DocumentRange(Docs(), range(4, 7))
    assert len(valid) == 3 and valid[0] == 4 and valid.length(2) == 7
    with pytest.raises(ValueError, match="no documents"):
        DocumentRange(Docs(), range(7, 7), name="test")


def test_split_gives_disjoint_train_and_valid_sources(tmp_path):
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import build_source, build_valid_source

    data = str(tmp_path / "data.jsonl")
    with open(data, "w") as handle:
        for index in range(50):
            handle.write(json.dumps({"text": "w" * (index + 1)}) + "\n")
    flags = ["--data-path", data, "--seq-length", "64", "--split", "80,20,0"]
    train, _ = build_source(parse_args(flags))
    valid = build_valid_source(parse_args(flags))
    # documents 0..39 train, 40..49 validate (each document's length tells it apart)
    assert {train.length(i) for i in range(40)} == set(range(1, 41))
    assert {valid.length(i) for i in range(10)} == set(range(41, 51))
    assert build_valid_source(parse_args(["--data-path", data, "--seq-length", "64"])) is None
    assert build_valid_source(parse_args(flags + ["--eval-iters", "0"])) is None
    with pytest.raises(ValueError, match="--split"):
        parse_args(flags + ["--valid-data-path", data])


@pytest.mark.parametrize("name,pp,chunks", [("1f1b", 2, 1), ("zbv", 2, 2),
                                            ("interleaved", 2, 2), ("zb-h1", 4, 1)])
def test_forward_only_schedule_keeps_each_ranks_forwards_and_lowers(name, pp, chunks):
    from odc_pp.schedule.build import ScheduleRequest, build
    from odc_pp.schedule.ir import ActionKind
    from odc_pp.schedule.lowering import forward_only, lower_communication

    request = ScheduleRequest.of(name, pp=pp, num_microbatches=2 * pp, num_chunks=chunks)
    compute = build(dataclasses.replace(request, communication=False))
    forward = forward_only(compute)
    for rank in range(pp):
        expected = [a for a in compute.ranks[rank] if a.kind is ActionKind.F]
        assert forward.ranks[rank] == expected and expected
    lowered = lower_communication(forward)
    assert build(request.evaluation()).ranks == lowered.ranks  # what evaluation runs
    kinds = {a.kind for a in lowered.actions()}
    assert kinds <= {ActionKind.F, ActionKind.SEND_F, ActionKind.RECV_F}
    assert ActionKind.SEND_F in kinds
    with pytest.raises(ValueError, match="compute-only"):
        forward_only(lowered)


def _write_text_data(path, count=48, seed=0):
    rng = random.Random(seed)
    words = "the quick brown fox jumps over a lazy dog while pipelines zero bubbles".split()
    with open(path, "w") as handle:
        for _ in range(count):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 14)))
            handle.write(json.dumps({"text": text}) + "\n")


@pytest.mark.multiproc
@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--pipeline-schedule", "zbv", "--dp-mode", "odc"],
                                    ["--pipeline-schedule", "1f1b", "--dp-mode",
                                     "collective", "--load-balance", "balanced"],
                                    # eval after a post-validated step, under full recompute
                                    ["--pipeline-schedule", "zb-h1", "--dp-mode", "odc",
                                     "--enable-optimizer-post-validation",
                                     "--recompute-granularity", "full", "--recompute-method",
                                     "block", "--recompute-num-layers", "1"]],
                         ids=["zbv-odc", "1f1b-collective", "zbh1-pv-full-recompute"])
def test_eval_loss_at_lr_0_equals_the_training_loss_on_the_same_samples(layout, tmp_path):
    """--valid-data-path is the training file (same seeded order): evaluation k runs
    validation batch k-1, which is training batch k-1; with --lr 0 both losses are the
    same numbers (forward only, token-weighted the same way)."""
    data = str(tmp_path / "data.jsonl")
    _write_text_data(data)
    flags = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "32", "--data-path", data, "--valid-data-path", data,
             "--global-batch-size", "8", "--micro-batch-size", "1", "--lr", "0",
             "--train-iters", "3", "--eval-interval", "1", "--eval-iters", "1",
             "--pipeline-model-parallel-size", "2", "--seed", "5", "--no-progress-bar",
             "--distributed-timeout-minutes", "1.5",
             "--hidden-dropout", "0", "--attention-dropout", "0",  # evaluation has none
             *layout]
    run = launch(flags, nproc=4, tmp_path=tmp_path, name="eval")
    assert run.returncode == 0, run.describe()
    losses = run.losses()
    evals = run.eval_records()
    assert [r["iteration"] for r in evals] == [1, 2, 3]
    assert "validation at iter" in run.stdout
    for record, loss in zip(evals, losses):
        assert abs(record["eval_loss"] - loss) <= 1e-9 * loss, (evals, losses)
    assert len(set(losses)) == 3  # three different batches
