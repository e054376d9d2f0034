"""Schedule generators: ``generate(name, pp=, num_microbatches=, ...) -> Schedule``.

Every generator returns a compute-only schedule (F, B, W, BW) for the whole pipeline,
as a pure function of its arguments. Memory limits are in the cost model's activation
delta units: one microbatch through one chunk adds ``mem_f`` (default +1), B adds
``mem_b`` (0), W ``mem_w`` (-1). For V placements a chunk holds half of a rank's layers,
so 1F1B's peak of ``pp`` microbatches equals ``2 pp`` V-chunk units.
"""

from __future__ import annotations

from ..costs import CostModel
from ..ir import Schedule
from ..validate import peak_memory
from . import classic, memory, offload

__all__ = ["GENERATOR_NAMES", "generate", "default_chunks"]

GENERATOR_NAMES: tuple[str, ...] = ("1f1b", "interleaved", "zb-h1", "zb-h2", "zb-auto",
                                    "zbv", "v-half", "v-min", "offload", "dualpipev")

_DEFAULT_CHUNKS = {"1f1b": 1, "zb-h1": 1, "zb-h2": 1, "zb-auto": 1, "interleaved": 2,
                   "zbv": 2, "v-half": 2, "v-min": 2, "dualpipev": 2, "offload": 2}
_OPTIONS = {"interleaved": {"group_size"}, "offload": {"group_size"}}
_V_FAMILIES = ("zbv", "v-half", "v-min", "dualpipev")
_SINGLE_CHUNK = ("1f1b", "zb-h1", "zb-h2", "zb-auto")


def default_chunks(name: str) -> int:
    """Model chunks per rank a family uses when ``num_chunks`` is not given."""
    _check_name(name)
    return _DEFAULT_CHUNKS[name]


def _check_name(name: str) -> None:
    if name not in GENERATOR_NAMES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(GENERATOR_NAMES)}")


def _check_shape(name: str, pp: int, num_microbatches: int, num_chunks: int) -> None:
    if not isinstance(pp, int) or pp < 1:
        raise ValueError(f"pp must be an integer >= 1, got {pp!r}")
    if not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"num_microbatches must be an integer >= 1, got {num_microbatches!r}")
    if not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
    if name in _SINGLE_CHUNK and num_chunks != 1:
        raise ValueError(f"{name} runs one model chunk per rank, got num_chunks={num_chunks}; "
                         f"use 'interleaved' for several chunks or a V schedule (zbv, v-half, "
                         f"v-min) for two")
    if name in _V_FAMILIES and num_chunks != 2:
        raise ValueError(f"{name} uses the V placement with exactly 2 chunks per rank (each "
                         f"holds half of the rank's layers, so the layer count must split "
                         f"into 2 * pp chunks), got num_chunks={num_chunks}")
    if name == "interleaved" and num_chunks < 2:
        raise ValueError(f"interleaved needs num_chunks >= 2 (got {num_chunks}); use 1f1b for "
                         f"one chunk")
    if name in ("interleaved", "offload") and num_microbatches < pp:
        raise ValueError(f"{name} needs num_microbatches >= pp ({pp}), got "
                         f"{num_microbatches}; raise the microbatch count")
    if name == "dualpipev" and num_microbatches < 2 * pp:
        raise ValueError(f"dualpipev needs num_microbatches >= 2 * pp ({2 * pp}), got "
                         f"{num_microbatches}; raise the microbatch count")


def _check_costs(costs: CostModel) -> None:
    if costs.mem_f <= 0 or costs.mem_b > 1e-12 or costs.mem_w > 1e-12:
        raise ValueError("generators need forward to allocate and backward to free "
                         f"(mem_f > 0, mem_b <= 0, mem_w <= 0); got mem_f={costs.mem_f}, "
                         f"mem_b={costs.mem_b}, mem_w={costs.mem_w}")


def _check_options(name: str, options: dict) -> None:
    if name == "zb-auto":
        return
    unknown = set(options) - _OPTIONS.get(name, set())
    if unknown:
        allowed = ", ".join(sorted(_OPTIONS.get(name, ()))) or "none"
        raise ValueError(f"{name} does not take option(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {allowed}")
    group_size = options.get("group_size")
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")


def _check_fixed_memory(schedule: Schedule, costs: CostModel,
                        memory_limit: float | None) -> None:
    peak = max(peak_memory(schedule, costs))
    if memory_limit is not None and peak > memory_limit + 1e-9:
        raise ValueError(f"{schedule.name} needs {peak:g} activation units per rank, above "
                         f"memory_limit {memory_limit:g}; raise memory_limit or pick a "
                         f"memory-controlled schedule (v-half, v-min, zb-auto, offload)")
    schedule.meta["memory_limit"] = memory_limit if memory_limit is not None else peak


def generate(name: str, *, pp: int, num_microbatches: int, num_chunks: int | None = None,
             costs: CostModel | None = None, memory_limit: float | None = None,
             **options) -> Schedule:
    """Build schedule family ``name`` (one of GENERATOR_NAMES) for the given shape.

    ``memory_limit`` caps each rank's activation memory (units in the module doc);
    families with a fixed pattern (1f1b, interleaved, zb-h1, dualpipev) reject a limit
    below their peak, memory-controlled ones build within ``min(nominal, limit)``.
    Options: ``group_size`` for interleaved/offload; zb-auto forwards options such as
    ``time_budget_s`` to ``odc_pp.schedule.search.zb_auto``.
    """
    _check_name(name)
    num_chunks = _DEFAULT_CHUNKS[name] if num_chunks is None else num_chunks
    _check_shape(name, pp, num_microbatches, num_chunks)
    _check_options(name, options)
    costs = CostModel() if costs is None else costs
    if not isinstance(costs, CostModel):
        raise ValueError(f"costs must be a CostModel, got {type(costs).__name__}")
    _check_costs(costs)
    if memory_limit is not None:
        minimum = num_chunks * costs.mem_f if name in _V_FAMILIES else costs.mem_f
        if memory_limit < minimum - 1e-9:
            raise ValueError(f"memory_limit {memory_limit:g} is below {minimum:g}, the "
                             f"activations one microbatch needs on a rank of {name}; "
                             f"raise memory_limit")

    if name == "zb-auto":
        from ..search import zb_auto  # SIM's search; imported lazily (heavier)

        return zb_auto(pp=pp, num_microbatches=num_microbatches, costs=costs,
                       memory_limit=memory_limit, **options)
    if name in ("1f1b", "interleaved", "zb-h1", "dualpipev"):
        if name == "1f1b":
            schedule = classic.one_f_one_b(pp, num_microbatches)
        elif name == "interleaved":
            schedule = classic.interleaved(pp, num_microbatches, num_chunks,
                                           group_size=options.get("group_size"))
        elif name == "zb-h1":
            schedule = classic.zb_h1(pp, num_microbatches)
        else:
            schedule = classic.dualpipev(pp, num_microbatches)
        _check_fixed_memory(schedule, costs, memory_limit)
        return schedule
    if name == "zb-h2":
        return memory.zb_h2(pp, num_microbatches, costs, memory_limit)
    if name in ("zbv", "v-half", "v-min"):
        return memory.v_family(name, pp, num_microbatches, costs, memory_limit)
    return offload.offload_schedule(pp, num_microbatches, num_chunks, costs, memory_limit,
                                    group_size=options.get("group_size"))
