"""Unit tests of preemption (the stop agreement), the --save lock, elastic restarts and
the checkpoint-writing and argument defects of issue 25 (single process, no torchrun)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import types

import pytest
import torch

from odc_pp.data.datasets import JsonlDataset
from odc_pp.data.tokenizers import ByteLevelTokenizer
from odc_pp.training.checkpoint import checkpointing
from odc_pp.training.arguments import parse_args, parse_args_with_notes
from odc_pp.training.checkpoint.checkpointing import (CheckpointWriteError, capture_rng_state,
                                           checkpoint_bytes, remove_leftovers, save_checkpoint,
                                           write_rank_file)
from odc_pp.training.data_plan import build_source
from odc_pp.training.checkpoint.elastic import adopt_elastic_restart
from odc_pp.training.preemption import EXIT_PREEMPTED, ExitController, TrainingInterrupted
from odc_pp.training.checkpoint.resume import retained_copies
from odc_pp.training.checkpoint.save_lock import LOCK_NAME, SaveLock, current_owner

MOCK = ["--mock-data", "--vocab-size", "64"]


# ----- the stop agreement -------------------------------------------------------------------
def _peer(values: list[float]):
    """A reduce that combines this rank's values with one peer's (elementwise MAX)."""
    return lambda mine: [max(a, b) for a, b in zip(mine, values)]


def test_a_signal_on_one_rank_stops_every_rank_at_the_same_iteration():
    clock = iter([0.0] * 10)
    quiet = ExitController(train_iters=10, reduce=_peer([0.0, 0.0]), start_time=0.0,
                           clock=lambda: next(clock))
    assert not quiet.should_exit(3).stop
    # this rank saw nothing; the peer caught SIGTERM: both decide to stop after iteration 4
    told = ExitController(train_iters=10, reduce=_peer([float(signal.SIGTERM), 0.0]),
                          start_time=0.0, clock=lambda: 0.0)
    decision = told.should_exit(4)
    assert decision.stop and decision.exit_code == EXIT_PREEMPTED
    assert decision.reason == "SIGTERM received: every rank stopped after iteration 4"
    with pytest.raises(TrainingInterrupted) as caught:
        told.finish()
    assert caught.value.exit_code == EXIT_PREEMPTED
    # a signal during the last iteration: the run is complete, exit 0
    last = ExitController(train_iters=10, reduce=_peer([float(signal.SIGTERM), 0.0]),
                          start_time=0.0, clock=lambda: 0.0)
    assert last.should_exit(10).exit_code == 0
    last.finish()  # no exception


def test_exit_duration_uses_the_slowest_rank():
    # this rank has run 1 minute, the peer 3: with a 2-minute budget both stop
    controller = ExitController(train_iters=100, duration_minutes=2.0, start_time=0.0,
                                clock=lambda: 60.0, reduce=_peer([0.0, 3.0]))
    decision = controller.should_exit(7)
    assert decision.stop and decision.exit_code == 0
    assert "--exit-duration-in-mins 2 reached (3.00 minutes on the slowest rank)" in \
        decision.reason
    controller.finish()  # exit 0: no exception
    alone = ExitController(train_iters=100, duration_minutes=2.0, start_time=0.0,
                           clock=lambda: 60.0, reduce=lambda mine: mine)
    assert not alone.should_exit(7).stop


def test_handler_sets_the_flag_and_absorbs_repeats_until_the_saves_grace_ends():
    previous = signal.getsignal(signal.SIGUSR1)
    now = [100.0]
    controller = ExitController(signals=("SIGUSR1",), train_iters=5, grace_s=30.0,
                                reduce=lambda mine: mine, clock=lambda: now[0]).install()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert controller.received == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGUSR1)  # torchrun's forwarded copy: absorbed
        assert controller.repeats == 1 and signal.getsignal(signal.SIGUSR1) != signal.SIG_DFL
        assert controller.should_exit(2).reason.startswith("SIGUSR1 received")
        assert controller.stopping_since == 100.0  # the save's grace period starts
        now[0] = 130.0
        os.kill(os.getpid(), signal.SIGUSR1)  # within the grace: absorbed
        assert controller.repeats == 2
        with pytest.raises(TrainingInterrupted):
            controller.finish()
        assert signal.getsignal(signal.SIGUSR1) == controller._on_signal  # still absorbing
    finally:
        controller.uninstall()
        signal.signal(signal.SIGUSR1, previous)


def test_megatron_exit_flags_are_accepted_and_checked():
    args = parse_args(MOCK + ["--exit-signal-handler", "--exit-signal", "SIGUSR1",
                              "--exit-duration-in-mins", "230"])
    assert (args.run.exit_signal_handler, args.run.exit_signal,
            args.run.exit_duration_in_mins) == (True, "SIGUSR1", 230.0)
    with pytest.raises(ValueError, match="--exit-signal SIGUSR1 needs --exit-signal-handler"):
        parse_args(MOCK + ["--exit-signal", "SIGUSR1"])
    with pytest.raises(ValueError, match="--exit-duration-in-mins must be a finite number > 0"):
        parse_args(MOCK + ["--exit-duration-in-mins", "0"])


# ----- the --save lock ----------------------------------------------------------------------
def _holder(tmp_path, **changes) -> dict:
    owner = dict(current_owner().__dict__, **changes)
    (tmp_path / LOCK_NAME).write_text(json.dumps(owner))
    return owner


def test_a_live_holder_is_named_and_refused(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from odc_pp.training.checkpoint.save_lock import _start_ticks
        holder = _holder(tmp_path, job_id="slurm-42", pid=sleeper.pid,
                         start_ticks=_start_ticks(sleeper.pid))
        with pytest.raises(ValueError) as caught:
            SaveLock.acquire(str(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert (f"--save {tmp_path} is in use by job slurm-42 (host {holder['host']}, pid "
            f"{sleeper.pid}") in str(caught.value)
    assert json.loads((tmp_path / LOCK_NAME).read_text()) == holder  # untouched


def test_a_dead_holder_is_taken_over_with_a_message_and_released(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _holder(tmp_path, job_id="slurm-41", pid=gone.pid)
    lock = SaveLock.acquire(str(tmp_path))
    assert (f"took over the lock {tmp_path / LOCK_NAME}: its holder job slurm-41" in
            capsys.readouterr().out)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_another_hosts_lock_is_refused_unless_it_is_this_jobs_earlier_attempt(tmp_path,
                                                                              monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    _holder(tmp_path, host="elsewhere", job_id="slurm-7", pid=1, attempt=[0, 0])
    with pytest.raises(ValueError, match="on another host, whose heartbeat is 0 s old"):
        SaveLock.acquire(str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # the same job requeued on another node
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    lock = SaveLock.acquire(str(tmp_path))
    assert lock.owner.job_id == "slurm-7"
    assert lock.token != current_owner().token  # unique per start


# ----- saving: paths in errors, no leftovers, unique temporary names --------------------------
def _save(tmp_path, **kwargs):
    return save_checkpoint(str(tmp_path), 3, {"x": torch.ones(4)}, rank=0, world_size=1,
                           barrier=lambda: None, **kwargs)


def test_disk_full_names_the_path_and_leaves_no_temporary_directory(tmp_path, monkeypatch):
    def full(path, state):
        with open(path, "wb") as handle:
            handle.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing, "write_rank_file", full)
    with pytest.raises(CheckpointWriteError) as caught:
        _save(tmp_path, token="ab12", agree=lambda ok: ok)
    tmp = tmp_path / ".tmp_iter_0000003.ab12"
    assert str(caught.value) == (f"[Errno {errno.ENOSPC}] cannot write checkpoint path "
                                 f"{tmp / 'rank_00000.pt'}: No space left on device")
    assert os.listdir(tmp_path) == []


def test_a_peer_failure_fails_every_rank_and_removes_the_temporary_directory(tmp_path):
    with pytest.raises(CheckpointWriteError, match="another rank could not write its file"):
        # the peers agree that the job holds --save, then one fails to write its file
        verdicts = iter([True, False])
        _save(tmp_path, token="cd34", agree=lambda ok: next(verdicts))
    assert os.listdir(tmp_path) == []


def test_temporary_names_carry_the_job_token_and_count_as_leftovers(tmp_path):
    assert _save(tmp_path, token="0f0f") == str(tmp_path / "iter_0000003")
    (tmp_path / ".tmp_iter_0000005.0f0f").mkdir()
    (tmp_path / ".tmp_iter_0000006").mkdir()
    assert remove_leftovers(str(tmp_path)) == [".tmp_iter_0000005.0f0f", ".tmp_iter_0000006"]


def test_the_size_estimate_is_the_written_size_and_covers_retention(tmp_path):
    flat = torch.randn(3000)
    state = {"optimizer": {"master": [flat[:1000], flat[1000:]], "exp_avg": [torch.zeros(2000)],
                           "step": 5},
             "layout": [{"names": ["a", "b"], "offsets": [0, 1000]}],
             "rng": capture_rng_state(), "iteration": 0}
    path = tmp_path / "rank.pt"
    write_rank_file(str(path), state)
    actual = os.path.getsize(path)
    assert abs(checkpoint_bytes(state) - actual) <= 0.01 * actual, (checkpoint_bytes(state),
                                                                     actual)
    with_interval = parse_args(MOCK + ["--save", "s", "--save-interval", "5",
                                       "--keep-checkpoints", "3"]).checkpoint
    assert retained_copies(with_interval) == 4
    assert retained_copies(parse_args(MOCK + ["--save", "s"]).checkpoint) == 1


# ----- elastic restart ----------------------------------------------------------------------
def test_an_elastic_restart_loads_the_newest_checkpoint_in_save(tmp_path, monkeypatch, capsys):
    topo = types.SimpleNamespace(rank=0, world_size=1, pp=1, dp=1)
    args = parse_args(MOCK + ["--save", str(tmp_path), "--global-batch-size", "4"])
    assert adopt_elastic_restart(args, topo) is args.checkpoint  # first start: as given
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert adopt_elastic_restart(args, topo).load is None  # nothing saved yet: from scratch
    assert "elastic restart 1: --save" in capsys.readouterr().out  # "holds no checkpoint yet"
    _save(tmp_path, meta={"pp": 1, "dp": 2})
    loading = adopt_elastic_restart(args, topo)
    assert loading.load == str(tmp_path) and not loading.finetune
    assert args.checkpoint.load is None  # the flags are never rewritten
    out = capsys.readouterr().out
    assert (f"elastic restart 1: resuming from the newest verified checkpoint in --save "
            f"{tmp_path} (latest: iteration 3, saved by 1 ranks, pp 1 x dp 2); now 1 ranks, "
            f"pp 1 x dp 1; --global-batch-size 4 kept (4 microbatches of 1 per replica)") in out


# ----- tokenizer and vocabulary flags -------------------------------------------------------
def test_tokenizer_model_without_type_is_used_or_named(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hi"}\n')
    with pytest.raises(ValueError, match="--tokenizer-model '/no/such/tok' does not exist"):
        parse_args(["--data-path", str(data), "--tokenizer-model", "/no/such/tok"])
    args, notes = parse_args_with_notes(["--data-path", str(data), "--tokenizer-model",
                                         str(tmp_path)])
    assert args.data.tokenizer_type == "HuggingFaceTokenizer"
    assert f"note: --tokenizer-model {tmp_path} without --tokenizer-type: " \
           f"HuggingFaceTokenizer" in notes
    with pytest.raises(ValueError, match="ByteLevelTokenizer takes no --tokenizer-model"):
        parse_args(["--data-path", str(data), "--tokenizer-type", "ByteLevelTokenizer",
                    "--tokenizer-model", str(tmp_path)])
    with pytest.raises(ValueError, match="--tokenizer-model is not used with --mock-data"):
        parse_args(MOCK + ["--tokenizer-model", str(tmp_path)])
    assert parse_args(["--data-path", str(data)]).data.tokenizer_type == "ByteLevelTokenizer"


def test_pretokenized_ids_are_bounded_by_the_models_vocabulary(tmp_path):
    data = tmp_path / "ids.jsonl"
    data.write_text(json.dumps({"input_ids": [5, 300, 1000, 7]}) + "\n")
    with pytest.raises(ValueError, match=r"input_ids\[1\] = 300 is not a token id in \[0, 258\) "
                                         r"\(the tokenizer's vocabulary size\)"):
        JsonlDataset([str(data)], ByteLevelTokenizer(), 16)
    assert len(JsonlDataset([str(data)], ByteLevelTokenizer(), 16, vocab_size=1024)) == 1
    source, vocab = build_source(parse_args(["--data-path", str(data), "--vocab-size", "1024"]))
    assert vocab == 1024 and source.length(0) == 3  # 4 ids: 3 input positions
    with pytest.raises(ValueError, match=r"input_ids\[2\] = 1000 is not a token id in \[0, 512\) "
                                         r"\(the model's vocabulary size\)"):
        build_source(parse_args(["--data-path", str(data), "--vocab-size", "512"]))
    with pytest.raises(ValueError, match="the tokenizer has 258 tokens, more than --vocab-size 64"):
        build_source(parse_args(["--data-path", str(data), "--vocab-size", "64"]))
