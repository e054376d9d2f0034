"""pretrain_gpt.py --hf-checkpoint DIR without --tokenizer-model (issue 51, item 1): the run
tokenizes with DIR's own tokenizer and says so first (name and vocabulary); the
checkpoint records it with the SHA-256 of its files; tools/export_hf.py ships it, and
refuses it once its files changed, or when the run used the byte-level tokenizer
(asked for with --tokenizer-type) and --tokenizer-from would ship DIR's."""

import json
import os
import subprocess
import sys

import pytest

from odc_pp.testing.torchrun import ROOT, launch
from tests.unit.training.test_tokenizer_default import _data, _flags, _hf_dir

pytestmark = pytest.mark.multiproc
pytest.importorskip("transformers")


def _export(load, output, *extra):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "export_hf.py"),
                           "--load", load, "--output", output, *extra],
                          env=dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore"),
                          capture_output=True, text=True, timeout=300)


def _train(tmp_path, hf_dir, name, *extra):
    save = str(tmp_path / name)
    run = launch(_flags(hf_dir, _data(tmp_path), "--train-iters", "1", "--lr", "1e-3",
                        "--no-progress-bar", "--save", save, *extra),
                 nproc=1, tmp_path=tmp_path, name=name)
    assert run.returncode == 0, run.describe()
    return save, run


def test_the_run_names_records_and_ships_the_checkpoints_tokenizer(tmp_path):
    hf_dir = _hf_dir(tmp_path)
    save, run = _train(tmp_path, hf_dir, "own")
    first = [line for line in run.stdout.splitlines() if not line.startswith("note:")][0]
    assert first.startswith(f"tokenizer: HuggingFaceTokenizer {hf_dir} (the --hf-checkpoint's "
                            f"own), vocabulary 27 tokens"), run.stdout[:2000]
    meta = json.loads((tmp_path / "own" / "iter_0000001" / "meta.json").read_text())
    assert meta["tokenizer_type"] == "HuggingFaceTokenizer"
    assert meta["tokenizer_dir"] == os.path.abspath(hf_dir)
    assert len(meta["tokenizer_sha256"]) == 64

    done = _export(save, str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"tokenizer from {hf_dir}" in done.stdout
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == \
        open(os.path.join(hf_dir, "tokenizer.json"), "rb").read()

    with open(os.path.join(hf_dir, "tokenizer_config.json"), "a") as handle:
        handle.write("\n")  # the directory's tokenizer is no longer the one trained with
    refused = _export(save, str(tmp_path / "changed"))
    assert refused.returncode == 2
    assert "its tokenizer files differ from those the run trained with" in refused.stderr
    assert not (tmp_path / "changed").exists()  # refused before any weight is written


def test_a_byte_level_run_ships_no_other_tokenizer(tmp_path):
    hf_dir = _hf_dir(tmp_path, vocab=264)
    save, run = _train(tmp_path, hf_dir, "bytes", "--tokenizer-type", "ByteLevelTokenizer")
    assert "tokenizer: ByteLevelTokenizer, vocabulary 258 tokens" in run.stdout
    meta = json.loads((tmp_path / "bytes" / "iter_0000001" / "meta.json").read_text())
    assert meta["tokenizer_type"] == "ByteLevelTokenizer" and meta["tokenizer_dir"] is None
    done = _export(save, str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (tmp_path / "out" / "tokenizer.json").exists()  # none shipped by default
    refused = _export(save, str(tmp_path / "other"), "--tokenizer-from", hf_dir)
    assert refused.returncode == 2
    assert "the run trained with ByteLevelTokenizer" in refused.stderr
