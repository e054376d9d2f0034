"""Every flag of ``pretrain_gpt.py`` / ``python -m odc_pp.train`` has a full sentence as
its ``--help`` text (issue 52: ``--pipeline-schedule``'s was "Pipeline schedule."). The
text is the docstring of the flag's field in the ``*Args`` dataclasses
(odc_pp/training/arg_sections.py) and lands in docs/flags*.md too. A sentence here:
starts with a capital letter or a flag / code token (``--flag``, ```code```, ``zb-auto``,
``odc_pp.x``), ends with a full stop, and has at least three words."""

from __future__ import annotations

import re

from odc_pp.training.arguments import build_parser

_CODE_TOKEN = re.compile(r"^(--|`|[a-z0-9]+[-_.][\w.-]*\b)")


def not_a_sentence(text: str | None) -> str | None:
    """Why ``text`` is not a full sentence (None: it is one)."""
    text = " ".join((text or "").split())
    if len(text.split()) < 3:
        return "fewer than three words"
    if not text.endswith("."):
        return "no full stop at the end"
    if not (text[0].isupper() or _CODE_TOKEN.match(text)):
        return "starts with neither a capital letter nor a flag or code token"
    return None


def test_every_flag_help_is_a_sentence():
    bad = {}
    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        why = not_a_sentence(action.help)
        if why:
            bad[action.option_strings[0]] = f"{why}: {action.help!r}"
    assert not bad, "flag help that is not a full sentence (fix the field docstring " \
                    f"in odc_pp/training/arg_sections.py): {bad}"


def test_the_check_tells_a_sentence_from_a_label():
    assert not_a_sentence("Pipeline schedule.") == "fewer than three words"
    assert not_a_sentence("Number of attention heads") == "no full stop at the end"
    assert not_a_sentence("hierarchical: ranks per host.") is not None
    assert not_a_sentence("zb-auto and --fill-pipeline-gaps: iterations profiled.") is None
    assert not_a_sentence("--load: take the weights only.") is None
    assert not_a_sentence("Number of transformer layers of the model.") is None
