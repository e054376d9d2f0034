"""Rendering: structure only (row counts, one rect per compute action, PNG magic)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from odc_pp.schedule import Action, ActionKind, CostModel, Schedule
from odc_pp.schedule.render import render_ascii, render_memory_png, render_png, render_svg
from odc_pp.schedule.simulator import simulate

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _two_chunk_schedule() -> Schedule:
    # pp=2, interleaved 2 chunks, one microbatch: stages 0..3 on ranks 0,1,0,1
    schedule = Schedule(name="vpp", pp=2, num_microbatches=1, num_chunks=2)
    A = ActionKind
    schedule.extend([Action(rank=0, kind=A.F, chunk=0), Action(rank=0, kind=A.F, chunk=1),
                     Action(rank=0, kind=A.BW, chunk=1), Action(rank=0, kind=A.BW, chunk=0)])
    schedule.extend([Action(rank=1, kind=A.F, chunk=0), Action(rank=1, kind=A.F, chunk=1),
                     Action(rank=1, kind=A.B, chunk=1), Action(rank=1, kind=A.B, chunk=0),
                     Action(rank=1, kind=A.W, chunk=1), Action(rank=1, kind=A.W, chunk=0)])
    return schedule


def test_ascii_has_one_row_per_rank_and_case_per_chunk(one_f_one_b):
    schedule = one_f_one_b(4, 8, split_w=True)
    text = render_ascii(schedule, simulate(schedule, CostModel()), width=60)
    title, *rows, legend = text.splitlines()
    assert len(rows) == 4
    assert title.startswith("1f1b-hand: pp=4 microbatches=8 chunks=1 | makespan 30 | "
                            "bubble 20.00% of the makespan")
    assert legend.startswith("legend: F forward, B input grad, W weight grad")
    assert legend.endswith("one column = 0.5 time units")
    assert all(len(r) == len(rows[0]) for r in rows)
    assert set("FBW") <= set(rows[0])
    two = _two_chunk_schedule()
    chunked = render_ascii(two, simulate(two, CostModel()), width=40)
    assert "f" in chunked and "F" in chunked and "x" in chunked


def test_svg_parses_with_one_rect_per_compute_action(one_f_one_b, lower_hand):
    schedule = lower_hand(one_f_one_b(3, 4, split_w=True))
    sim = simulate(schedule, CostModel(t_comm=0.2))
    root = ET.fromstring(render_svg(schedule, sim))
    rects = [el for el in root.iter("{http://www.w3.org/2000/svg}rect")
             if el.get("class") == "compute"]
    assert len(rects) == sum(len(schedule.compute_actions(r)) for r in range(3))
    assert {el.get("data-kind") for el in rects} == {"F", "B", "W"}
    sides = [el for el in root.iter("{http://www.w3.org/2000/svg}rect")
             if el.get("class") == "side"]
    assert sides  # transfers drawn on the thin row


def test_png_files_have_png_magic(tmp_path, one_f_one_b):
    schedule = one_f_one_b(3, 6, split_w=True)
    sim = simulate(schedule, CostModel(), memory_limit=3)
    gantt = render_png(schedule, sim, str(tmp_path / "gantt.png"))
    memory = render_memory_png(schedule, sim, str(tmp_path / "memory.png"))
    for path in (gantt, memory):
        with open(path, "rb") as handle:
            assert handle.read(8) == PNG_MAGIC


def _png_size(path) -> tuple[int, int]:
    with open(path, "rb") as handle:
        head = handle.read(24)
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_trace_picture_is_sized_to_be_read(tmp_path, one_f_one_b):
    """The --trace picture (measured seconds, where one short action used to stretch it
    to 4000 x 200 px) keeps a readable size and shape."""
    from odc_pp.runtime.runtime import ActionTiming
    from odc_pp.runtime.trace import measured_result

    schedule = one_f_one_b(2, 8, split_w=True)
    sim = simulate(schedule, CostModel(t_f=0.004, t_b=0.004, t_w=0.0002))
    timings = [[ActionTiming(action=a, start=s, end=e) for a, s, e in zip(*rank)]
               for rank in zip(sim.rank_actions, sim.rank_starts, sim.rank_ends)]
    path = render_png(schedule, measured_result(schedule, timings), str(tmp_path / "t.png"))
    width, height = _png_size(path)
    assert 800 <= width <= 2000 and height >= 300 and width / height <= 4, (width, height)
    wide = one_f_one_b(16, 64, split_w=True)  # many blocks: wider, never past 20 inches
    width, height = _png_size(render_png(wide, simulate(wide, CostModel()),
                                         str(tmp_path / "w.png")))
    assert width == 2000 and 900 <= height <= 1000, (width, height)
