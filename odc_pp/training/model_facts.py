"""What the model flags decide before anything is built: the ``--hf-checkpoint`` config and
whether the output layer is tied to the embedding. Below :mod:`.job` (which resolves the
tied groups from it) and :mod:`.model_setup` (which builds the ModelConfig), it imports no
flag section: ``model`` is ``TrainingArgs.model`` (a ``ModelArgs``)."""

from __future__ import annotations

__all__ = ["hf_config_of", "ties_embeddings"]


def hf_config_of(model) -> dict | None:
    """The ``config.json`` of ``--hf-checkpoint`` (None without it)."""
    if not model.hf_checkpoint:
        return None
    from odc_pp.megatron.hf_config import read_hf_config

    return read_hf_config(model.hf_checkpoint)


def ties_embeddings(model) -> bool:
    """Tied embeddings as Megatron: tied unless ``--untie-embeddings-and-output-weights``
    (``--untie-embeddings``); with ``--hf-checkpoint`` tied as its config says."""
    hf = hf_config_of(model)
    if hf is not None:  # tied across stages too: the copies' gradients are summed
        return bool(hf.get("tie_word_embeddings")) and not model.untie_embeddings
    return not model.untie_embeddings  # Megatron's default: tied
