"""The kinds of answer a flag pasted from a Megatron-LM script gets (:mod:`.megatron_flags`).

* ``honoured``: odc-pp already does what the flag asks; dropped with a note.
* ``mapped``: rewritten to odc-pp's own flag(s), with a note.
* ``no-op``: at this value the flag changes nothing in odc-pp (a size of 1, a fusion
  switch, a cache path); dropped with a note.
* ``rejected``: no equivalent; the job stops (exit 2) with one line naming the flag, why,
  and what to use.
* ``by-value``: the answer depends on the value (``by_value``); other values are rejected
  with ``message``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["PastedFlag", "ACTIONS", "honoured", "mapped", "noop", "rejected", "at_value",
           "maps_value", "same_value", "value_of"]

ACTIONS = ("honoured", "mapped", "no-op", "rejected", "by-value")


@dataclass(frozen=True, kw_only=True)
class PastedFlag:
    """How one Megatron-LM flag is answered."""

    takes_value: bool
    """Whether the flag is followed by a value (``--transformer-impl local``)."""
    action: str
    """One of :data:`ACTIONS`."""
    message: str
    """The note (honoured, mapped, no-op) or the error (rejected, other values of
    by-value)."""
    nargs: int = 1
    """Values the flag takes when ``takes_value`` (``--rampup-batch-size`` takes 3)."""
    replacement: tuple[str, ...] = ()
    """odc-pp tokens that replace it (``mapped``)."""
    value_to: str | None = None
    """``mapped`` value flags: the odc-pp flag that takes the same value."""
    by_value: tuple[tuple[str, "PastedFlag"], ...] = ()
    """``by-value``: the answer per accepted value (numbers compare as numbers)."""
    implied_by: str | None = None
    """A flag whose presence makes this one a no-op (``--no-load-optim`` with
    ``--finetune``); without it the flag is rejected with ``message``."""
    check: Callable[[str], str | None] | None = None
    """``mapped`` value flags: the value's problem (the job stops with it), or None."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}")

    def for_value(self, value: str | None) -> "PastedFlag":
        """The answer at ``value`` (itself unless ``by-value``)."""
        if self.action != "by-value":
            return self
        for accepted, entry in self.by_value:
            if same_value(accepted, value):
                return entry
        return rejected(self.message, takes_value=True)


def same_value(a: str, b: str | None) -> bool:
    """Equal as text, or as numbers (``1`` and ``1.0``)."""
    if b is None:
        return False
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def honoured(message: str) -> PastedFlag:
    """A switch odc-pp already obeys."""
    return PastedFlag(takes_value=False, action="honoured", message=message)


def mapped(message: str, *replacement: str) -> PastedFlag:
    """A switch rewritten to odc-pp's ``replacement`` tokens."""
    return PastedFlag(takes_value=False, action="mapped", message=message,
                      replacement=replacement)


def maps_value(target: str, message: str, *,
               check: Callable[[str], str | None] | None = None) -> PastedFlag:
    """A value flag rewritten to ``target VALUE`` (when ``check`` finds no problem)."""
    return PastedFlag(takes_value=True, action="mapped", message=message, value_to=target,
                      check=check)


def noop(message: str, *, takes_value: bool = False, nargs: int = 1) -> PastedFlag:
    """A flag that changes nothing in odc-pp, whatever its value."""
    return PastedFlag(takes_value=takes_value, nargs=nargs, action="no-op", message=message)


def rejected(message: str, *, takes_value: bool = False, nargs: int = 1,
             implied_by: str | None = None) -> PastedFlag:
    """A flag with no equivalent: ``message`` says why and what to use."""
    return PastedFlag(takes_value=takes_value, nargs=nargs, action="rejected",
                      message=message, implied_by=implied_by)


def at_value(values: tuple[str, ...], note: str, refusal: str) -> PastedFlag:
    """A value flag that is a no-op at ``values`` and rejected (``refusal``) otherwise."""
    return PastedFlag(takes_value=True, action="by-value", message=refusal,
                      by_value=tuple((v, noop(note, takes_value=True)) for v in values))


def value_of(argv: list[str], flag: str) -> str | None:
    """The last value given to ``flag`` in ``argv`` (``--flag V`` or ``--flag=V``)."""
    found = None
    for index, token in enumerate(argv):
        if token == flag and index + 1 < len(argv):
            found = argv[index + 1]
        elif token.startswith(flag + "="):
            found = token.partition("=")[2]
    return found
