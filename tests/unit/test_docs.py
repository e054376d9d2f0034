"""README.md and docs/: the README stays a short newcomer's page with the two commands
first; its results table and docs/flags.md are what their generators write; no relative
link is dead; no page names a ``--flag`` that no parser has. Every docs/*.md is checked,
including pages added later."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

EXTERNAL_FLAGS = {
    # torchrun
    "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
    "--standalone", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
    # tar (docs/gpu.md's device command), pytest, pip
    "--exclude", "--durations", "--timeout", "--no-build-isolation", "--no-deps", "--no-index",
    "--find-links", "--python-version", "--only-binary",
    # torchrun elastic, SLURM
    "--max-restarts", "--gpus-per-task", "--signal", "--ntasks-per-node", "--nodes",
    "--requeue", "--job-name", "--time", "--kill-on-bad-exit",
    # Megatron-LM's own pretrain_gpt.py (loading an exported checkpoint there: docs/megatron.md)
    "--ckpt-format", "--no-load-optim", "--no-load-rng",
}
"""Flags of other programs that the pages may show."""

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?![\w*-])")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _tool(name: str):
    """A script of tools/ as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def _known_flags() -> set[str]:
    """pretrain_gpt.py's parser, the pasted Megatron-LM flags, and every flag an
    ``add_argument`` call in odc_pp/, tools/ or benchmarks/ declares."""
    from odc_pp.training.arguments import build_parser
    from odc_pp.training.megatron_flags import PASTED_FLAGS, PREFIX_FLAGS

    known = {option for action in build_parser()._actions for option in action.option_strings}
    known |= set(PASTED_FLAGS)
    scripts = ROOT / "tests" / "data" / "megatron_scripts"  # Megatron flags answered by prefix
    known |= {line.split()[0] for path in scripts.glob("*.flags")
              for line in path.read_text(encoding="utf-8").splitlines()
              if line.strip() and line.startswith(tuple(PREFIX_FLAGS))}
    sources = [*(ROOT / "odc_pp").rglob("*.py"), *(ROOT / "tools").glob("*.py"),
               *(ROOT / "benchmarks").glob("*.py")]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                known |= {arg.value for arg in node.args if isinstance(arg, ast.Constant)
                          and isinstance(arg.value, str) and arg.value.startswith("--")}
    return known | EXTERNAL_FLAGS


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    # 12.5k since issue 49: each measured speed-up names its baseline (FSDP-style
    # collective and Megatron's ddp), the comparison against ddp included
    assert len(text) < 12_500, f"README.md has {len(text)} characters (keep it < 12.5k)"
    first_block = text.index("```")
    assert first_block < text.index("\n## "), "the commands come before the first section"
    block = text[first_block:text.index("```", first_block + 3)]
    assert "make demo" in block and "make test" in block


def test_generated_parts_are_current():
    """docs/flags.md and README.md's results table are what tools/generate_docs.py
    writes (run it after changing a flag or a result file)."""
    generate_docs = _tool("generate_docs")
    for path, text in generate_docs.generated().items():
        assert pathlib.Path(path).read_text(encoding="utf-8") == text, \
            f"{path} is stale: run python tools/generate_docs.py"
    assert generate_docs.table().count("\n") >= 3, "the results table has rows"
    assert "`--pipeline-schedule`" in generate_docs.flag_reference()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    dead = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            dead.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            dead.append(target)
    assert not dead, f"{page.relative_to(ROOT)}: dead links {dead}"


def test_pages_name_only_existing_flags():
    known = _known_flags()
    unknown = {}
    for page in PAGES:
        for flag in _FLAG.findall(page.read_text(encoding="utf-8")):
            if flag not in known:
                unknown.setdefault(flag, []).append(page.name)
    assert not unknown, f"flags no parser declares: {unknown}"


def test_the_checks_catch_a_dead_link_and_an_unknown_flag(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\nsee [gone](missing.md) and [here](#page), --no-such-flag\n")
    assert _LINK.findall(page.read_text()) == ["missing.md", "#page"]
    assert not (tmp_path / "missing.md").exists()
    assert "page" in _anchors(page)
    assert "--no-such-flag" not in _known_flags()
    assert _FLAG.findall("the `--no-*-fusion` flags, --bf16") == ["--bf16"]
