"""Flags users paste from existing Megatron-LM scripts that odc-pp does not take as they are.

Each pasted flag is answered, none silently ignored (:mod:`.megatron_flag_kinds`):
honoured or a no-op at its value (dropped, a note in the log), mapped to odc-pp's own flag
(a note), or rejected (one line naming the flag, why, and what to use). Megatron values of
odc-pp's own flags (``--attention-backend fused``) are rewritten with a note.

:data:`PASTED_FLAGS` is the one table (this module's entries and those of Megatron-LM's
``examples/`` scripts, :mod:`.megatron_example_flags`); :func:`translate_all` applies it to
``argv`` before argparse sees it and collects every problem, so a pasted script gets all its
answers in its first launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .megatron_example_flags import EXAMPLE_FLAGS, NATIVE_VALUES, PREFIX_FLAGS
from .megatron_flag_kinds import PastedFlag, honoured, mapped, noop, rejected, value_of
from .megatron_sft_flags import SFT_FLAGS, TOKENIZER_VALUES, virtual_pipeline

__all__ = ["PastedFlag", "PASTED_FLAGS", "PREFIX_FLAGS", "Translation", "answer_for",
           "outcome", "translate", "translate_all"]


PASTED_FLAGS: dict[str, PastedFlag] = {
    "--use-distributed-optimizer": honoured(
        "optimizer state is always sharded over the data-parallel group (ODC / collective "
        "engines keep fp32 master weights and AdamW moments per owned shard; --dp-mode ddp "
        "is Megatron's DDP with this distributed optimizer)"),
    "--overlap-grad-reduce": honoured(
        "gradient reduction overlaps compute: with --dp-mode odc and collective each unit's "
        "gradient is pushed to its owners as soon as its weight gradients are complete; "
        "with --dp-mode ddp each chunk's reduce-scatter starts after its last weight "
        "gradient"),
    "--ddp-bucket-size": noop(
        "--dp-mode ddp reduce-scatters each model chunk's gradients as one bucket",
        takes_value=True),
    "--overlap-param-gather": honoured(
        "accepted, but there is nothing to switch on: pretrain_gpt.py gathers each model "
        "chunk's parameters once per minibatch, at the chunk's first action, and keeps them "
        "until the optimizer step (that first gather is not prefetched; the helper-thread "
        "prefetch of the next unit belongs to the engine's module_hooks driver, not to the "
        "pipeline runtime)"),
    "--calculate-per-token-loss": honoured(
        "the loss is always the mean over every scored token of the global batch "
        "(per-token, independent of the microbatch and replica split)"),
    "--untie-embeddings-and-output-weights": mapped(
        "input embeddings and the output layer are separate weights (tied without it, as "
        "in Megatron; with --hf-checkpoint as its config says)", "--untie-embeddings"),
    "--no-rope-fusion": mapped(
        "RoPE runs megatron's unfused formula (no Transformer Engine or Triton kernel)",
        "--fused-rope", "off"),
    "--no-position-embedding": honoured(
        "--position-embedding-type rope adds no learned position embedding"),
    "--accumulate-allreduce-grads-in-fp32": honoured(
        "gradients are always accumulated and reduced in fp32"),
    "--no-gradient-accumulation-fusion": noop(
        "odc-pp needs no apex: on CUDA its weight-gradient GEMM adds into the fp32 main_grad "
        "itself (the sum Megatron's fusion computes; the flag does not turn it off)"),
    "--no-masked-softmax-fusion": honoured("odc-pp never uses the fused masked softmax"),
    "--no-bias-gelu-fusion": honoured("odc-pp never uses the fused bias-GeLU"),
    "--no-bias-dropout-fusion": honoured("odc-pp never uses the fused bias-dropout-add"),
    "--log-throughput": honoured(
        "throughput (tokens/s, TFLOP/s per device, MFU with --peak-tflops) is always logged"),
    "--use-flash-attn": rejected(
        "--use-flash-attn: flash attention comes with Transformer Engine, which odc-pp does "
        "not run yet (its split backward is not implemented); drop the flag (attention runs "
        "megatron-core's local DotProductAttention)"),
    "--recompute-activations": mapped(
        "--recompute-activations (selective recompute) maps to --recompute-lgd: odc-pp "
        "recomputes layernorm, GeLU and dropout outputs rather than core attention",
        "--recompute-lgd"),
    "--recompute-granularity": PastedFlag(
        takes_value=True, action="by-value",
        message="--recompute-granularity takes 'selective' or 'full'",
        by_value=(("selective", mapped(
            "--recompute-granularity selective maps to --recompute-lgd: odc-pp recomputes "
            "layernorm, GeLU and dropout outputs rather than core attention",
            "--recompute-lgd")),
                  ("full", mapped(
                      "--recompute-granularity full maps to --recompute-full: whole "
                      "transformer layers recomputed in B (with --recompute-method and "
                      "--recompute-num-layers, as Megatron)", "--recompute-full")))),
    "--transformer-impl": PastedFlag(
        takes_value=True, action="by-value",
        message="--transformer-impl takes 'local' here; 'transformer_engine' is not supported "
                "yet (its split backward is not implemented): use --transformer-impl local",
        by_value=(("local", honoured(
            "--transformer-impl local: odc-pp builds megatron-core's local layers")),)),
}
PASTED_FLAGS.update(EXAMPLE_FLAGS)
PASTED_FLAGS.update(SFT_FLAGS)
NATIVE_VALUES.update(TOKENIZER_VALUES)


def answer_for(name: str) -> PastedFlag | None:
    """The table's answer to flag ``name`` (by name, else by a prefix family)."""
    entry = PASTED_FLAGS.get(name)
    if entry is None:
        entry = next((e for prefix, e in PREFIX_FLAGS.items() if name.startswith(prefix)),
                     None)
    return entry


@dataclass(kw_only=True)
class Translation:
    """``argv`` after the pasted Megatron flags are answered."""

    argv: list[str] = field(default_factory=list)
    """The command line for odc-pp's parser."""
    notes: list[str] = field(default_factory=list)
    """One log note per honoured, mapped or no-op flag."""
    problems: list[str] = field(default_factory=list)
    """One line per rejected flag: the flag, why, what to use."""


def _take_values(argv: list[str], index: int, entry: PastedFlag, name: str, inline: str | None,
                 prefix_family: bool) -> tuple[str | None, int]:
    """(the value(s) after ``argv[index]``, the index after them)."""
    if inline is not None:
        return inline, index + 1
    if prefix_family:  # unknown arity: a following non-flag token is its value
        has_value = index + 1 < len(argv) and not argv[index + 1].startswith("--")
        return (argv[index + 1], index + 2) if has_value else (None, index + 1)
    if not entry.takes_value:
        return None, index + 1
    values = argv[index + 1:index + 1 + entry.nargs]
    if len(values) < entry.nargs or any(v.startswith("--") for v in values):
        raise ValueError(f"{name} expects {entry.nargs} value{'s' * (entry.nargs > 1)}")
    return " ".join(values), index + 1 + entry.nargs


def _line(name: str, value: str | None, message: str) -> str:
    shown = name if value is None else f"{name} {value}"
    return message if message.startswith(name) else f"{shown}: {message}"


def _native_value(argv: list[str], index: int, out: list[str], result: Translation) -> int | None:
    """Rewrite a Megatron value of an odc-pp flag (``--attention-backend fused``); the
    index after it, or None when ``argv[index]`` is not one."""
    name, has_inline, inline = argv[index].partition("=")
    value = inline if has_inline else (argv[index + 1] if index + 1 < len(argv) else None)
    answer = NATIVE_VALUES.get((name, value))
    if answer is None:
        return None
    tokens, note, needs = answer
    if needs is not None and needs not in argv:
        result.problems.append(f"{name} {value}: {note} (needs {needs})")
    else:
        out.extend(tokens)
        result.notes.append(f"note: {name} {value}: {note}")
    return index + (1 if has_inline else 2)


def translate_all(argv: list[str], native: frozenset[str] = frozenset()) -> Translation:
    """Answer every pasted Megatron flag of ``argv`` (flags in ``native``, odc-pp's own,
    are left to its parser): the rewritten command line, the notes and the problems."""
    result, out, index = Translation(), [], 0
    argv, result.notes, result.problems = virtual_pipeline(argv)
    while index < len(argv):
        token = argv[index]
        name, has_inline, inline = token.partition("=")
        after = _native_value(argv, index, out, result)
        if after is not None:
            index = after
            continue
        entry = None if name in native else answer_for(name)
        if entry is None:
            out.append(token)
            index += 1
            continue
        family = name not in PASTED_FLAGS
        try:
            value, index = _take_values(argv, index, entry, name,
                                        inline if has_inline else None, family)
        except ValueError as exc:
            result.problems.append(str(exc))
            index += 1
            continue
        if has_inline and not entry.takes_value and not family:
            result.problems.append(f"{name} takes no value, got {token!r}")
            continue
        _answer(name, value, entry.for_value(value), argv, out, result)
    result.argv = out
    return result


def _answer(name: str, value: str | None, entry: PastedFlag, argv: list[str], out: list[str],
            result: Translation) -> None:
    """Apply one flag's answer to ``out`` and ``result``."""
    if entry.action == "rejected":
        if entry.implied_by and entry.implied_by in argv:
            result.notes.append(f"note: {name}: implied by {entry.implied_by}")
        else:
            result.problems.append(_line(name, value, entry.message))
        return
    if entry.value_to is not None:
        problem = entry.check(value) if entry.check is not None else None
        if problem is not None:
            result.problems.append(_line(name, value, problem))
            return
        given = value_of(argv, entry.value_to)
        if given is not None and given != value:
            result.problems.append(f"{name} {value} and {entry.value_to} {given} disagree: "
                                   f"give one")
            return
        out.extend([entry.value_to, value])
    elif entry.replacement and entry.replacement[0] not in out + argv:
        out.extend(entry.replacement)
    kind = "" if entry.action == "honoured" else f"{entry.action}: "
    shown = name if value is None else f"{name} {value}"
    result.notes.append(f"note: {shown}: {kind}{entry.message}")


def outcome(tokens: list[str], native: frozenset[str], context: list[str] = ()) -> tuple[str, str]:
    """(action, note) of one flag with its value(s) (``tokens``) in a command line that
    also holds ``context``: ``native`` (odc-pp's own flag), ``mapped`` (a Megatron value of
    an odc-pp flag, or a table entry), ``honoured``, ``no-op`` or ``rejected``."""
    name, value = tokens[0], " ".join(tokens[1:]) or None
    answer = NATIVE_VALUES.get((name, value))
    if answer is not None:
        tokens_to, note, needs = answer
        if needs is not None and needs not in context:
            return "rejected", f"{note} (needs {needs})"
        return ("mapped" if tokens_to else "no-op"), note
    if name in native:
        return "native", ""
    entry = answer_for(name)
    if entry is None:
        return "unknown", ""
    entry = entry.for_value(value)
    if entry.action == "rejected" and entry.implied_by and entry.implied_by in context:
        return "no-op", f"implied by {entry.implied_by}"
    return entry.action, entry.message


def translate(argv: list[str], native: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """``argv`` with pasted Megatron flags dropped or rewritten, and the log notes.

    Raises one ``ValueError`` with a line per rejected flag."""
    result = translate_all(argv, native)
    if result.problems:
        raise ValueError("\n".join(result.problems))
    return result.argv, result.notes
