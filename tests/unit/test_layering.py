"""The layers point one way: ``{schedule, data, optim} <- {runtime, planner} <- {odc,
megatron} <- training <- testing <- tools`` (odc_pp.cli, odc_pp.demo, tools/, benchmarks/;
odc_pp.testing holds the launchers the tests and benchmarks share). Every import counts -- module level, inside functions (lazy imports) and
under ``if TYPE_CHECKING`` -- and packages of one layer do not import each other.
Nothing outside tests/ imports the tests package."""

from __future__ import annotations

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

LAYERS: dict[str, int] = {
    "schedule": 0, "data": 0, "optim": 0, "fsutil": 0, "dtypes": 0,
    "runtime": 1, "planner": 1,
    "odc": 2, "megatron": 2,
    "training": 3,
    "testing": 4,
    "cli": 5, "demo": 5, "plan_command": 5, "tools": 5, "benchmarks": 5,
}
"""Layer of each odc_pp package (and of the scripts in tools/ and benchmarks/)."""


def _owner(path: str) -> str | None:
    """The package of LAYERS a repository path belongs to (None: not layered)."""
    parts = pathlib.PurePosixPath(path).parts
    if parts[0] in ("tools", "benchmarks"):
        return parts[0]
    if parts[0] != "odc_pp" or len(parts) < 2:
        return None
    name = parts[1][:-3] if parts[1].endswith(".py") else parts[1]
    return name if name in LAYERS else None


def _imported(path: str, source: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``source``, anywhere in the file, relative ones
    resolved against the module's package."""
    parts = list(pathlib.PurePosixPath(path).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    found = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
                if node.module is None:
                    found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
                    continue
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def violations(sources: dict[str, str]) -> list[str]:
    """Upward or sideways imports among ``sources`` (repository path -> text)."""
    problems = []
    for path, source in sorted(sources.items()):
        owner = _owner(path)
        for line, module in _imported(path, source):
            top = module.split(".")
            if top[0] == "tests" and not path.startswith("tests/"):
                problems.append(f"{path}:{line} imports {module} (tests are not a library; "
                                f"share code through odc_pp.testing)")
                continue
            if owner is None or top[0] != "odc_pp" or len(top) < 2:
                continue
            target = top[1]
            if target == owner or target not in LAYERS:
                continue
            if LAYERS[target] >= LAYERS[owner]:
                problems.append(f"{path}:{line} ({owner}, layer {LAYERS[owner]}) imports "
                                f"{module} ({target}, layer {LAYERS[target]})")
    return problems


@functools.lru_cache(maxsize=1)
def _tree() -> dict[str, str]:
    files = [*(ROOT / "odc_pp").rglob("*.py"), *(ROOT / "tools").glob("*.py"),
             *(ROOT / "benchmarks").glob("*.py")]
    return {f.relative_to(ROOT).as_posix(): f.read_text(encoding="utf-8") for f in files}


def test_every_odc_pp_package_has_a_layer():
    packages = {p.name if p.is_dir() else p.stem for p in (ROOT / "odc_pp").iterdir()
                if (p.is_dir() and (p / "__init__.py").exists())
                or (p.suffix == ".py" and p.stem != "__init__")}
    assert packages <= set(LAYERS), f"give these a layer: {sorted(packages - set(LAYERS))}"


def test_the_tree_imports_only_downwards():
    found = violations(_tree())
    assert not found, "imports against the layering:\n" + "\n".join(found)


def test_the_checker_flags_an_upward_lazy_import():
    """A deliberate upward import inside a function (the schedule reaching into the
    runtime), a sideways one (odc -> megatron), a TYPE_CHECKING one and a benchmark
    importing tests/ are each reported; the tree's own files stay clean."""
    sources = dict(_tree())
    sources["odc_pp/schedule/fake.py"] = (
        "def channels():\n"
        "    from ..runtime.p2p_channels import PipelineChannels\n"
        "    return PipelineChannels\n")
    sources["odc_pp/odc/fake.py"] = "import odc_pp.megatron.tp_layout\n"
    sources["odc_pp/runtime/fake.py"] = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from odc_pp.training.arguments import TrainingArgs\n")
    sources["benchmarks/bench_fake.py"] = "from tests.launch import run_workers\n"
    found = violations(sources)
    assert len(found) == 4, found
    assert found[0].startswith("benchmarks/bench_fake.py:1 imports tests.launch")
    assert "odc_pp/odc/fake.py:1 (odc, layer 2) imports odc_pp.megatron.tp_layout" in found[1]
    assert "odc_pp/runtime/fake.py:3 (runtime, layer 1) imports odc_pp.training" in found[2]
    assert found[3].startswith("odc_pp/schedule/fake.py:2 (schedule, layer 0) imports "
                               "odc_pp.runtime.p2p_channels")
