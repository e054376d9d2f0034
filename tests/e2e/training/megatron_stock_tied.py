"""torchrun script of test_megatron_tied.py: megatron-core's own tied GPTModel
(``share_embeddings_and_output_weights=True``, the model Megatron-LM builds without
``--untie-embeddings-and-output-weights``) and its dist_checkpointing, one process.

    megatron_stock_tied.py save ROOT       a random tied GPTModel -> ROOT/megatron
    megatron_stock_tied.py losses ROOT DIR the tied GPTModel loaded from DIR (a Megatron
                                           save directory): its loss of every batch in
                                           ROOT/batches.pt -> ROOT/<basename DIR>.json
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from megatron_stock import HEADS, HIDDEN, LAYERS, SEQ, VOCAB


def tied_gpt(groups):
    """The tied GPTModel of megatron_stock.py's shape (local layer spec, CPU attention)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from odc_pp.megatron.compat import HostDotProductAttention, prepare_megatron_for_device

    prepare_megatron_for_device("cpu")
    config = TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN,
                               num_attention_heads=HEADS, ffn_hidden_size=4 * HIDDEN,
                               hidden_dropout=0.0, attention_dropout=0.0,
                               use_cpu_initialization=True, bias_dropout_fusion=False,
                               masked_softmax_fusion=False, bias_activation_fusion=False,
                               gradient_accumulation_fusion=False, persist_layer_norm=False)
    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = HostDotProductAttention
    return GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                    pg_collection=groups, position_embedding_type="learned_absolute",
                    share_embeddings_and_output_weights=True)


def _state(model, groups):
    from odc_pp.megatron.compat import megatron_sharded_state_dict

    return {"model": megatron_sharded_state_dict(model, groups)}


def save(root):
    from megatron.core import dist_checkpointing

    from odc_pp.megatron.compat import cpu_dist_checkpointing

    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups()
    torch.manual_seed(0)
    model = tied_gpt(groups)
    assert model.output_layer.weight is None  # one weight: the embedding's
    with torch.no_grad():
        for param in model.parameters():  # biases and norms too: nothing at its init value
            param.normal_(0.0, 0.05)
    directory = os.path.join(root, "megatron", "iter_0000005")
    os.makedirs(directory)
    with cpu_dist_checkpointing():
        dist_checkpointing.save({**_state(model, groups), "iteration": 5,
                                 "checkpoint_version": 3.0}, directory)
    with open(os.path.join(root, "megatron", "latest_checkpointed_iteration.txt"), "w") as out:
        out.write("5\n")


def batch_loss(model, samples) -> float:
    """Megatron's token-weighted loss of one global batch (fp64 sums)."""
    from odc_pp.megatron.compat import causal_mask

    total = count = 0.0
    with torch.no_grad():
        for sample in samples:
            tokens = sample["tokens"]
            inputs, labels = tokens[:-1][None], tokens[1:]
            positions = sample["position_ids"]
            positions = torch.arange(len(labels)) if positions is None else positions
            logits = model(input_ids=inputs, position_ids=positions[None],
                           attention_mask=causal_mask(len(labels), "cpu"))
            losses = torch.nn.functional.cross_entropy(logits[0].double(), labels,
                                                       reduction="none")
            total += float((losses * sample["loss_mask"].double()).sum())
            count += float(sample["loss_mask"].double().sum())
    return total / count


def losses(root, save_dir):
    from megatron.core import dist_checkpointing

    from odc_pp.megatron.compat import cpu_dist_checkpointing

    from odc_pp.training.distributed import standalone_process_groups

    groups = standalone_process_groups()
    torch.manual_seed(100)  # other weights than the saved ones until loaded
    model = tied_gpt(groups)
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt")) as handle:
        iteration = int(handle.read())
    directory = os.path.join(save_dir, f"iter_{iteration:07d}")
    with cpu_dist_checkpointing():
        loaded = dist_checkpointing.load(_state(model, groups), directory)
    model.load_state_dict(loaded["model"])  # strict: every key of the tied model
    batches = torch.load(os.path.join(root, "batches.pt"))
    report = {"iteration": iteration,
              "losses": {str(it): batch_loss(model, samples) for it, samples in batches.items()}}
    with open(os.path.join(root, os.path.basename(save_dir) + ".json"), "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    {"save": save, "losses": losses}[sys.argv[1]](*sys.argv[2:])
    dist.barrier()
    dist.destroy_process_group()
