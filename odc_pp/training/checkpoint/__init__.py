"""Checkpoints of training, behind one :class:`Checkpointer` (``load() -> start``,
``save_if_due``, ``close``); the modules it drives are listed in
:mod:`.checkpointer`."""

from .checkpointer import Checkpointer

__all__ = ["Checkpointer"]
