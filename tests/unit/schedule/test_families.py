"""The schedule-family registry is the one table every consumer reads; placement math."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from odc_pp.schedule import CostModel
from odc_pp.schedule.generators import FAMILIES, FAMILY_NAMES, family, generate
from odc_pp.schedule.placement import (Placement, last_stage_rank, locate, rank_stages,
                                       stage_of)

ROOT = Path(__file__).resolve().parents[3]


def test_every_consumer_lists_the_registry():
    from odc_pp.schedule.cli import build_parser
    from odc_pp.schedule.compare import family_names
    from odc_pp.planner.offload_tuner import TunerConfig
    from odc_pp.training.arguments import CHOICES

    assert CHOICES["pipeline_schedule"] == FAMILY_NAMES
    assert tuple(family_names()) == FAMILY_NAMES
    schedule_action = next(a for a in build_parser()._actions if a.dest == "schedule")
    assert tuple(schedule_action.choices) == FAMILY_NAMES
    tuned = {f.default for f in TunerConfig.__dataclass_fields__.values()
             if f.name == "schedules"}.pop()
    assert tuned == tuple(f.name for f in FAMILIES if not f.searched)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_rows_match_what_generate_and_the_frontend_build(name):
    from odc_pp.training.arguments import parse_args

    row = family(name)
    pp = 3
    m = max(2, row.microbatches_per_rank) * pp
    options = {"max_evaluations": 20} if row.searched else {}
    schedule = generate(name, pp=pp, num_microbatches=m,
                        costs=CostModel(offload_bandwidth=2.0), **options)
    assert schedule.num_chunks == row.default_chunks
    assert schedule.placement is row.placement
    flags = ["--mock-data", "--vocab-size", "64", "--pipeline-schedule", name,
             "--num-layers", str(6 * row.default_chunks), "--pipeline-model-parallel-size",
             "3"] + (["--cpu-offload"] if row.offloads else [])
    args = parse_args(flags)
    assert args.schedule.num_model_chunks == row.default_chunks
    job = args.resolve(3)
    assert job.family is row and job.placement is row.placement
    if row.max_chunks is not None:
        with pytest.raises(ValueError, match="--num-model-chunks"):
            parse_args(flags + ["--num-model-chunks", str(row.max_chunks + 1)])


def test_unknown_family_lists_the_names():
    with pytest.raises(ValueError, match="choose one of 1f1b, interleaved"):
        family("zb-h3")


@pytest.mark.parametrize("placement", list(Placement))
@pytest.mark.parametrize("pp,num_chunks", [(1, 1), (3, 2), (4, 2), (2, 4), (5, 1)])
def test_placement_functions_are_inverse(placement, pp, num_chunks):
    seen = set()
    for rank in range(pp):
        for chunk, stage in enumerate(rank_stages(placement, pp, num_chunks, rank)):
            assert stage == stage_of(placement, pp, rank, chunk)
            assert locate(placement, pp, num_chunks, stage) == (rank, chunk)
            seen.add(stage)
    assert seen == set(range(pp * num_chunks))
    with pytest.raises(ValueError, match="outside"):
        locate(placement, pp, num_chunks, pp * num_chunks)


def test_last_stage_rank():
    assert last_stage_rank(Placement.V, 4, 2) == 0
    assert last_stage_rank(Placement.INTERLEAVED, 4, 2) == 3
    assert last_stage_rank("interleaved", 4, 1) == 3


@pytest.mark.parametrize("module", ["odc_pp.schedule.generators.search",
                                    "odc_pp.schedule.generators._engine",
                                    "odc_pp.schedule.generators",
                                    "odc_pp.schedule.generators.families",
                                    "odc_pp.schedule.generators.classic",
                                    "odc_pp.planner.offload_tuner", "odc_pp.schedule.cli",
                                    "odc_pp.schedule.ir", "odc_pp.schedule.placement"])
def test_each_module_imports_first_in_a_fresh_interpreter(module):
    """No import cycle: whichever module comes first, the import completes."""
    subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, check=True,
                   timeout=120)


def _module_imports(path, package: str) -> set[str]:
    """Modules of odc_pp a file imports at module level (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("odc_pp"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("odc_pp"):
                continue
            if node.module is None:  # from . import a, b: submodules
                found.update(f"{target}.{a.name}" for a in node.names)
            else:
                found.add(target)
    return found


def test_schedule_modules_have_no_import_cycle():
    """The search uses the generators' orders and list scheduler while the registry
    builds zb-auto through the search: the module graph must stay acyclic."""
    graph = {}
    for path in sorted((ROOT / "odc_pp" / "schedule").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        package = name if is_package else ".".join(parts[:-1])
        graph[name] = {m for m in _module_imports(path, package) if m != name}
    state: dict[str, int] = {}

    def visit(node, trail):
        if state.get(node) == 1:
            raise AssertionError("import cycle: " + " -> ".join(trail + [node]))
        if state.get(node) == 2 or node not in graph:
            return
        state[node] = 1
        for child in sorted(graph[node]):
            visit(child, trail + [node])
        state[node] = 2
    for node in sorted(graph):
        visit(node, [])


def test_no_import_error_guard_around_own_modules():
    """Only optional third-party packages may be guarded by ``except ImportError``."""
    for path in sorted((ROOT / "odc_pp" / "schedule").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if not caught & {"ImportError", "ModuleNotFoundError"}:
                continue
            for stmt in ast.walk(ast.Module(body=node.body, type_ignores=[])):
                if isinstance(stmt, ast.ImportFrom):
                    assert stmt.level == 0 and not (stmt.module or "").startswith("odc_pp"), \
                        f"{path}:{stmt.lineno}"
                if isinstance(stmt, ast.Import):
                    assert not any(a.name.startswith("odc_pp") for a in stmt.names), \
                        f"{path}:{stmt.lineno}"
