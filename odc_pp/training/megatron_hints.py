"""What an unknown flag of a launch most likely meant: a Megatron-LM flag odc-pp does not
take (:data:`MEGATRON_HINTS`: its name and what odc-pp has for it), a Megatron-LM flag
misspelled (one of :data:`MEGATRON_HINTS` or of the pasted-flag table,
:data:`~odc_pp.training.megatron_flags.PASTED_FLAGS`, with its answer), and only then an
odc-pp flag of close spelling. Spelling alone misleads (``--sft`` is not ``--split``), so
Megatron's names come first and a suggestion needs a close match."""

from __future__ import annotations

import difflib
import re

__all__ = ["MEGATRON_HINTS", "CLOSE_MATCH", "unknown_line"]

MEGATRON_HINTS: dict[str, str] = {
    "--pretrained-checkpoint": "use --load DIR --finetune (the weights only, from iteration 0)",
    "--ckpt-step": "--load takes the newest checkpoint under DIR that verifies: point --load "
                   "at a directory holding the one wanted",
    "--no-save-optim": "odc-pp always saves the optimizer state (exact resume); export the "
                       "weights with tools/export_hf.py or tools/export_megatron.py",
    "--no-save-rng": "odc-pp always saves the RNG state (exact resume)",
    "--save-retain-interval": "use --keep-checkpoints K (the last K checkpoints of the run)",
    "--non-persistent-save-interval": "use --save-interval N",
    "--train-data-path": "use --data-path (validation data: --valid-data-path)",
    "--test-data-path": "odc-pp has no test split: validation data is --valid-data-path or "
                        "the valid part of --split",
    "--data-args-path": "give the data files with --data-path",
    "--per-split-data-args-path": "give --data-path and --valid-data-path",
    "--pipeline-model-parallel-layout": "uneven pipeline stages are not supported: use "
                                        "--num-model-chunks and --pipeline-schedule",
    "--log-l2-norm-grad-to-tensorboard": "grad-norm is written to TensorBoard with every "
                                         "record (--tensorboard-dir)",
    "--log-runtime-to-tensorboard": "iteration-time goes to TensorBoard with "
                                    "--log-timers-to-tensorboard",
    "--adam-eps": "odc-pp's AdamW eps is 1e-8, Megatron's default: drop the flag",
    "--use-torch-fsdp2": "use --dp-mode odc (parameters, gradients and optimizer state "
                         "sharded over the data-parallel ranks)",
}
"""Megatron-LM flags odc-pp does not take, with what it has for them."""

CLOSE_MATCH = 0.8
"""Least similarity (difflib's ratio of the names without dashes) of a suggestion."""


def _nearest(name: str, names) -> str | None:
    """The name of ``names`` closest in spelling to ``name`` (at least
    :data:`CLOSE_MATCH`), or None."""
    bare = {n.lstrip("-"): n for n in names}
    close = difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=CLOSE_MATCH)
    return bare[close[0]] if close else None


def _meaning(flag: str) -> str:
    """What odc-pp does with Megatron flag ``flag`` (a hint or the table's answer)."""
    from .megatron_flags import PASTED_FLAGS

    if flag in MEGATRON_HINTS:
        return f"Megatron-LM's flag, not taken: {MEGATRON_HINTS[flag]}"
    entry = PASTED_FLAGS[flag]
    kind = {"by-value": "answered by its value", "rejected": "refused"}.get(entry.action,
                                                                             entry.action)
    if entry.replacement or entry.value_to:
        kind += f" to {' '.join(entry.replacement) or entry.value_to}"
    return f"Megatron-LM's flag, {kind} here: {re.split('; |: ', entry.message, 1)[0]}"


def unknown_line(token: str, native: frozenset[str]) -> str:
    """The line for unknown flag ``token`` (``--name`` or ``--name=value``)."""
    from .megatron_flags import PASTED_FLAGS

    name = token.partition("=")[0]
    tail = "; python pretrain_gpt.py --help lists the flags, docs/megatron.md the " \
           "Megatron-LM flags odc-pp answers"
    if name in MEGATRON_HINTS:
        return f"{name}: {_meaning(name)}"
    megatron = _nearest(name, [*MEGATRON_HINTS, *PASTED_FLAGS])
    if megatron is not None:
        return f"{name}: unknown flag (did you mean {megatron}? {_meaning(megatron)}){tail}"
    own = _nearest(name, native)
    hint = f" (did you mean {own}?)" if own else ""
    return f"{name}: unknown flag{hint}{tail}"
