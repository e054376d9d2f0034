"""Flags users paste from existing Megatron-LM scripts that odc-pp does not take as they are.

Each pasted flag is handled in one of three ways, and none is silently ignored:

* ``honoured``: odc-pp already does what the flag asks; the flag is dropped and a note says
  so in the log.
* ``mapped``: the flag is rewritten to odc-pp's own equivalent, with a note.
* ``rejected``: there is no equivalent; one ``ValueError`` names the flag and what to use.

:data:`PASTED_FLAGS` is the one table; :func:`translate` applies it to ``argv`` before
argparse sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PastedFlag", "PASTED_FLAGS", "translate"]


@dataclass(frozen=True, kw_only=True)
class PastedFlag:
    """How one Megatron-LM flag is handled."""

    takes_value: bool
    """Whether the flag is followed by one value (``--transformer-impl local``)."""
    action: str
    """``honoured``, ``mapped`` or ``rejected``; for value flags see ``by_value``."""
    message: str
    """The note (honoured/mapped) or the error (rejected)."""
    replacement: tuple[str, ...] = ()
    """odc-pp flags that replace it (``mapped``)."""
    by_value: tuple[tuple[str, "PastedFlag"], ...] = ()
    """Value flags: the handling per accepted value; other values are rejected."""

    def __post_init__(self) -> None:
        if self.action not in ("honoured", "mapped", "rejected", "by-value"):
            raise ValueError(f"unknown action {self.action!r}")


def _honoured(message: str) -> PastedFlag:
    return PastedFlag(takes_value=False, action="honoured", message=message)


def _mapped(message: str, *replacement: str) -> PastedFlag:
    return PastedFlag(takes_value=False, action="mapped", message=message,
                      replacement=replacement)


def _rejected(message: str, *, takes_value: bool = False) -> PastedFlag:
    return PastedFlag(takes_value=takes_value, action="rejected", message=message)


PASTED_FLAGS: dict[str, PastedFlag] = {
    "--use-distributed-optimizer": _honoured(
        "optimizer state is always sharded over the data-parallel group (ODC / collective "
        "engines keep fp32 master weights and AdamW moments per owned shard)"),
    "--overlap-grad-reduce": _honoured(
        "gradient reduction overlaps compute: with --dp-mode odc and collective each unit's "
        "gradient is pushed to its owners as soon as its weight gradients are complete"),
    "--overlap-param-gather": _honoured(
        "accepted, but there is nothing to switch on: pretrain_gpt.py gathers each model "
        "chunk's parameters once per minibatch, at the chunk's first action, and keeps them "
        "until the optimizer step (that first gather is not prefetched; the helper-thread "
        "prefetch of the next unit belongs to the engine's module_hooks driver, not to the "
        "pipeline runtime)"),
    "--calculate-per-token-loss": _honoured(
        "the loss is always the mean over every scored token of the global batch "
        "(per-token, independent of the microbatch and replica split)"),
    "--untie-embeddings-and-output-weights": _mapped(
        "input embeddings and the output layer are separate weights; with an --hf-checkpoint "
        "whose config ties them this means --untie-embeddings", "--untie-embeddings"),
    "--no-rope-fusion": _honoured(
        "RoPE is unfused on CPU; on GPU it is fused only when Transformer Engine is installed"),
    "--no-position-embedding": _honoured(
        "--position-embedding-type rope adds no learned position embedding"),
    "--accumulate-allreduce-grads-in-fp32": _honoured(
        "gradients are always accumulated and reduced in fp32"),
    "--no-gradient-accumulation-fusion": _honoured(
        "odc-pp never uses the fused (apex) weight-gradient accumulation"),
    "--no-masked-softmax-fusion": _honoured("odc-pp never uses the fused masked softmax"),
    "--no-bias-gelu-fusion": _honoured("odc-pp never uses the fused bias-GeLU"),
    "--no-bias-dropout-fusion": _honoured("odc-pp never uses the fused bias-dropout-add"),
    "--log-throughput": _honoured(
        "throughput (tokens/s, TFLOP/s per device, MFU with --peak-tflops) is always logged"),
    "--use-flash-attn": _rejected(
        "--use-flash-attn: flash attention comes with Transformer Engine, which odc-pp does "
        "not run yet (its split backward is not implemented); drop the flag (attention runs "
        "megatron-core's local DotProductAttention)"),
    "--fp16": _rejected("--fp16 is not supported; use --bf16 (fp32 master weights)"),
    "--recompute-activations": _mapped(
        "--recompute-activations (selective recompute) maps to --recompute-lgd: odc-pp "
        "recomputes layernorm, GeLU and dropout outputs rather than core attention",
        "--recompute-lgd"),
    "--recompute-granularity": PastedFlag(
        takes_value=True, action="by-value",
        message="--recompute-granularity takes 'selective' or 'full'",
        by_value=(("selective", _mapped(
            "--recompute-granularity selective maps to --recompute-lgd: odc-pp recomputes "
            "layernorm, GeLU and dropout outputs rather than core attention",
            "--recompute-lgd")),
                  ("full", _mapped(
                      "--recompute-granularity full maps to --recompute-full: whole "
                      "transformer layers recomputed in B (with --recompute-method and "
                      "--recompute-num-layers, as Megatron)", "--recompute-full")))),
    "--transformer-impl": PastedFlag(
        takes_value=True, action="by-value",
        message="--transformer-impl takes 'local' here; 'transformer_engine' is not supported "
                "yet (its split backward is not implemented): use --transformer-impl local",
        by_value=(("local", _honoured(
            "--transformer-impl local: odc-pp builds megatron-core's local layers")),)),
}


def translate(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` with pasted Megatron flags dropped or rewritten, and the log notes.

    Raises ``ValueError`` naming a rejected flag and its equivalent."""
    out: list[str] = []
    notes: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        name, has_inline, inline = token.partition("=")
        entry = PASTED_FLAGS.get(name)
        if entry is None:
            out.append(token)
            index += 1
            continue
        value = None
        if entry.takes_value:
            if has_inline:
                value = inline
                index += 1
            elif index + 1 < len(argv):
                value = argv[index + 1]
                index += 2
            else:
                raise ValueError(f"{name} expects a value")
        else:
            if has_inline:
                raise ValueError(f"{name} takes no value, got {token!r}")
            index += 1
        if entry.action == "by-value":
            entry = dict(entry.by_value).get(value) or _rejected(entry.message)
        if entry.action == "rejected":
            raise ValueError(entry.message)
        for flag in entry.replacement:
            if flag not in out:
                out.append(flag)
        notes.append(f"note: {name}{'' if value is None else ' ' + value}: {entry.message}")
    return out, notes
