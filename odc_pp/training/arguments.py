"""Megatron-style command-line arguments: the parser built from the validated sections of
:mod:`.arg_sections` (one dataclass per section: model, parallel, schedule, optimizer, data,
checkpoint, logging, run; every field a flag named as in Megatron-LM, ``model.num_layers``
-> ``--num-layers``, its docstring the flag's help), pasted Megatron-LM flags translated
(:mod:`.megatron_flags`), and the log's notes. Validation of combinations
(:mod:`.argument_checks`) runs in ``TrainingArgs.__post_init__`` and raises one
``ValueError`` that names the flags to change.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import sys
import textwrap

from .arg_sections import (CheckpointArgs, DataArgs, LoggingArgs, ModelArgs, OptimizerArgs,
                           ParallelArgs, RunArgs, ScheduleArgs, TrainingArgs)
from .argument_checks import CHOICES, DP_MODES, LOAD_BALANCE, loss_scale_config
from .argument_checks import flag_name as _flag
from .megatron_flags import translate_all as translate_megatron_flags
from .megatron_semantics import megatron_tolerances, unknown_lines
from .megatron_sft_flags import choice_hint
from .sample_construction import sample_construction_note

__all__ = ["TrainingArgs", "ModelArgs", "ParallelArgs", "ScheduleArgs", "OptimizerArgs",
           "DataArgs", "CheckpointArgs", "LoggingArgs", "RunArgs", "SECTION_OF", "parse_args",
           "parse_args_with_notes", "args_from_flags", "build_parser", "DP_MODES",
           "LOAD_BALANCE", "CHOICES", "loss_scale_config"]


@functools.lru_cache(maxsize=None)  # pure; odc-pp plan parses hundreds of flag sets
def _field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string literal after each annotated field)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr) and \
                isinstance(following.value, ast.Constant) and isinstance(node.target, ast.Name):
            docs[node.target.id] = str(following.value.value)
    return docs


def _section_fields():
    """(section name, section class, field) for every flag, in help order."""
    for section in dataclasses.fields(TrainingArgs):
        cls = section.default_factory
        for item in dataclasses.fields(cls):
            yield section.name, cls, item


SECTION_OF = {item.name: section for section, _, item in _section_fields()}
"""Flag field -> the section that holds it (flags are unique across sections)."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``ValueError`` (one line, the caller prints it once per job)
    instead of printing its usage block and exiting in every process."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.value_problems: list[str] = []
        """Bad values (a wrong type, an invalid choice), one line each: reported with the
        launch's other problems instead of stopping the parse at the first."""

    def error(self, message: str):
        raise ValueError(message)

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            self.value_problems.append(f"{'/'.join(action.option_strings)} {arg_string!r}: "
                                       f"{exc.message}")
            return action.default

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            flag = "/".join(action.option_strings)
            self.value_problems.append(
                f"{flag} {value!r}: invalid choice (choose from "
                f"{', '.join(map(str, action.choices))}){choice_hint(flag)}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pretrain_gpt.py", description="Train a megatron-core GPT with zero-bubble "
        "pipeline parallelism and ODC data parallelism (odc-pp).", allow_abbrev=False)
    groups, docs = {}, {}
    for section, cls, item in _section_fields():
        if section not in groups:
            groups[section] = parser.add_argument_group(section, cls.__doc__)
            docs.update(_field_docs(cls))
        group = groups[section]
        flag, help_text = f"--{_flag(item.name)}", docs.get(item.name, "")
        default = item.default
        kind = str(item.type)
        if kind == "bool":
            group.add_argument(flag, action="store_true", help=help_text)
        elif kind.startswith("list[int]"):
            group.add_argument(flag, type=int, nargs="+", default=None, help=help_text)
        elif kind.startswith("list[str]"):
            group.add_argument(flag, nargs="+", default=None, help=help_text)
        else:
            convert = int if kind.startswith("int") else float if kind.startswith("float") else str
            group.add_argument(flag, type=convert, default=default, help=help_text,
                               choices=CHOICES.get(item.name))
    return parser


def args_from_flags(values: dict) -> TrainingArgs:
    """TrainingArgs from ``{field: value}`` of every flag (argparse's namespace)."""
    sections: dict[str, dict] = {}
    for name, value in values.items():
        sections.setdefault(SECTION_OF[name], {})[name] = value
    built = {section.name: section.default_factory(**sections.get(section.name, {}))
             for section in dataclasses.fields(TrainingArgs)}
    return TrainingArgs(**built)


def parse_args_with_notes(argv: list[str] | None = None) -> tuple[TrainingArgs, list[str]]:
    """Parse Megatron-style flags: the arguments and the notes for the log about pasted
    Megatron-LM flags (:mod:`.megatron_flags`). A bad value or combination, a rejected
    pasted flag or an unknown flag raises one ``ValueError`` with a line per flag."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    native = frozenset(o for action in parser._actions for o in action.option_strings)
    translation = translate_megatron_flags(argv, native)
    argv, notes = translation.argv, translation.notes
    namespace, unknown = parser.parse_known_args(argv)
    problems = translation.problems + parser.value_problems + unknown_lines(unknown, native)
    if problems:
        raise ValueError(f"{len(problems)} flag{'s' * (len(problems) > 1)} not taken:\n  "
                         + "\n  ".join(problems))
    values = vars(namespace)
    notes += megatron_tolerances(values)
    if values.get("hf_checkpoint"):
        from odc_pp.megatron.hf_config import given_flags, merge_hf_flags

        values = merge_hf_flags(values, given_flags(argv), values["hf_checkpoint"])
        notes.append(f"note: --hf-checkpoint {values['hf_checkpoint']}: architecture and "
                     f"weights from its config.json and safetensors")
    args = args_from_flags(values)
    if args.model.fp16:
        opt = args.optimizer
        notes.append("note: --fp16: float16 compute, fp32 master weights, " + (
            f"constant loss scale {opt.loss_scale}" if opt.loss_scale is not None else
            f"Megatron's dynamic loss scale from {opt.initial_loss_scale:g}"))
    if args.data.rampup_batch_size:
        notes.append(f"note: --rampup-batch-size {' '.join(map(str, args.data.rampup_batch_size))}"
                     f": the global batch ramps up to --global-batch-size "
                     f"{args.data.global_batch_size} as Megatron")
    if values.get("tokenizer_type") is None and values.get("tokenizer_model"):
        notes.append(f"note: --tokenizer-model {values['tokenizer_model']} without "
                     f"--tokenizer-type: HuggingFaceTokenizer")
    notes.append(sample_construction_note(args))
    if args.optimizer.lr == 0:
        notes.append("warning: --lr 0: the weights will not change (evaluation / parity run)")
    return args, notes


def parse_args(argv: list[str] | None = None) -> TrainingArgs:
    """:func:`parse_args_with_notes` without the notes."""
    return parse_args_with_notes(argv)[0]
