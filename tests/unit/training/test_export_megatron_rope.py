"""tools/export_megatron.py (issue 51, item 2): the Llama-3 RoPE scaling the run trained
with is the exported model's (Megatron-LM's ``--use-rope-scaling``), scaling Megatron-LM
cannot express is refused naming it, and a save that fails leaves no ``iter_*``
directory behind (it is written into a temporary directory and renamed when complete)."""

import os
import sys

import pytest

from odc_pp.testing.torchrun import ROOT

sys.path.insert(0, os.path.join(ROOT, "tools"))
from export_megatron import MEGATRON_ROPE_SCALING, rope_scaling_of_meta  # noqa: E402


def _hf(original: int) -> dict:
    return {"model_type": "llama", "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": original}}


def test_rope_scaling_is_the_runs():
    assert rope_scaling_of_meta({}) is None
    assert rope_scaling_of_meta({"use_rope_scaling": False}) is None
    assert rope_scaling_of_meta({"use_rope_scaling": True, "rope_scaling_factor": 16.0}) == \
        {"factor": 16.0, **MEGATRON_ROPE_SCALING}
    assert rope_scaling_of_meta({"hf_config": _hf(8192)}) == \
        {"factor": 8.0, **MEGATRON_ROPE_SCALING}
    assert rope_scaling_of_meta({"hf_config": {"model_type": "qwen2"}}) is None


def test_rope_scaling_megatron_cannot_express_is_refused():
    with pytest.raises(ValueError, match="original_max_position_embeddings': 16.*not "
                                         "Megatron-LM's"):
        rope_scaling_of_meta({"hf_config": _hf(16)})


def _save_failing(rank: int, world_size: int, root: str) -> None:
    """One process (run_workers made its group): a save whose writer fails leaves nothing in ``root``."""
    from megatron.core import dist_checkpointing

    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.dist_ckpt import save_megatron_checkpoint
    from odc_pp.megatron.model import ModelConfig, build_chunks

    groups = standalone_process_groups()
    (chunk,) = build_chunks(ModelConfig(vocab_size=32, hidden_size=16, num_layers=2,
                                        num_attention_heads=2, max_sequence_length=8),
                            pp_rank=0, pp_size=1, process_groups=groups)

    def disk_full(state, directory, *args, **kwargs):
        with open(os.path.join(directory, "__0_0.distcp"), "wb") as handle:
            handle.write(b"part")
        raise OSError("No space left on device")

    dist_checkpointing.save = disk_full
    try:
        save_megatron_checkpoint(chunk, root, 3, process_groups=groups)
    except OSError as error:
        assert "No space" in str(error)
    else:
        raise AssertionError("the failing save returned")


def test_a_failed_save_leaves_no_iteration_directory(tmp_path):
    from odc_pp.testing.launch import LaunchConfig, run_workers

    run_workers(_save_failing, 1, str(tmp_path / "out"),
                config=LaunchConfig(timeout_s=120))
    assert os.listdir(tmp_path / "out") == []
