"""Third-party warnings in the training log: one line per kind, on the first rank.

megatron-core, torch and transformers warn at import and at model construction (Transformer
Engine and Apex missing, deprecated settings...); under torchrun every rank repeats each of
them as two lines, so a log used to open with dozens of lines of them. With
:func:`install_warning_filter` a warning raised from outside odc-pp is shown once per kind
-- its category, package and first sentence (``Transformer Engine and Apex are not
installed``) -- as one line on rank 0; odc-pp's own warnings are untouched."""

from __future__ import annotations

import os
import sys
import warnings

from .launch_env import read_env

__all__ = ["ThirdPartyWarnings", "install_warning_filter", "warning_kind"]

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # odc_pp/


def _package(filename: str) -> str:
    """The top-level package of a source file (``.../site-packages/megatron/core/x.py`` ->
    ``megatron``); the file's base name when it is outside site-packages."""
    parts = os.path.abspath(filename).split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts[:-1]:
            return parts[parts.index(marker) + 1].removesuffix(".py")
    return os.path.splitext(parts[-1])[0]


def warning_kind(message, category: type, filename: str) -> tuple[str, str, str]:
    """(package, category name, first sentence): warnings of one kind differ only after
    their first sentence (what is done about it) or in the line that raised them."""
    text = str(message).strip().splitlines()[0] if str(message).strip() else ""
    first = text.split(". ")[0].rstrip(".")
    return _package(filename), category.__name__, first


class ThirdPartyWarnings:
    """A ``warnings.showwarning`` replacement: odc-pp's warnings go to ``fallback``; a
    third-party warning is written as one line to ``stream`` the first time its kind is
    seen (``show=False``: never, the ranks other than the first)."""

    def __init__(self, *, stream=None, show: bool = True, fallback=None) -> None:
        self.stream = stream
        self.show = show
        self.fallback = fallback or warnings.showwarning
        self.seen: dict[tuple[str, str, str], int] = {}

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        if os.path.abspath(filename).startswith(_OWN + os.sep):
            self.fallback(message, category, filename, lineno, file, line)
            return
        kind = warning_kind(message, category, filename)
        self.seen[kind] = self.seen.get(kind, 0) + 1
        if self.show and self.seen[kind] == 1:
            package, name, _ = kind
            text = " ".join(str(message).split())
            stream = self.stream or sys.stderr
            stream.write(f"warning: {package}: {name}: {text} (shown once)\n")
            stream.flush()


def install_warning_filter(*, stream=None) -> ThirdPartyWarnings:
    """Route Python warnings through :class:`ThirdPartyWarnings` (rank 0 shows them, one
    line per kind; the other ranks show odc-pp's own only). Returns the filter."""
    current = warnings.showwarning
    if isinstance(current, ThirdPartyWarnings):
        return current
    hook = ThirdPartyWarnings(stream=stream, show=read_env().rank == 0, fallback=current)
    warnings.showwarning = hook
    return hook
