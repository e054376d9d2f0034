"""Blended datasets (--data-path W1 P1 W2 P2, Megatron's meaning): normalised weights,
proportions, determinism for a fresh (resumed) source, and end to end a resumed run reads
the same blended batches as an uninterrupted one."""

import json
import random

import numpy as np
import pytest

from odc_pp.data.blending import BlendedSource, parse_blend


class _Tagged:
    """A finite dataset whose samples are (name, document index)."""

    def __init__(self, name, size):
        self.name, self.size, self.pad_id = name, size, 0

    def __len__(self):
        return self.size

    def length(self, index):
        return 1 + index % 5

    def __getitem__(self, index):
        return (self.name, index)


def _blend(items):
    from odc_pp.data import ShuffledSource

    weights, paths = parse_blend(items)
    sizes = {"a": 37, "b": 1000, "c": 5}
    return BlendedSource([ShuffledSource(_Tagged(p, sizes[p]), seed=11 + i)
                          for i, p in enumerate(paths)], weights)


def test_parse_blend_normalises_and_rejects_bad_lists():
    assert parse_blend(["data/a.jsonl"]) is None
    assert parse_blend(["3", "a", "7", "b"]) == ([0.3, 0.7], ["a", "b"])
    for bad in (["0.3", "a", "0.7"], ["-1", "a", "2", "b"], ["0", "a", "0", "b"]):
        with pytest.raises(ValueError, match="--data-path"):
            parse_blend(bad)


def test_proportions_within_2_percent_over_10k_samples():
    source = _blend(["2", "a", "5", "b", "3", "c"])  # weights 0.2, 0.5, 0.3
    names = [source[i][0] for i in range(10_000)]
    for name, share in (("a", 0.2), ("b", 0.5), ("c", 0.3)):
        assert abs(names.count(name) / 10_000 - share) <= 0.02, (name, names.count(name))
    # a small dataset cycles through fresh epochs: every document of c is read equally often
    counts = np.bincount([source[i][1] for i in range(10_000) if source[i][0] == "c"])
    assert counts.max() - counts.min() <= 1


def test_a_fresh_source_reads_the_same_samples_from_any_point():
    walked = _blend(["0.3", "a", "0.7", "b"])
    expected = [walked[i] for i in range(9_000)]
    resumed = _blend(["0.3", "a", "0.7", "b"])  # as after a resume: starts at 8_000
    assert [resumed[i] for i in range(8_000, 9_000)] == expected[8_000:]
    assert [resumed.length(i) for i in range(8_000, 8_100)] == \
        [walked.length(i) for i in range(8_000, 8_100)]
    # the blend interleaves (no long runs from one dataset)
    first = [sample[0] for sample in expected[:10]]
    assert first.count("a") == 3


def _write(path, seed, words):
    rng = random.Random(seed)
    with open(path, "w") as handle:
        for _ in range(30):
            handle.write(json.dumps({"text": " ".join(rng.choice(words) for _ in
                                                     range(rng.randint(3, 12)))}) + "\n")


@pytest.mark.multiproc
@pytest.mark.slow
def test_resumed_run_reads_the_same_blended_batches(tmp_path):
    from odc_pp.testing.torchrun import launch

    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    _write(a, 1, "alpha beta gamma delta".split())
    _write(b, 2, "one two three four five six seven".split())
    flags = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
             "--seq-length", "32", "--data-path", "0.25", a, "0.75", b,
             "--global-batch-size", "8", "--micro-batch-size", "2", "--lr", "1e-2",
             "--pipeline-model-parallel-size", "2", "--seed", "5", "--no-progress-bar",
             "--distributed-timeout-minutes", "1.5", "--train-iters", "4"]
    whole = launch(flags, nproc=2, tmp_path=tmp_path, name="whole")
    assert whole.returncode == 0, whole.describe()
    save = str(tmp_path / "ckpt")
    first = launch(flags + ["--save", save, "--exit-interval", "2"], nproc=2,
                   tmp_path=tmp_path, name="first")
    assert first.returncode == 0, first.describe()
    second = launch(flags + ["--load", save], nproc=2, tmp_path=tmp_path, name="second")
    assert second.returncode == 0, second.describe()
    assert first.losses() + second.losses() == whole.losses()
