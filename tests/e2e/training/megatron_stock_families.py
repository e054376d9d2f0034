"""torchrun script of test_export_families.py: megatron-core's stock ``GPTModel`` (its
local layer spec; only the core attention is the CPU one) built from a family's
arguments, loaded with ``dist_checkpointing`` from a Megatron save directory, and its
loss of every batch. One process.

    megatron_stock_families.py losses ROOT FAMILY DIR
        ROOT/families.json[FAMILY] = {"config": TransformerConfig keywords,
        "model": GPTModel keywords}; writes {"iteration", "losses": {it: loss}} of the
        batches in ROOT/batches_FAMILY.pt to ROOT/stock_FAMILY.json
"""

import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist

from megatron_stock_tied import batch_loss


def stock_gpt(groups, family: dict):
    """megatron-core's GPTModel as Megatron-LM builds it from these arguments (``swiglu``:
    Megatron-LM's ``--swiglu``, a gated linear unit of SiLU)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from odc_pp.megatron.compat import HostDotProductAttention, prepare_megatron_for_device

    prepare_megatron_for_device("cpu")
    config = dict(family["config"])
    if config.pop("swiglu", False):
        config.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    config = TransformerConfig(**config, hidden_dropout=0.0, attention_dropout=0.0,
                               use_cpu_initialization=True, bias_dropout_fusion=False,
                               masked_softmax_fusion=False, bias_activation_fusion=False,
                               gradient_accumulation_fusion=False, persist_layer_norm=False)
    spec = get_gpt_layer_local_spec(normalization=config.normalization,
                                    qk_layernorm=config.qk_layernorm)
    spec.submodules.self_attention.submodules.core_attention = HostDotProductAttention
    return GPTModel(config, spec, pg_collection=groups, **family["model"])


@contextlib.contextmanager
def rope_on_the_cpu():
    """megatron's ``RotaryEmbedding.get_emb`` moves its frequencies to
    ``torch.cuda.current_device()``; without CUDA that device is the CPU here."""
    if torch.cuda.is_available():
        yield
        return
    current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"
    try:
        yield
    finally:
        torch.cuda.current_device = current_device


def losses(root, family_name, save_dir):
    from megatron.core import dist_checkpointing

    from odc_pp.megatron.compat import cpu_dist_checkpointing, megatron_sharded_state_dict
    from odc_pp.training.distributed import standalone_process_groups

    with open(os.path.join(root, "families.json")) as handle:
        family = json.load(handle)[family_name]
    groups = standalone_process_groups()
    torch.manual_seed(100)  # other weights than the saved ones until loaded
    model = stock_gpt(groups, family)
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt")) as handle:
        iteration = int(handle.read())
    directory = os.path.join(save_dir, f"iter_{iteration:07d}")
    with cpu_dist_checkpointing():
        loaded = dist_checkpointing.load(
            {"model": megatron_sharded_state_dict(model, groups)}, directory)
    model.load_state_dict(loaded["model"])  # strict: every key of the stock model
    batches = torch.load(os.path.join(root, f"batches_{family_name}.pt"))
    with rope_on_the_cpu():
        report = {"iteration": iteration, "losses": {
            str(it): batch_loss(model, samples) for it, samples in batches.items()}}
    with open(os.path.join(root, f"stock_{family_name}.json"), "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    {"losses": losses}[sys.argv[1]](*sys.argv[2:])
    dist.barrier()
    dist.destroy_process_group()
