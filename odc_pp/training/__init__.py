"""Megatron-style training frontend for odc-pp: Megatron's flags and launch habits, run by
``pretrain_gpt.py`` at the repository root (it lives here, not under ``megatron.training``,
which megatron-core >= 0.17 ships itself)."""

from .arguments import TrainingArgs, parse_args

__all__ = ["TrainingArgs", "parse_args", "pretrain"]


def pretrain(argv: list[str] | None = None, *, hooks=None, checked=None) -> int:
    """Parse flags and train; the exit status (see ``odc_pp.training.training.main``).
    ``hooks``: a :class:`~odc_pp.training.hooks.TrainingHooks` (the tests' faults);
    ``checked``: the flags already parsed and resolved by
    :func:`~odc_pp.training.flag_check.check_flags` (not resolved again)."""
    from .training import main

    return main(argv, hooks=hooks, checked=checked)
