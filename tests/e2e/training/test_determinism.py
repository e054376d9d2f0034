"""Bitwise determinism of whole training runs: the same pretrain_gpt.py command run three
times gives identical per-iteration losses and gradient norms and an identical final
checkpoint (master weights and optimizer moments of every rank).

Guards the default ODC mode (deterministic staged accumulation) against ordering races
between an owner's writes to its gradient accumulator and its peers' adds at ``sync``: such
a race corrupted a window of one owner's gradient about once in 20-60 iterations, so each
run is 60 iterations. The collective mode is checked the same way.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from odc_pp.training.checkpoint.checkpointing import load_rank_state, rank_file

from odc_pp.testing.torchrun import TINY_MODEL, launch

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

ITERS = 60
RUNS = 3

CONFIGS = {
    "pp1xdp2-odc": (2, ["--pipeline-schedule", "1f1b", "--dp-mode", "odc"]),
    "pp2xdp2-odc-lb-mini": (4, ["--pipeline-model-parallel-size", "2",
                                "--pipeline-schedule", "zbv", "--dp-mode", "odc",
                                "--load-balance", "lb-mini"]),
    "pp1xdp2-collective": (2, ["--pipeline-schedule", "1f1b", "--dp-mode", "collective"]),
}


def _digest(value, hasher, path="") -> None:
    """Feed every tensor under value (dicts by sorted key, lists in order) to hasher."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        hasher.update(f"{path}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        hasher.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            _digest(value[key], hasher, f"{path}/{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _digest(item, hasher, f"{path}/{index}")
    else:
        hasher.update(f"{path}={value!r}".encode())


def _checkpoint_digests(save_dir) -> dict[str, str]:
    """Per rank file of the final checkpoint: digest of its optimizer state (the fp32
    master weights and moments of the owned shards, and the step)."""
    directory = save_dir / f"iter_{ITERS:07d}"
    digests = {}
    for name in sorted(os.listdir(directory)):
        if not name.startswith("rank_"):
            continue
        rank = int(name.split("_")[1].split(".")[0])
        assert rank_file(str(directory), rank).endswith(name), name
        state = load_rank_state(str(directory), rank)  # checksum-verified
        hasher = hashlib.sha256()
        _digest(state["optimizer"], hasher)
        digests[name] = hasher.hexdigest()
    assert digests, f"no rank files in {directory}"
    return digests


@pytest.mark.parametrize("name", list(CONFIGS))
def test_repeated_runs_are_bit_identical(name, tmp_path):
    nproc, flags = CONFIGS[name]
    outcomes = []
    for attempt in range(RUNS):
        save = tmp_path / f"ckpt{attempt}"
        run = launch(TINY_MODEL + flags + ["--train-iters", str(ITERS), "--save", str(save)],
                     nproc=nproc, tmp_path=tmp_path, name=f"{name}-{attempt}", timeout=600)
        assert run.returncode == 0, f"{name} run {attempt}: {run.describe()}"
        records = run.records()
        assert [r["iteration"] for r in records] == list(range(1, ITERS + 1))
        outcomes.append(([r["loss"] for r in records], [r["grad_norm"] for r in records],
                         _checkpoint_digests(save)))
    losses, norms, digests = outcomes[0]
    for attempt, (other_losses, other_norms, other_digests) in enumerate(outcomes[1:], 1):
        for iteration, (a, b, c, d) in enumerate(zip(losses, other_losses, norms, other_norms),
                                                 1):
            assert (a, c) == (b, d), (f"{name}: run {attempt} diverged from run 0 at iteration "
                                      f"{iteration}: loss {b!r} vs {a!r}, grad norm {d!r} vs "
                                      f"{c!r}")
        assert other_digests == digests, f"{name}: final checkpoints of runs 0 and {attempt} differ"
