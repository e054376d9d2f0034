"""The layers point one way: ``{schedule, data, optim, layout} <- {runtime, odc, planner} <-
megatron <- training <- testing <- tools`` (odc_pp.cli, odc_pp.demo, odc_pp.train, tools/,
benchmarks/; odc_pp.testing holds the launchers the tests and benchmarks share). Every
import counts -- module level, inside functions (lazy imports) and under
``if TYPE_CHECKING`` -- and packages of one layer do not import each other. Nothing
outside tests/ imports the tests package."""

from __future__ import annotations

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

LAYERS: dict[str, int] = {
    "schedule": 0, "data": 0, "optim": 0, "fsutil": 0, "dtypes": 0, "layout": 0,
    "runtime": 1, "odc": 1, "planner": 1,
    "megatron": 2,
    "training": 3,
    "testing": 4,
    "cli": 5, "demo": 5, "train": 5, "plan_command": 5, "tools": 5, "benchmarks": 5,
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
    runtime), an upward one (odc -> megatron), a TYPE_CHECKING one and a benchmark
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
    assert "odc_pp/odc/fake.py:1 (odc, layer 1) imports odc_pp.megatron.tp_layout" in found[1]
    assert "odc_pp/runtime/fake.py:3 (runtime, layer 1) imports odc_pp.training" in found[2]
    assert found[3].startswith("odc_pp/schedule/fake.py:2 (schedule, layer 0) imports "
                               "odc_pp.runtime.p2p_channels")


def _module_name(path: str) -> str:
    """``odc_pp/schedule/validate.py`` -> ``odc_pp.schedule.validate`` (a package: its
    ``__init__`` module's name without the suffix)."""
    parts = list(pathlib.PurePosixPath(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the odc_pp modules it imports (any import in the file, lazy ones
    included). ``from package import name`` points at the submodule when ``name`` is
    one, else at the package."""
    modules = {_module_name(path) for path in sources if path.startswith("odc_pp/")}
    graph: dict[str, set[str]] = {}
    for path, source in sources.items():
        if not path.startswith("odc_pp/"):
            continue
        here = _module_name(path)
        edges = graph.setdefault(here, set())
        for _, module in _imported(path, source):
            while module and module not in modules:
                module = module.rpartition(".")[0]  # an attribute, not a module
            if module and module != here:
                edges.add(module)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module:
                base = next((m for _, m in _imported(path, ast.unparse(node))), "")
                edges |= {f"{base}.{a.name}" for a in node.names} & modules
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm),
    each sorted: every one is an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def test_no_import_circles_among_odc_pp_modules():
    cycles = import_cycles(import_graph(_tree()))
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_circle_finder_finds_a_lazy_circle():
    """Two modules importing each other, one of them inside a function, form a circle;
    a package importing its own submodule does not."""
    sources = {
        "odc_pp/schedule/__init__.py": "from .a import A\n",
        "odc_pp/schedule/a.py": "from .b import B\nA = 1\n",
        "odc_pp/schedule/b.py": "def f():\n    from . import a\n    return a\n",
        "odc_pp/schedule/c.py": "import odc_pp.schedule.a\n",
    }
    assert import_cycles(import_graph(sources)) == [["odc_pp.schedule.a",
                                                      "odc_pp.schedule.b"]]
    sources["odc_pp/schedule/b.py"] = "from odc_pp.schedule.c import x\n"
    sources["odc_pp/schedule/c.py"] = "x = 1\n"
    assert import_cycles(import_graph(sources)) == []
