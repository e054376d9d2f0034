#!/usr/bin/env python3
"""Export a pretrain_gpt.py checkpoint (any pipeline / tensor / data-parallel layout) as a
Megatron-LM checkpoint in megatron-core's ``dist_checkpointing`` torch_dist format, which
``megatron.core.dist_checkpointing.load`` reads into a ``GPTModel`` at any pp / tp.

    python tools/export_megatron.py --load ckpt --output megatron_ckpt [--iteration 50]

The weights are the optimizer's fp32 master weights reassembled by name
(``tools/export_checkpoint.py``), put into a one-stage model built from the checkpoint's
model flags, and saved through that model's ``sharded_state_dict()`` (the keys of
megatron-core's local layer spec, norms under Transformer Engine's fused names; SwiGLU's
``linear_fc1`` as ``[gate; up]``) as ``megatron_ckpt/iter_<iteration>/`` with
``latest_checkpointed_iteration.txt``: written into a temporary directory beside it and
renamed when complete, the tracker last, so a failed export leaves no ``iter_*``. Every
model the trainer builds is written: GPT, and the Llama family (RMSNorm, SwiGLU, GQA,
RoPE with Llama-3 scaling as Megatron-LM's ``--use-rope-scaling``, Qwen2's qkv bias,
Qwen3's q/k norms, tied or not). A tied
model (trained without ``--untie-embeddings-and-output-weights``) is written as Megatron's
tied model expects: no ``output_layer.weight``; its pipeline copy must be bitwise equal to
the embedding, else the export is refused. Only the
model is written (fp32): in Megatron-LM load it with ``--no-load-optim --no-load-rng``
(``--finetune`` to restart the iteration count). Runs on a CPU-only machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_checkpoint import export  # noqa: E402  (the one full-state assembler)

from odc_pp.training.distributed import standalone_process_groups  # noqa: E402
from odc_pp.megatron.dist_ckpt import save_megatron_checkpoint  # noqa: E402
from odc_pp.megatron.hf_config import (  # noqa: E402
    MEGATRON_ROPE_SCALING, llama3_rope_scaling, megatron_rope_scaling)
from odc_pp.megatron.model import ModelConfig, build_chunks  # noqa: E402
from odc_pp.megatron.model_identity import megatron_args  # noqa: E402
from odc_pp.training.checkpoint.checkpointing import checkpoint_dir, read_meta  # noqa: E402

_OUTPUT = "model.output_layer.weight"
_EMBEDDING = "model.embedding.word_embeddings.weight"


def model_config_from_meta(meta: dict, *, tied: bool) -> ModelConfig:
    """The one-stage fp32 model a checkpoint's ``meta.json`` describes."""
    return ModelConfig(
        vocab_size=meta["vocab_size"], hidden_size=meta["hidden_size"],
        num_layers=meta["num_layers"], num_attention_heads=meta["num_attention_heads"],
        ffn_hidden_size=meta.get("ffn_hidden_size"),
        max_sequence_length=meta["max_position_embeddings"],
        normalization=meta.get("normalization", "LayerNorm"),
        norm_epsilon=meta.get("norm_epsilon", 1e-5),
        apply_layernorm_1p=meta.get("apply_layernorm_1p", False),
        activation="swiglu" if meta.get("swiglu") else "gelu",
        num_query_groups=meta.get("num_query_groups"), kv_channels=meta.get("kv_channels"),
        position_embedding_type=meta.get("position_embedding_type", "learned_absolute"),
        rotary_base=meta.get("rotary_base", 10000.0),
        add_bias_linear=not meta.get("disable_bias_linear", False),
        add_qkv_bias=meta.get("add_qkv_bias", False),
        qk_layernorm=meta.get("qk_layernorm", False), tie_embeddings=tied,
        rope_scaling=rope_scaling_of_meta(meta))


def rope_scaling_of_meta(meta: dict) -> dict | None:
    """The Llama-3 RoPE scaling the run trained with, as the trainer built it: from the
    ``--hf-checkpoint`` config the checkpoint records, else ``--use-rope-scaling`` with
    Megatron's fixed factors. ValueError for scaling a Megatron-LM model cannot express
    (``GPTModel`` takes only the factor)."""
    hf = meta.get("hf_config")
    if hf:
        scaling = llama3_rope_scaling(hf, "the checkpoint's hf_config")
    elif meta.get("use_rope_scaling"):
        scaling = megatron_rope_scaling(meta.get("rope_scaling_factor", 8.0))
    else:
        return None
    if scaling is not None:
        fixed = {key: scaling[key] for key in MEGATRON_ROPE_SCALING}
        if fixed != MEGATRON_ROPE_SCALING:
            raise ValueError(f"the model's Llama-3 RoPE scaling {fixed} is not Megatron-LM's "
                             f"(--use-rope-scaling fixes {MEGATRON_ROPE_SCALING}; only "
                             f"--rope-scaling-factor is a flag): a Megatron-LM model would "
                             f"compute other positions; export with tools/export_hf.py")
    return scaling


def tied_in_meta(meta: dict, state: dict) -> bool:
    """Whether the run was tied (``meta.json``'s ``tie_embeddings``; checkpoints written
    before it was recorded: tied when they hold no output layer)."""
    if "tie_embeddings" in meta:
        return bool(meta["tie_embeddings"])
    return _OUTPUT not in state


def without_tied_copy(state: dict, source: str) -> dict:
    """``state`` of a tied model without the output layer's copy (a model tied across
    pipeline stages saves one; Megatron's tied model has no output layer, and would
    ignore one). ValueError when the copy is not bitwise equal to the embedding: the tie
    was broken, and either weight alone would be another model."""
    if _OUTPUT not in state:
        return state
    copy, embedding = state[_OUTPUT], state[_EMBEDDING]
    if copy.shape != embedding.shape or not torch.equal(copy, embedding):
        error = float((copy.float() - embedding.float()).abs().max()) \
            if copy.shape == embedding.shape else float("nan")
        raise ValueError(f"{source} is tied (trained without "
                         f"--untie-embeddings-and-output-weights) but its output layer differs "
                         f"from the embedding (max abs difference {error:.3g}): refusing to "
                         f"write a tied Megatron model from two different weights")
    return {name: value for name, value in state.items() if name != _OUTPUT}


def _init_single_process_group() -> None:
    if dist.is_initialized():
        return
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)


def export_megatron(load: str, output: str, iteration: int | None = None) -> tuple[int, str]:
    """(iteration, directory written)."""
    iteration, state = export(load, iteration)
    meta = read_meta(checkpoint_dir(load, iteration))
    _init_single_process_group()
    groups = standalone_process_groups()
    config = model_config_from_meta(meta, tied=tied_in_meta(meta, state))
    if config.tie_embeddings:
        state = without_tied_copy(state, f"checkpoint {load} iteration {iteration}")
    (chunk,) = build_chunks(config, pp_rank=0, pp_size=1, process_groups=groups)
    params = dict(chunk.global_named_parameters())
    if sorted(params) != sorted(state):
        raise ValueError(f"checkpoint {load} iteration {iteration} does not match the model its "
                         f"meta.json describes: {sorted(set(params) ^ set(state))[:4]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])
    return iteration, save_megatron_checkpoint(chunk, output, iteration, process_groups=groups,
                                               args=megatron_args(config))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", required=True, help="the --save directory of the run")
    parser.add_argument("--output", required=True,
                        help="Megatron-LM save directory to write (iter_*/ and tracker)")
    parser.add_argument("--iteration", type=int, help="default: the latest checkpoint")
    args = parser.parse_args(argv)
    try:
        iteration, directory = export_megatron(args.load, args.output, args.iteration)
    except ValueError as error:
        print(f"export_megatron.py: error: {error}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    print(f"wrote {directory}: iteration {iteration}, megatron-core torch_dist")
    return 0


if __name__ == "__main__":
    sys.exit(main())
