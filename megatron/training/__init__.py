"""Megatron-style training frontend for odc-pp (``megatron.training`` beside
megatron-core's ``megatron.core``; ``megatron`` itself stays a namespace package)."""

from .arguments import TrainingArgs, parse_args

__all__ = ["TrainingArgs", "parse_args", "pretrain"]


def pretrain(argv: list[str] | None = None) -> int:
    """Parse flags and train; the exit status (see ``megatron.training.training.main``)."""
    from .training import main

    return main(argv)
