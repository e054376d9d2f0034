"""--wandb-project: the training log's record also goes to Weights & Biases. Tested in
wandb's offline mode: the offline run directory is written and its history holds the
logged keys (read back from the run's .wandb file)."""

import glob
import json
import os
import struct
import sys

import pytest

from odc_pp.testing.torchrun import TINY_MODEL, launch
from odc_pp.training.arguments import parse_args
from odc_pp.training.logging_utils import TrainingLogger, flat_scalars, wandb_settings

_BLOCK = 32768  # the .wandb file: a leveldb-style log of protobuf Records in 32 KiB blocks
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_records(path: str) -> list[bytes]:
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    records, pending, offset = [], b"", 7
    while offset + 7 <= len(data):
        left_in_block = _BLOCK - offset % _BLOCK
        if left_in_block < 7:  # block trailer
            offset += left_in_block
            continue
        length, kind = struct.unpack("<HB", data[offset + 4:offset + 7])
        payload = data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == _FULL:
            records.append(payload)
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            records.append(pending + payload)
    return records


def _history(run_dir: str) -> list[dict]:
    """Every history row ``{key: value}`` of an offline run directory."""
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    rows = []
    for data in _wandb_records(glob.glob(os.path.join(run_dir, "run-*.wandb"))[0]):
        record = pb.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def _offline_run(save_dir) -> str:
    runs = glob.glob(os.path.join(str(save_dir), "wandb", "offline-run-*"))
    assert len(runs) == 1, runs
    return runs[0]


RECORD = {"iteration": 3, "loss": 2.5, "lr": 1e-3, "grad_norm": 0.7, "tokens_per_s": 100.0,
          "step_s": 0.5,
          "tflops_per_device": None, "idle_s": [0.1, 0.2], "skipped": False}


def test_logger_writes_the_record_to_an_offline_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = TrainingLogger(train_iters=5, log_json=str(tmp_path / "log.jsonl"),
                            progress_bar=False, stream=open(os.devnull, "w"),
                            wandb_project="odc-pp-test", wandb_exp_name="unit",
                            wandb_save_dir=str(tmp_path), wandb_config={"seed": 7})
    logger.log(RECORD)
    logger.log(dict(RECORD, iteration=4, loss=2.25))
    logger.log_eval({"iteration": 4, "eval_loss": 2.0, "eval_ppl": 7.5, "eval_tokens": 96})
    logger.close()
    pytest.importorskip("wandb").teardown()  # finish() returns before wandb-core has written
    rows = _history(_offline_run(tmp_path))
    assert [row["loss"] for row in rows] == [2.5, 2.25]
    assert [row["_step"] for row in rows] == [3, 4]
    assert (rows[1]["valid/loss"], rows[1]["valid/ppl"]) == (2.0, 7.5)  # the same step's row
    expected = flat_scalars(RECORD)
    assert set(expected) <= set(rows[0]), sorted(set(expected) - set(rows[0]))
    assert rows[0]["idle_s/rank1"] == 0.2 and rows[0]["skipped"] == 0.0
    assert json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0]) == RECORD


def test_wandb_flags_name_what_is_wrong(monkeypatch):
    base = ["--mock-data", "--vocab-size", "48"]
    with pytest.raises(ValueError, match="--wandb-exp-name needs --wandb-project"):
        parse_args(base + ["--wandb-exp-name", "x"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ValueError, match="--wandb-project 'p' needs the wandb package"):
        parse_args(base + ["--wandb-project", "p"])
    args = parse_args(base + ["--save", "/tmp/ckpt"])
    assert wandb_settings(args) == {}
    with pytest.raises(RuntimeError, match="pip install 'odc-pp\\[wandb\\]'"):
        TrainingLogger(train_iters=1, wandb_project="p", stream=open(os.devnull, "w"))


@pytest.mark.multiproc
def test_pretrain_gpt_logs_to_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = launch(TINY_MODEL + ["--train-iters", "2", "--pipeline-schedule", "1f1b",
                               "--eval-interval", "2", "--eval-iters", "1",
                               "--wandb-project", "odc-pp-test", "--wandb-exp-name", "e2e",
                               "--wandb-save-dir", str(tmp_path)],
                 nproc=1, tmp_path=tmp_path, name="wandb")
    assert run.returncode == 0, run.describe()
    rows = _history(_offline_run(tmp_path))
    logged = run.records()
    (evaluated,) = run.eval_records()
    assert rows[-1]["valid/loss"] == pytest.approx(evaluated["eval_loss"], rel=1e-12)
    assert [row["loss"] for row in rows] == pytest.approx([r["loss"] for r in logged],
                                                          rel=1e-12)
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_s", "idle_s/rank0",
                "peak_memory_mb", "skipped"):
        assert key in rows[-1], (key, sorted(rows[-1]))
