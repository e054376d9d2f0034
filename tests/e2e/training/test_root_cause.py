"""torchrun names the rank that holds the real error as the root cause (gloo), not a rank
that only echoes it with "Connection closed by peer" (issue 15, Why item 7)."""

from __future__ import annotations

import re
import textwrap

import pytest

from odc_pp.training.failures import is_peer_echo

from odc_pp.testing.torchrun import TINY_MODEL, launch

_SCRIPT = textwrap.dedent('''
    """pretrain_gpt.py whose training fails with an error of its own on rank {rank}
    (before the first iteration, through the trainer's hooks)."""
    import sys
    import torch.distributed as dist
    from odc_pp.training import pretrain
    from odc_pp.training.hooks import TrainingHooks

    class FailOnOneRank(TrainingHooks):
        def before_iteration(self, iteration, topo):
            dist.barrier()
            if dist.get_rank() == {rank}:
                raise OSError(28, "No space left on device (injected on rank {rank})")
            dist.barrier()

    sys.exit(pretrain(hooks=FailOnOneRank()))
''')


def test_peer_echo_classification():
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:30124. This is typically caused by a remote worker crashing.")
    assert is_peer_echo(gloo)
    assert is_peer_echo(ConnectionResetError("reset"))
    try:
        try:
            raise gloo
        except RuntimeError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert is_peer_echo(outer)
    assert not is_peer_echo(OSError(28, "No space left on device"))
    assert not is_peer_echo(TimeoutError("pipeline rank 0: recv from rank 1 did not complete"))


@pytest.mark.parametrize("fail_rank", [1, 3])
def test_torchrun_root_cause_is_the_failing_rank(tmp_path, fail_rank):
    script = tmp_path / "fail.py"
    script.write_text(_SCRIPT.format(rank=fail_rank))
    run = launch([*TINY_MODEL, "--pipeline-model-parallel-size", "2", "--train-iters", "2"],
                 nproc=4, tmp_path=tmp_path, name=f"fail{fail_rank}", log=False,
                 script=str(script), timeout=120, launcher="torchrun")
    assert run.returncode != 0, run.describe()
    output = run.stdout + run.stderr
    root = output.split("Root Cause (first observed failure):", 1)
    assert len(root) == 2, run.describe()
    match = re.search(r"rank\s*:\s*(\d+)", root[1])
    assert match and int(match.group(1)) == fail_rank, run.describe()
    assert f"injected on rank {fail_rank}" in root[1], run.describe()
