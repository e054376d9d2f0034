"""``odc-pp plan`` (tools level: reads HF configs and training flags): rank tp x cp x pp x dp, schedule, offload, recompute, dp mode, load balance
and token cap for a model, a cluster and a length distribution by predicted tokens/s,
next to the Megatron-default configuration; prints each one's ``pretrain_gpt.py`` flags.
See docs/planner.md for the model and where it is weak."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

from odc_pp.layout import DataParallelMode
from odc_pp.planner.hardware import GB, PRESETS, memory_budget_gb
from odc_pp.planner.inputs import ModelSpec, describe_histogram, load_lengths
from odc_pp.planner.model import layer_fields
from odc_pp.planner.report import format_plan
from odc_pp.planner.search import SCHEDULES, Candidate, PlanConfig, plan, predict
from odc_pp.planner.verdict import budget_flags
from odc_pp.training.hf_model import model_from_hf
from odc_pp.training.plan_memory import rank_peaks

__all__ = ["main", "build_parser", "model_from_hf", "model_from_flags", "baseline_candidate"]


def model_from_flags(text: str) -> ModelSpec:
    """From Megatron model flags (``"--num-layers 32 --hidden-size 4096 ..."``), parsed by
    ``pretrain_gpt.py``'s own parser so they keep Megatron's meaning."""
    from odc_pp.training.arguments import parse_args

    args = parse_args(text.split() + ["--mock-data"])
    model = args.model
    return ModelSpec(num_layers=model.num_layers, hidden_size=model.hidden_size,
                     num_attention_heads=model.num_attention_heads,
                     ffn_hidden_size=model.ffn_hidden_size or 4 * model.hidden_size,
                     vocab_size=model.vocab_size, seq_length=model.seq_length,
                     gated_mlp=bool(model.swiglu),
                     num_query_groups=model.num_query_groups if model.group_query_attention
                     else None, kv_channels=model.kv_channels, tied=not model.untie_embeddings,
                     source_flags=tuple(text.split()), **layer_fields(model))


def baseline_candidate(text: str, model: ModelSpec, gpus: int, *,
                       global_batch: int | None = None,
                       gpus_per_node: int | None = None) -> Candidate:
    """The user's current layout (``--baseline "FLAGS"``: any flags ``pretrain_gpt.py``
    accepts; what the planner models of them: tp, cp, pp, schedule, --dp-mode, load
    balance, packing and its token cap, --micro-batch-size, recompute, offload) as a
    candidate. Data parallelism is Megatron's (``ddp``: DDP with the distributed
    optimizer) unless --dp-mode is given. The flags are checked as the training job
    checks them on ``gpus`` ranks (``odc_pp.training.job``): a combination that cannot
    run is refused with the flag to add."""
    from odc_pp.schedule.generators import family
    from odc_pp.training.arguments import parse_args
    from odc_pp.training.data_plan import packs_sequences
    from odc_pp.training.job import Job

    given = text.split()
    batch = ["--global-batch-size", str(global_batch)] \
        if global_batch is not None and "--global-batch-size" not in given else []
    try:
        args = parse_args(list(model.model_flags()) + given + batch + ["--mock-data"])
        if "--dp-mode" not in given:
            args.parallel.dp_mode = DataParallelMode.DDP.value
        args = Job.resolve(args, gpus, gpus_per_node).args
    except (ValueError, SystemExit) as exc:
        raise ValueError(f"--baseline {text!r}: {exc}") from None
    tp = args.parallel.tensor_model_parallel_size
    pp = args.parallel.pipeline_model_parallel_size
    cp = args.parallel.context_parallel_size
    name = args.schedule.pipeline_schedule
    chunks = args.schedule.num_model_chunks
    packed = packs_sequences(args)  # and the row cap, as the trainer reads them
    cap = args.data.max_tokens_per_microbatch or \
        args.data.micro_batch_size * args.model.seq_length
    return Candidate(tp=tp, cp=cp, pp=pp, dp=gpus // (tp * cp * pp), schedule=name,
                     dp_mode=args.parallel.dp_mode, balance=args.data.load_balance,
                     packed=packed,
                     token_cap=cap if packed else None,
                     recompute=args.model.recompute_lgd,
                     micro_batch=1 if packed else args.data.micro_batch_size,
                     offload_chunks=tuple(args.schedule.offload_chunks)
                     if family(name).offloads and args.schedule.offload_chunks else None,
                     keep_sp_input_for_w=args.parallel.keep_sp_input_for_w, chunks=chunks)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odc-pp plan", description=__doc__.split("\n\n")[0])
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--hf-config", help="HF config.json (or its directory) of the model")
    model.add_argument("--model-flags", help='Megatron model flags, quoted: "--num-layers 32 '
                       '--hidden-size 4096 --num-attention-heads 32 --seq-length 8192 ..."')
    parser.add_argument("--seq-length", type=int, default=None,
                        help="longest sample (with --hf-config; default its "
                             "max_position_embeddings)")
    parser.add_argument("--cluster", choices=sorted(PRESETS), default="h100",
                        help="GPU preset: peak bf16 TFLOP/s, HBM, 8 GPUs per node, NVLink, "
                             "inter-node and host-link bandwidth")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs in the job")
    parser.add_argument("--gpus-per-node", type=int, default=None,
                        help="override the preset's 8")
    parser.add_argument("--efficiency", type=float, default=None,
                        help="fraction of peak a full-size layer reaches (default 0.45)")
    lengths = parser.add_mutually_exclusive_group(required=True)
    lengths.add_argument("--lengths-jsonl", help="JSONL with input_ids lists or length fields")
    lengths.add_argument("--lengths-histogram",
                         help='"LEN:WEIGHT,...", e.g. "512:70,2048:20,8192:8,32768:2": '
                              'WEIGHT of the samples have lengths spread uniformly from '
                              'the previous LEN + 1 (1 for the first) to LEN, so "8192:100" '
                              'means 1..8192, mean ~4096 (the plan prints how it read it)')
    parser.add_argument("--global-batch", type=int, default=None,
                        help="samples per optimizer step")
    parser.add_argument("--global-batch-tokens", type=int, default=None,
                        help="tokens per step instead (converted with the mean length)")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="usable memory per GPU, GB (default 90%% of the --cluster GPU's "
                             "HBM, as the dry run's --dry-run-gpu)")
    parser.add_argument("--tp-sizes", type=_ints, default=(1, 2, 4, 8))
    parser.add_argument("--schedules", default=",".join(SCHEDULES),
                        help="schedule families tried (comma-separated)")
    parser.add_argument("--token-caps", type=_ints, default=(1, 2, 4),
                        help="packed-row caps tried, in multiples of --seq-length")
    parser.add_argument("--dp-modes", default="collective,odc")
    parser.add_argument("--samples", type=int, default=2,
                        help="global minibatches drawn per candidate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes that evaluate the candidates (default: the CPUs "
                             "this process may use; the plan is the same for any number)")
    parser.add_argument("--baseline", default=None, metavar='"FLAGS"',
                        help='your current layout, quoted, e.g. "--tensor-model-parallel-size '
                             '4 --pipeline-model-parallel-size 2 --pipeline-schedule 1f1b": '
                             'predicted as row B (any pretrain_gpt.py flags; Megatron\'s '
                             'ddp data parallelism unless --dp-mode is given)')
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write every prediction here")
    return parser


def _usable_cpus() -> int:
    """The CPUs this process may run on (``--jobs``'s default)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        model = model_from_hf(args.hf_config, seq_length=args.seq_length) if args.hf_config \
            else model_from_flags(args.model_flags)
        cluster = PRESETS[args.cluster]
        if args.gpus_per_node or args.efficiency:
            from dataclasses import replace

            cluster = replace(cluster, gpus_per_node=args.gpus_per_node or cluster.gpus_per_node,
                              mfu=args.efficiency or cluster.mfu)
        lengths = load_lengths(jsonl=args.lengths_jsonl, histogram=args.lengths_histogram,
                               seq_length=model.seq_length, seed=args.seed)
        if (args.global_batch is None) == (args.global_batch_tokens is None):
            raise ValueError("give exactly one of --global-batch and --global-batch-tokens")
        batch = args.global_batch or max(1, round(args.global_batch_tokens / lengths.mean()))
        config = PlanConfig(model=model, cluster=cluster, gpus=args.gpus, global_batch=batch,
                            lengths=lengths, memory_gb=args.memory_gb, tp_sizes=args.tp_sizes,
                            schedules=tuple(args.schedules.split(",")),
                            token_caps=args.token_caps,
                            dp_modes=tuple(args.dp_modes.split(",")), samples=args.samples,
                            seed=args.seed, rank_memory=functools.partial(
                                rank_peaks, budget_bytes=memory_budget_gb(
                                    cluster, args.memory_gb) * GB),
                            workers=args.jobs or _usable_cpus())
        baseline = None
        if args.baseline:
            cand = baseline_candidate(args.baseline, model, args.gpus, global_batch=batch,
                                      gpus_per_node=cluster.gpus_per_node)
            try:
                baseline = predict(config, cand)
            except ValueError as exc:
                raise ValueError(f"--baseline {args.baseline!r}: {exc}") from None
    except (ValueError, OSError, KeyError) as exc:
        print(f"odc-pp plan: error: {exc}", file=sys.stderr)
        return 2
    began = time.perf_counter()
    predictions, default = plan(config)
    if not predictions:
        print("odc-pp plan: no configuration runs (check --gpus, the layer and head counts)",
              file=sys.stderr)
        return 1
    print(f"{cluster.name} x {args.gpus}, global batch {batch} samples "
          f"(mean length {lengths.mean():.0f}), {len(predictions)} configurations in "
          f"{time.perf_counter() - began:.1f} s with {config.workers} processes")
    if args.lengths_histogram:
        print(describe_histogram(args.lengths_histogram, lengths))
    print(format_plan(predictions, default, top=args.top, baseline=baseline, gpus=args.gpus,
                      budget=tuple(budget_flags(args.cluster, args.memory_gb)),
                      budget_gb=config.memory_bytes / GB))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"predictions": [p.to_dict() for p in predictions],
                       "megatron_default": default.to_dict() if default else None,
                       "baseline": baseline.to_dict() if baseline else None}, handle,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
