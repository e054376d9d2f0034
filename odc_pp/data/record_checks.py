"""Which JSONL records give no sample, and which samples truncation left unscored: each
counted per file and named (``file:line`` of the first few), never dropped silently.

A record is **dropped** when it cannot train: a chat record with a role outside
:data:`CHAT_ROLES` (Gemma's ``model``, a typo such as ``assitant``: its turns would be
rendered as an unknown header and never scored), a chat record with no assistant turn
(nothing is scored in it), or a record of fewer than 2 tokens. A file whose dropped
fraction exceeds ``--max-dropped-records-fraction`` is an error naming the file.

A sample is **unscored** when truncation to ``--seq-length`` cut off every scored token
(a long prompt before the assistant's reply). It is kept, as Megatron keeps such samples
(it trains nothing), and counted; ``--drop-unscored-samples`` drops it. A global batch
made only of such samples has nothing to normalise the loss by: the batch planner stops
the run there, naming that flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CHAT_ROLES", "DEFAULT_MAX_DROPPED_FRACTION", "SHOWN", "FileReport", "data_notes",
           "drop_reason"]

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")
"""The roles of chat messages (OpenAI's and Llama's); any other role drops its record."""

DEFAULT_MAX_DROPPED_FRACTION = 0.01
"""Default ``--max-dropped-records-fraction``."""

SHOWN = 3
"""How many dropped or unscored records a message names (``file:line``)."""


def drop_reason(messages: list[dict] | None) -> str | None:
    """Why a chat record (its validated ``messages``; None: not a chat record) cannot
    train, or None."""
    if messages is None:
        return None
    unknown = [m["role"] for m in messages if m["role"] not in CHAT_ROLES]
    if unknown:
        return (f"unknown role {unknown[0]!r} (chat roles are {', '.join(CHAT_ROLES)}; "
                f"Gemma's 'model' is 'assistant')")
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant turn (only assistant replies are scored)"
    return None


@dataclass(kw_only=True)
class FileReport:
    """One JSONL file's records: how many, which were dropped (and why), which samples
    truncation left unscored."""

    path: str
    """The JSONL file."""
    flag: str = "--data-path"
    """The flag that named it."""
    records: int = 0
    """Non-blank lines (records) of the file."""
    dropped: list[tuple[int, str]] = field(default_factory=list)
    """``(line, why)`` of every dropped record."""
    unscored: list[int] = field(default_factory=list)
    """Lines of the samples truncation to --seq-length left with no scored token."""
    drop_unscored: bool = False
    """Whether the unscored samples were dropped (``--drop-unscored-samples``)."""

    def _named(self, lines: list[int], whys: list[str] | None = None) -> str:
        shown = [f"{self.path}:{line}" + (f" ({whys[k]})" if whys else "")
                 for k, line in enumerate(lines[:SHOWN])]
        more = f" and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
        return ", ".join(shown) + more

    def dropped_text(self) -> str:
        lines, whys = [line for line, _ in self.dropped], [why for _, why in self.dropped]
        return (f"{len(self.dropped)} of {self.records} records of {self.flag} {self.path} "
                f"give no sample: {self._named(lines, whys)}")

    def unscored_text(self, seq_length: int) -> str:
        what = ("dropped (--drop-unscored-samples)" if self.drop_unscored else
                "kept: they train nothing, and a global batch of only such samples stops "
                "the run; --drop-unscored-samples drops them")
        return (f"{len(self.unscored)} of {self.records} samples of {self.flag} {self.path} "
                f"lost every scored token to truncation at --seq-length {seq_length} ({what}): "
                f"{self._named(self.unscored)}")

    def notes(self, seq_length: int) -> list[str]:
        """The data summary's lines about this file (none when nothing was dropped or
        truncated away)."""
        notes = [f"data: {self.dropped_text()}"] if self.dropped else []
        if self.unscored:
            notes.append(f"data: {self.unscored_text(seq_length)}")
        return notes

    def check(self, max_fraction: float) -> None:
        """ValueError when more than ``max_fraction`` of the records were dropped."""
        if self.records and len(self.dropped) > max_fraction * self.records:
            raise ValueError(
                f"{self.dropped_text()}; that is {len(self.dropped) / self.records:.1%}, more "
                f"than --max-dropped-records-fraction {max_fraction:g}. Fix these records "
                f"(or raise the flag to train on the rest)")


def data_notes(source) -> list[str]:
    """The data summary's lines of a sample source (a shuffled or concatenated dataset, or
    a blend of them): every JSONL dataset's :meth:`~odc_pp.data.datasets.JsonlDataset.notes`."""
    if source is None:
        return []
    if hasattr(source, "notes") and hasattr(source, "reports"):
        return source.notes()
    if hasattr(source, "sources"):  # a blend
        return [note for part in source.sources for note in data_notes(part)]
    return data_notes(getattr(source, "dataset", None))
