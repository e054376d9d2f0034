"""Cost of layout-invariant (keyed) dropout against torch's RNG dropout and against none.

Two parts, each over ``--rounds`` rounds (the first a warm-up; configurations rotate so
none always runs first), medians reported:

* ``ops``: forward + backward of one dropout (p = 0.1) on a hidden activation
  ``[seq, batch, hidden]`` and on attention probabilities ``[batch, heads, seq, seq]``:
  torch's ``F.dropout`` (megatron-core's, one RNG stream per rank) against the keyed mask
  of :mod:`odc_pp.megatron.dropout` (a 32-bit integer hash of the token keys per element),
  milliseconds per call and the ratio.
* ``model``: F + B (weight gradients included) of one megatron chunk (``--layers``
  layers, hidden ``--hidden``, ``--heads`` heads, ``--seq`` tokens x ``--batch`` rows)
  with dropout 0 and with keyed hidden and attention dropout 0.1, milliseconds per
  microbatch and the overhead.

The ratios compare each configuration's fastest round (on a shared machine the least
disturbed one); the medians are reported too.

    .venv/bin/python benchmarks/bench_dropout.py --json            # CPU -> dropout_cpu.json
    .venv/bin/python benchmarks/bench_dropout.py --device cuda --json --out \\
        $OUT/dropout_gpu.json      # on a GPU (not measured yet)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.testing.bench import emit, load_1min, rotated  # noqa: E402

PROB = 0.1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5, help="calls timed per round")
    parser.add_argument("--rounds", type=int, default=11, help="rounds (the first: warm-up)")
    parser.add_argument("--out", default=None, help="result file (default: "
                        "benchmarks/results/dropout_<device>.json)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def _timer(device):
    import torch

    def seconds(run, repeats: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / repeats

    return seconds


def _op_runs(args, device) -> dict:
    """name -> a forward + backward of one dropout call."""
    import torch

    from odc_pp.data import row_token_ids
    from odc_pp.megatron.dropout import KeyedAttentionDropout, KeyedDropout, dropout_scope

    ids = row_token_ids(args.batch, args.seq).to(device)
    hidden = torch.randn(args.seq, args.batch, args.hidden, device=device, requires_grad=True)
    probs = torch.rand(args.batch, args.heads, args.seq, args.seq, device=device,
                       requires_grad=True)
    keyed_hidden, keyed_probs = KeyedDropout(PROB), KeyedAttentionDropout(PROB)

    def step(fn, x):
        def run():
            with dropout_scope(seed=1234, token_ids=ids):
                fn(x).sum().backward()
        return run

    torch_dropout = (lambda x: torch.nn.functional.dropout(x, PROB, training=True))
    return {"hidden_torch": step(torch_dropout, hidden),
            "hidden_keyed": step(keyed_hidden, hidden),
            "attention_torch": step(torch_dropout, probs),
            "attention_keyed": step(keyed_probs, probs)}


def _model_runs(args, device) -> dict:
    """dropout setting -> F + B of one microbatch through a fresh chunk."""
    import torch

    from odc_pp.data import Microbatch, row_token_ids
    from odc_pp.training.distributed import standalone_process_groups
    from odc_pp.megatron.model import ModelConfig, build_chunks

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 128, (args.batch, args.seq), generator=generator)
    microbatch = Microbatch(tokens=tokens, labels=tokens.roll(1, 1),
                            global_token_ids=row_token_ids(args.batch, args.seq))
    runs = {}
    for name, prob in (("off", 0.0), ("keyed", PROB)):
        config = ModelConfig(vocab_size=128, hidden_size=args.hidden, num_layers=args.layers,
                             num_attention_heads=args.heads, max_sequence_length=args.seq,
                             hidden_dropout=prob, attention_dropout=prob,
                             device=str(device))
        (chunk,) = build_chunks(config, pp_rank=0, pp_size=1,
                                process_groups=standalone_process_groups())

        def run(chunk=chunk):
            chunk(None, microbatch).float().sum().backward()

        runs[name] = run
    return runs


def measure(args) -> dict:
    import torch
    import torch.distributed as dist

    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    seconds = _timer(device)
    parts = {"ops": _op_runs(args, device), "model": _model_runs(args, device)}
    times = {part: {name: [] for name in runs} for part, runs in parts.items()}
    for round_index in range(args.rounds):
        for part, runs in parts.items():
            for name in rotated(list(runs), round_index):
                value = seconds(runs[name], args.repeats)
                if round_index:
                    times[part][name].append(round(value * 1e3, 3))
    dist.destroy_process_group()
    median = {part: {name: round(statistics.median(v), 3) for name, v in rows.items()}
              for part, rows in times.items()}
    fastest = {part: {name: min(v) for name, v in rows.items()} for part, rows in times.items()}
    ops, model = fastest["ops"], fastest["model"]  # the least disturbed round of each
    return {"ms": median, "min_ms": fastest, "rounds_ms": times,
            "keyed_over_torch": {
                "hidden": round(ops["hidden_keyed"] / ops["hidden_torch"], 3),
                "attention": round(ops["attention_keyed"] / ops["attention_torch"], 3)},
            "model_overhead": round(model["keyed"] / model["off"] - 1.0, 3)}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    load = load_1min()
    result = measure(args)
    out = args.out or os.path.join(ROOT, "benchmarks", "results",
                                   f"dropout_{args.device.split(':')[0]}.json")
    doc = {"config": {k: v for k, v in vars(args).items() if k not in ("json", "out")},
           "prob": PROB, "load_1min": load, **result}
    emit(doc, out=out, as_json=args.json)
    if not args.json:
        for part, rows in result["ms"].items():
            for name, value in rows.items():
                print(f"{part:6s} {name:16s} {value:9.3f} ms")
        print(f"keyed / torch dropout: {result['keyed_over_torch']}; model F+B overhead "
              f"of keyed dropout 0.1: {result['model_overhead']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
