"""``odc-pp plan``'s table: the ranked predictions of :mod:`.search` as text, with a legend
for every column, the Megatron default (row M, its source named) and the user's
``--baseline`` (row B), and the best FSDP-style configuration (``--dp-mode collective``,
row F) when none of the rows above is one."""

from __future__ import annotations

from .search import MEGATRON_SOURCE, Prediction
from .verdict import dry_run_command, fullest_pipeline_rank

__all__ = ["format_plan", "dry_run_lines", "DRY_RUN_PREFIX", "LEGEND"]


LEGEND = (
    "columns: # rank by predicted tok/s (M: the Megatron default, F: the best FSDP-style "
    "--dp-mode collective, B: --baseline); "
    "tp: tensor-parallel size; cp: --context-parallel-size (sequence split, ring "
    "attention); pp: pipeline-parallel size; dp: data-parallel size;",
    "  schedule: --pipeline-schedule; dp-mode: --dp-mode; balance: --load-balance; cap: "
    "--max-tokens-per-microbatch of packed rows (-: unpacked, mb samples per microbatch); "
    "mb: --micro-batch-size;",
    "  rc: --recompute-lgd (y: on); tok/s: predicted tokens per second (sample tokens, no "
    "padding); step ms: predicted step = comp + bubble + dpwait + comm + opt;",
    "  comp: the busiest rank's own F/B/W work (with cp: 1/cp of it plus the exposed "
    "ring K/V transfers); bubble: pipeline idle; dpwait: waiting for "
    "slower replicas; comm: exposed data-parallel gradient traffic (over dp x cp); "
    "opt: the optimizer step of a rank's owned shard (fused AdamW at the GPU's memory "
    "bandwidth);",
    "  mem GB: predicted peak of the fullest pipeline rank (the dry run's memory model of "
    "the printed flags); MFU: model FLOPs utilisation; fits: mem GB within the budget "
    "(--memory-gb, else 90% of the --cluster GPU's HBM: the dry run's budget, printed "
    "with each row's dry-run command).")
"""The legend printed under the table: every column."""


def format_plan(preds: list[Prediction], default: Prediction | None, *, top: int,
                baseline: Prediction | None = None, gpus: int | None = None,
                budget: tuple[str, ...] = (), budget_gb: float | None = None) -> str:
    """The ranking as text: top configurations, the Megatron default and the user's
    ``--baseline`` (row B), with flags; with ``gpus``, each one's dry-run command
    (:func:`dry_run_lines`: ``budget`` the budget flags, ``budget_gb`` their GB)."""
    lines = [f"{'#':>3} {'tp':>2} {'cp':>2} {'pp':>2} {'dp':>3} {'schedule':<11} "
             f"{'dp-mode':<10} {'balance':<8} {'cap':>6} {'mb':>2} {'rc':>2} {'tok/s':>10} "
             f"{'step ms':>9} "
             f"{'comp':>7} {'bubble':>7} {'dpwait':>7} {'comm':>7} {'opt':>6} {'mem GB':>7} "
             f"{'MFU':>5} fits"]
    shown = preds[:top] + ([default] if default is not None and default not in preds[:top]
                           else [])
    fsdp = next((p for p in preds if p.candidate.dp_mode.is_collective and p.fits), None)
    extra = [fsdp] if fsdp is not None and fsdp not in shown else []
    rows = shown + extra + ([baseline] if baseline is not None else [])
    for rank, pred in enumerate(rows, 1):
        c, b = pred.candidate, pred.breakdown
        label = "B" if pred is baseline else "M" if pred is default else \
            "F" if pred in extra else str(rank)
        lines.append(
            f"{label:>3} {c.tp:>2} {c.cp:>2} {c.pp:>2} {c.dp:>3} {c.schedule:<11} "
            f"{c.dp_mode:<10} {c.balance:<8} {c.token_cap or '-':>6} {c.micro_batch:>2} "
            f"{'y' if c.recompute else '-':>2} "
            f"{pred.tokens_per_s:>10.0f} {pred.step_s * 1e3:>9.1f} {b['compute'] * 1e3:>7.1f} "
            f"{b['bubble'] * 1e3:>7.1f} {b['dp_wait'] * 1e3:>7.1f} {b['comm'] * 1e3:>7.1f} "
            f"{b.get('optimizer', 0.0) * 1e3:>6.1f} "
            f"{max(pred.peak_memory_gb):>7.1f} {pred.mfu:>5.1%} {'yes' if pred.fits else 'NO'}")
    if shown:
        lines += ["", *LEGEND, ""]
        lines.append("flags of #1: " + " ".join(shown[0].flags))
        lines += dry_run_lines("#1", shown[0], gpus, budget, budget_gb)
    if default is not None:
        lines.append(f"M: {MEGATRON_SOURCE}")
        lines.append("flags of the Megatron default (M): " + " ".join(default.flags))
        lines += dry_run_lines("M", default, gpus, budget, budget_gb)
        if shown and shown[0] is not default:
            lines.append(f"predicted speed-up of #1 over M: "
                         f"{shown[0].tokens_per_s / default.tokens_per_s:.2f}x")
    if baseline is not None and shown:
        lines.append("flags of your baseline (B): " + " ".join(baseline.flags))
        lines += dry_run_lines("B", baseline, gpus, budget, budget_gb)
        lines.append(f"predicted speed-up of #1 over B: "
                     f"{shown[0].tokens_per_s / baseline.tokens_per_s:.2f}x")
    return "\n".join(lines)


DRY_RUN_PREFIX = "  dry run: "
"""What starts a printed dry-run command (the command follows it, as it runs)."""


def dry_run_lines(label: str, pred: Prediction, gpus: int | None, budget: tuple[str, ...],
                  budget_gb: float | None) -> list[str]:
    """The fullest pipeline rank of row ``label``, its predicted peak and verdict, and
    the ``pretrain_gpt.py --dry-run`` command that checks them (empty without ``gpus``)."""
    if gpus is None:
        return []
    pp_rank, rank = fullest_pipeline_rank(pred)
    verdict = "fits" if pred.fits else "DOES NOT FIT"
    within = f" in {budget_gb:g} GB" if budget_gb is not None else ""
    return [f"  fullest pipeline rank of {label}: {pp_rank} (global rank {rank}), predicted "
            f"peak {max(pred.peak_memory_gb):.2f} GB -> {verdict}{within}",
            DRY_RUN_PREFIX + " ".join(dry_run_command(pred, gpus=gpus, budget=budget))]
