"""Modules stay small: every module of odc_pp has at most MAX_LINES lines (new code goes into
a new module along a seam, not into a big one)."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

MAX_LINES = 550
"""The most lines one module of odc_pp may have."""


def _line_count(path: pathlib.Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_the_limit():
    over = sorted(f"{path.relative_to(ROOT)}: {count} lines"
                  for path in (ROOT / "odc_pp").rglob("*.py")
                  if (count := _line_count(path)) > MAX_LINES)
    assert not over, f"modules over {MAX_LINES} lines (split them along a seam):\n" + \
        "\n".join(over)


def test_the_count_is_of_lines(tmp_path):
    module = tmp_path / "module.py"
    module.write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert _line_count(module) == MAX_LINES + 1
    module.write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    assert _line_count(module) == MAX_LINES
