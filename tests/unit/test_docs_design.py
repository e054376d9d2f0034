"""docs/design.md's layer diagram is the one tests/unit/test_layering.py enforces: the same
packages on the same floors, in order (issue 52: it once left out ``layout`` and
``plan_command``). The diagram sits between the ``layers:begin`` / ``layers:end``
markers, one floor per ``<-``, each floor a ``{a, b}`` set."""

from __future__ import annotations

import pathlib
import re

from tests.unit.test_layering import LAYERS

ROOT = pathlib.Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- layers:begin", "<!-- layers:end -->"


def floors_of_diagram(text: str) -> list[set[str]]:
    """The floors the diagram between the markers draws, bottom first."""
    start = text.index(BEGIN)
    block = text[start:text.index(END, start)]
    body = block[block.index("```") + 3:block.rindex("```")]
    floors = []
    for part in body.split("<-"):
        names = re.findall(r"[a-z_]+", part)
        assert names, f"an empty floor in the diagram: {part!r}"
        floors.append(set(names))
    return floors


def floors_of_layering() -> list[set[str]]:
    """tests/unit/test_layering.py's LAYERS as floors, bottom first."""
    return [{name for name, floor in LAYERS.items() if floor == level}
            for level in sorted(set(LAYERS.values()))]


def diagram() -> str:
    """The diagram as design.md should draw it (paste it between the markers)."""
    floors = ["{" + ", ".join(sorted(floor)) + "}" for floor in floors_of_layering()]
    return "```\n" + floors[0] + "".join(f"\n    <-  {f}" for f in floors[1:]) + "\n```"


def test_the_design_diagram_draws_the_enforced_floors():
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    assert floors_of_diagram(text) == floors_of_layering(), \
        f"docs/design.md's layer diagram differs from test_layering.LAYERS; draw:\n{diagram()}"


def test_the_check_catches_a_missing_package():
    old = f"{BEGIN} -->\n```\n{{schedule, data, optim}}  <-  {{runtime, odc}}\n```\n{END}"
    floors = floors_of_diagram(old)
    assert floors == [{"schedule", "data", "optim"}, {"runtime", "odc"}]
    assert floors != floors_of_layering()
    assert floors_of_diagram(f"{BEGIN} -->\n{diagram()}\n{END}") == floors_of_layering()
