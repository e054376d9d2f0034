"""Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh flags (tests/data, sizes shrunk)
launched with torchrun on 2 ranks: the refusals come once per job, one line each, exit 2;
without them the job trains, saying once what each pasted flag became."""

from odc_pp.testing.torchrun import launch
from tests.unit.training.test_megatron_scripts import SCRIPTS, argv_of, read_flags, shrunk

SCRIPT = "train_llama3_8b_h100_fp8"


def _flags(tmp_path, *, refused: bool) -> list[str]:
    flags = shrunk(read_flags(SCRIPT), tmp_path)
    if not refused:
        flags = [tokens for tokens in flags if tokens[0] not in SCRIPTS[SCRIPT]]
    return argv_of(flags) + ["--no-progress-bar", "--trace", str(tmp_path / "trace.json")]


def test_refusals_print_once_per_job_without_usage(tmp_path):
    run = launch(_flags(tmp_path, refused=True), nproc=2, tmp_path=tmp_path, name="refused",
                 log=False, timeout=120)
    assert run.returncode != 0, run.describe()
    assert run.stderr.count("pretrain_gpt.py: error: 3 flags not taken:") == 1, run.describe()
    for flag in SCRIPTS[SCRIPT]:
        assert run.stderr.count(f"  {flag}") == 1, run.describe()
    assert "usage:" not in run.stderr


def test_the_script_trains_with_its_refusals_dropped(tmp_path):
    run = launch(_flags(tmp_path, refused=False), nproc=2, tmp_path=tmp_path, name="llama",
                 timeout=240)
    assert run.returncode == 0, run.describe()
    assert len(run.records()) == 4  # --train-samples 32 / --global-batch-size 8
    for note in ("note: --use-mcore-models:", "note: --sequence-parallel at "
                 "--tensor-model-parallel-size 1", "note: --train-samples 32 -> --train-iters 4",
                 "note: --attention-backend fused:"):
        assert run.stdout.count(note) == 1, run.describe()
