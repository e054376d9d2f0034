"""Draw a simulated schedule: ASCII timeline, SVG, PNG (matplotlib Agg), memory plot.

Compute actions are coloured by kind (F blue, B green, W orange, BW teal) and labelled
with their microbatch; odd chunks are drawn darker (ASCII: even chunks upper case, odd chunks lower case). Transfers and
offload/reload traffic appear on a thin row under each rank.
"""

from __future__ import annotations

import os
from xml.sax.saxutils import escape

from .ir import ActionKind, Schedule
from .simulator import SimResult

__all__ = ["render_ascii", "render_svg", "render_png", "render_memory_png", "png_size_inches",
           "ascii_legend"]

_COLOURS = {ActionKind.F: "#4c72b0", ActionKind.B: "#55a868", ActionKind.W: "#dd8452",
            ActionKind.BW: "#2a9d8f"}
_DARK = {ActionKind.F: "#27406b", ActionKind.B: "#2f6b3d", ActionKind.W: "#9c4f23",
         ActionKind.BW: "#17635a"}
_SIDE_COLOURS = {ActionKind.SEND_F: "#8172b2", ActionKind.SEND_B: "#8172b2",
                 ActionKind.RECV_F: "#937860", ActionKind.RECV_B: "#937860",
                 ActionKind.OFFLOAD: "#c44e52", ActionKind.RELOAD: "#da8bc3"}
_LETTER = {ActionKind.F: "F", ActionKind.B: "B", ActionKind.W: "W", ActionKind.BW: "X"}


def _colour(kind: ActionKind, chunk: int) -> str:
    return (_DARK if chunk % 2 else _COLOURS)[kind]


def _side_intervals(sim: SimResult, rank: int):
    for action, s, e in zip(sim.rank_actions[rank], sim.rank_starts[rank],
                            sim.rank_ends[rank]):
        if action.kind in _SIDE_COLOURS and e > s:
            yield action, s, e


def ascii_legend(step: float) -> str:
    """The key of :func:`render_ascii`'s cells."""
    return (f"legend: F forward, B input grad, W weight grad, X fused B+W (upper case: even "
            f"chunks, lower case: odd chunks), . idle; one column = {step:.4g} time units")


def render_ascii(schedule: Schedule, sim: SimResult, width: int = 120) -> str:
    """A title line (schedule, makespan, bubbles), one row per rank and the legend
    (:func:`ascii_legend`); each column is ``makespan / width`` time units.

    Letters: F forward, B input grad, W weight grad, X fused BW; upper case for even
    chunks, lower case for odd chunks; ``.`` idle. A cell shows the action covering
    its midpoint.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    start = min((iv[0] for rank_iv in sim.compute_intervals for iv in rank_iv), default=0.0)
    total = sim.makespan or 1.0
    step = total / width
    rows = []
    label_width = len(f"r{schedule.pp - 1}")
    for rank in range(schedule.pp):
        cells = ["."] * width
        for s, e, action in sim.compute_intervals[rank]:
            letter = _LETTER[action.kind]
            if action.chunk % 2:
                letter = letter.lower()
            first = int((s - start) / step + 0.5)
            last = int((e - start) / step + 0.5)
            for col in range(max(first, 0), min(max(last, first + 1), width)):
                cells[col] = letter
        rows.append(f"r{rank}".ljust(label_width) + " |" + "".join(cells) + "|")
    title = (f"{schedule.name}: pp={schedule.pp} microbatches={schedule.num_microbatches} "
             f"chunks={schedule.num_chunks} | makespan {sim.makespan:.4g} | bubble "
             f"{sim.makespan_bubble_rate:.2%} of the makespan | span "
             f"{sim.max_stage_span:.4g}, bubble {sim.bubble_rate:.2%} of the span")
    return "\n".join([title, *rows, ascii_legend(step)])


def render_svg(schedule: Schedule, sim: SimResult, *, scale: float = 20.0,
               row_height: float = 24.0) -> str:
    """SVG with one ``<rect class="compute">`` per compute action, labelled with its
    chunk.microbatch, and thin ``<rect class="side">`` bars for transfers/offload."""
    side_height = row_height / 5
    pitch = row_height + side_height + 4
    margin = 40.0
    width = margin + sim.makespan * scale + 10
    height = schedule.pp * pitch + 10
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.1f}" '
             f'height="{height:.1f}" viewBox="0 0 {width:.1f} {height:.1f}">',
             f"<title>{escape(schedule.name)}: makespan {sim.makespan:.3f}, "
             f"bubble {sim.makespan_bubble_rate:.3%} (of the span: {sim.bubble_rate:.3%})"
             f"</title>"]
    for rank in range(schedule.pp):
        y = 5 + rank * pitch
        parts.append(f'<text x="2" y="{y + row_height * 0.7:.1f}" font-size="12">'
                     f"r{rank}</text>")
        for s, e, action in sim.compute_intervals[rank]:
            x = margin + s * scale
            parts.append(
                f'<rect class="compute" data-kind="{action.kind.value}" x="{x:.2f}" '
                f'y="{y:.2f}" width="{(e - s) * scale:.2f}" height="{row_height:.2f}" '
                f'fill="{_colour(action.kind, action.chunk)}" stroke="white" '
                f'stroke-width="0.5"><title>{escape(action.short())} '
                f"[{s:.3f}, {e:.3f}]</title></rect>")
            if (e - s) * scale >= 18:
                parts.append(f'<text x="{x + 2:.2f}" y="{y + row_height * 0.65:.2f}" '
                             f'font-size="9" fill="white">{action.chunk}.'
                             f"{action.microbatch}</text>")
        for action, s, e in _side_intervals(sim, rank):
            parts.append(
                f'<rect class="side" data-kind="{action.kind.value}" '
                f'x="{margin + s * scale:.2f}" y="{y + row_height + 1:.2f}" '
                f'width="{(e - s) * scale:.2f}" height="{side_height:.2f}" '
                f'fill="{_SIDE_COLOURS[action.kind]}"/>')
    parts.append("</svg>")
    return "\n".join(parts)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> None:
    """Lay out and write ``fig`` to ``path``, creating its folder."""
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


def png_size_inches(schedule: Schedule, sim: SimResult) -> tuple[float, float]:
    """(width, height) of :func:`render_png`'s figure: about a quarter inch per typical
    (median) block across the makespan, 8 to 20 inches wide; half an inch per rank, at
    least 3 inches high -- readable at 100 dpi whether the times are unit costs or
    measured seconds (where one short action must not stretch the picture)."""
    durations = sorted(e - s for rank in sim.compute_intervals for s, e, _ in rank if e > s)
    typical = durations[len(durations) // 2] if durations else 1.0
    across = sim.makespan / typical if typical > 0 else 1.0
    width = min(20.0, max(8.0, 4.0 + 0.25 * across))
    height = min(24.0, max(3.0, 0.5 * schedule.pp + 1.5))
    return width, height


def render_png(schedule: Schedule, sim: SimResult, path: str) -> str:
    """Gantt chart PNG at ``path`` (coloured by kind, odd chunks darker, thin row for
    transfers/offload; a block's microbatch is written on it where it fits), sized by
    :func:`png_size_inches`. Returns ``path``."""
    plt = _pyplot()
    width, height = png_size_inches(schedule, sim)
    fig, ax = plt.subplots(figsize=(width, height))
    # points per time unit on the axes (the tick labels and the legend take ~3 inches)
    points = 72.0 * max(width - 3.0, 1.0) / (sim.makespan or 1.0)
    try:
        for rank in range(schedule.pp):
            y = schedule.pp - 1 - rank
            for s, e, action in sim.compute_intervals[rank]:
                ax.broken_barh([(s, e - s)], (y + 0.2, 0.75),
                               facecolors=_colour(action.kind, action.chunk),
                               edgecolor="white", linewidth=0.3)
                label = str(action.microbatch)
                if (e - s) * points >= 4.5 * len(label) + 2:
                    ax.text(s + (e - s) / 2, y + 0.575, label, ha="center", va="center",
                            color="white", clip_on=True, fontsize=7)
            for action, s, e in _side_intervals(sim, rank):
                ax.broken_barh([(s, e - s)], (y + 0.02, 0.15),
                               facecolors=_SIDE_COLOURS[action.kind])
        ax.set_yticks([schedule.pp - 1 - r + 0.55 for r in range(schedule.pp)])
        ax.set_yticklabels([f"rank {r}" for r in range(schedule.pp)])
        ax.set_xlabel("time")
        ax.set_title(f"{schedule.name}: pp={schedule.pp}, m={schedule.num_microbatches}, "
                     f"makespan {sim.makespan:.4g}, bubble {sim.makespan_bubble_rate:.1%}")
        handles = [plt.Rectangle((0, 0), 1, 1, color=_COLOURS[k]) for k in _COLOURS]
        handles.append(plt.Rectangle((0, 0), 1, 1, color=_DARK[ActionKind.F]))
        labels = [k.value for k in _COLOURS] + ["odd chunk (darker)"]
        # beside the axes, never over the blocks; numbers on blocks are microbatches
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.005, 1.0),
                  fontsize=7, borderaxespad=0.0, title="block = microbatch",
                  title_fontsize=7)
        _save(fig, path)
    finally:
        plt.close(fig)
    return path


def render_memory_png(schedule: Schedule, sim: SimResult, path: str) -> str:
    """Activation memory over time, one step line per rank. Returns ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    try:
        for rank, timeline in enumerate(sim.memory_timeline):
            times = [t for t, _ in timeline] + [sim.makespan]
            values = [v for _, v in timeline] + [timeline[-1][1]]
            ax.step(times, values, where="post", label=f"rank {rank}", linewidth=1)
        if sim.memory_limit is not None:
            ax.axhline(sim.memory_limit, color="black", linestyle="--", linewidth=0.8,
                       label="limit")
        ax.set_xlabel("time")
        ax.set_ylabel("activations (microbatch-chunks)")
        ax.set_title(f"{schedule.name}: peak {max(sim.peak_activation, default=0):g}")
        if schedule.pp <= 16:
            ax.legend(fontsize=7, ncol=2)
        _save(fig, path)
    finally:
        plt.close(fig)
    return path
