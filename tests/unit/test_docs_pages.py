"""The docs fit their readers (issue 52, part 4): every docs/*.md page is at most 15,000
characters and says in its first screen (20 lines) which question it answers; every
```python block of the docs and the README runs as written (in a scratch directory), or,
marked ``<!-- not run: why -->`` on the line before, has imports that resolve."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
LIMIT = 15_000
ANSWERS = re.compile(r"^> \*\*This page answers:\*\* (.+?\?)", re.S | re.M)
_BLOCK = re.compile(r"(?:^(<!-- not run:[^>]*-->)\n)?^```python\n(.*?)^```", re.S | re.M)


def python_blocks(text: str) -> list[tuple[bool, str]]:
    """(runnable, source) of every ```python block: runnable unless marked not run."""
    return [(not marker, source) for marker, source in _BLOCK.findall(text)]


def first_screen_question(text: str) -> str | None:
    """The question the page's first 20 lines say it answers (None: none)."""
    head = "\n".join(text.splitlines()[:20])
    match = ANSWERS.search(head)
    return " ".join(match.group(1).replace("\n>", " ").split()) if match else None


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_page_is_at_most_15000_characters(page):
    size = len(page.read_text(encoding="utf-8"))
    assert size <= LIMIT, f"docs/{page.name} has {size} characters (at most {LIMIT}: split it)"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_first_screen_says_what_question_the_page_answers(page):
    question = first_screen_question(page.read_text(encoding="utf-8"))
    assert question and len(question.split()) >= 5, \
        f"docs/{page.name}: no '> **This page answers:** ...?' in its first 20 lines"


EXAMPLES = [(page, i) for page in [ROOT / "README.md", *DOCS]
            for i, _ in enumerate(python_blocks(page.read_text(encoding="utf-8")))]


@pytest.mark.parametrize("page,index", EXAMPLES, ids=lambda v: getattr(v, "name", str(v)))
def test_python_examples_run(page, index, tmp_path, monkeypatch):
    runnable, source = python_blocks(page.read_text(encoding="utf-8"))[index]
    if not runnable:  # a fragment: its imports must still name what exists
        tree = ast.parse(source)
        source = "\n".join(ast.unparse(node) for node in tree.body
                           if isinstance(node, (ast.Import, ast.ImportFrom)))
    monkeypatch.chdir(tmp_path)
    exec(compile(source, f"{page.name} python block {index}", "exec"), {"__name__": "__doc__"})


def test_the_checks_catch_a_long_page_a_missing_question_and_a_broken_example():
    assert first_screen_question("# T\n\n> **This page answers:** how do I\n> run it?\n") == \
        "how do I run it?"
    assert first_screen_question("# T\n" + "text\n" * 20 + "> **This page answers:** late?\n") \
        is None
    blocks = python_blocks("```python\nx = 1\n```\n<!-- not run: a fragment -->\n```python\n"
                           "import os\ny(z)\n```\n")
    assert blocks == [(True, "x = 1\n"), (False, "import os\ny(z)\n")]
    with pytest.raises(ImportError):
        exec("from odc_pp.schedule.generators import no_such_name", {})
