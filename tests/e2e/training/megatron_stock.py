"""torchrun script of test_megatron_checkpoint.py: megatron-core alone (its GPTModel and
dist_checkpointing; only the core attention is the CPU one). Run under torchrun, not
run_workers: megatron's torch_dist writer starts processes of its own.

    megatron_stock.py save ROOT     (1 process) a random GPTModel -> ROOT/megatron + logits
    megatron_stock.py load_tp2 ROOT (2 processes) ROOT/exported -> GPTModel at tp=2: logits
"""

import json
import os
import sys

import torch
import torch.distributed as dist

LAYERS, HIDDEN, HEADS, SEQ, VOCAB = 4, 32, 4, 16, 48


def _stock_gpt(groups, tp: int = 1):
    """megatron-core's GPTModel with its local layer spec; only the core attention is the
    CPU one (megatron's allocates its score buffer on CUDA)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from odc_pp.megatron.compat import HostDotProductAttention, prepare_megatron_for_device

    prepare_megatron_for_device("cpu")
    config = TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN,
                               num_attention_heads=HEADS, ffn_hidden_size=4 * HIDDEN,
                               hidden_dropout=0.0, attention_dropout=0.0,
                               tensor_model_parallel_size=tp, use_cpu_initialization=True,
                               bias_dropout_fusion=False, masked_softmax_fusion=False,
                               bias_activation_fusion=False, gradient_accumulation_fusion=False,
                               persist_layer_norm=False)
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = HostDotProductAttention
    return GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                    pg_collection=groups, position_embedding_type="learned_absolute")


def _logits(model, tokens):
    from odc_pp.megatron.compat import causal_mask

    positions = torch.arange(SEQ).expand_as(tokens)
    with torch.no_grad():
        return model(input_ids=tokens, position_ids=positions,
                     attention_mask=causal_mask(SEQ, "cpu"))


def save(root):
    from megatron.core import dist_checkpointing

    from odc_pp.megatron.compat import cpu_dist_checkpointing, megatron_sharded_state_dict
    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups()
    torch.manual_seed(0)
    model = _stock_gpt(groups)
    with torch.no_grad():
        for param in model.parameters():  # biases and norms too: nothing at its init value
            param.normal_(0.0, 0.05)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    torch.save({"tokens": tokens, "logits": _logits(model, tokens)},
               os.path.join(root, "reference.pt"))
    save = os.path.join(root, "megatron")
    os.makedirs(os.path.join(save, "iter_0000005"))
    with cpu_dist_checkpointing():
        dist_checkpointing.save({"model": megatron_sharded_state_dict(model, groups),
                                 "iteration": 5, "checkpoint_version": 3.0},
                                os.path.join(save, "iter_0000005"))
    with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as handle:
        handle.write("5\n")


def load_tp2(root):
    """dist_checkpointing.load of the exported checkpoint into a stock GPTModel at tp=2."""
    from megatron.core import dist_checkpointing

    from odc_pp.megatron.compat import cpu_dist_checkpointing, megatron_sharded_state_dict
    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups(tp=dist.new_group([0, 1]))
    torch.manual_seed(100 + dist.get_rank())  # other weights than the saved ones until loaded
    model = _stock_gpt(groups, tp=2)
    with open(os.path.join(root, "exported", "latest_checkpointed_iteration.txt")) as handle:
        iteration = int(handle.read())
    directory = os.path.join(root, "exported", f"iter_{iteration:07d}")
    with cpu_dist_checkpointing():
        loaded = dist_checkpointing.load({"model": megatron_sharded_state_dict(model, groups)},
                                         directory)
    model.load_state_dict(loaded["model"])
    reference = torch.load(os.path.join(root, "reference.pt"))
    shard = _logits(model, reference["tokens"])  # [b, s, vocab / 2]
    shards = [torch.empty_like(shard) for _ in range(2)]
    dist.all_gather(shards, shard.contiguous(), group=groups.tp)
    error = float((torch.cat(shards, dim=-1) - reference["logits"]).abs().max())
    if dist.get_rank() == 0:
        with open(os.path.join(root, "stock_tp2.json"), "w") as handle:
            json.dump({"max_abs_error": error, "iteration": iteration}, handle)



if __name__ == "__main__":
    dist.init_process_group("gloo")
    {"save": save, "load_tp2": load_tp2}[sys.argv[1]](sys.argv[2])
    dist.barrier()
    dist.destroy_process_group()
