"""ODC transport bandwidth vs. the local memcpy limit and gloo collectives, in one run.

Two ranks on this host (gloo). For each size (bytes of the full tensor): single-thread
libc memcpy and the transport's own copy kernel on rank 0 alone, that kernel on every
rank at once, ODC gather_into_tensor and scatter_accumulate (+ wait + sync), ODC get and
put of the whole tensor from / into the other rank (rank 0 alone), and gloo
all_gather_into_tensor / reduce_scatter_tensor. Every op runs once per round, rounds
repeat, GB/s = full-tensor bytes / median seconds. Ratios are printed next to the targets
of issue 3. Below the streaming threshold (``_C.streaming_min_bytes()``) the kernel is libc
memcpy, and differences between those two columns are cache state: memcpy runs first in
a round, right after the gloo ops of the previous one.

    python benchmarks/bench_transport.py [--json] [--sizes-mib 1 4 16 64 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from odc_pp.testing.launch import LaunchConfig, run_workers  # noqa: E402


def _no_device_sync() -> None:
    pass


def _timed(fn, only_rank0: bool, rank: int, synchronize=_no_device_sync) -> float:
    """Seconds of one call; the slower rank defines the op (rank 0 alone if only_rank0).
    ``synchronize`` waits for queued device work (CUDA) before and after the call."""
    dist.barrier()
    synchronize()
    start = time.perf_counter()
    if rank == 0 or not only_rank0:
        fn()
        synchronize()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    if only_rank0 and rank != 0:
        elapsed.zero_()
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def _interleaved_medians(ops: dict, iterations: int, rank: int,
                         synchronize=_no_device_sync) -> dict[str, float]:
    """Median seconds per op ({name: (fn, only_rank0)}), after one warm-up call each,
    running every op once per round so that they all see the same machine (these boxes are
    noisy: measuring one op after another compares different times)."""
    for fn, only_rank0 in ops.values():  # page faults, first mappings
        _timed(fn, only_rank0, rank, synchronize)
    times = {name: [] for name in ops}
    for _ in range(iterations):
        for name, (fn, only_rank0) in ops.items():
            times[name].append(_timed(fn, only_rank0, rank, synchronize))
    return {name: statistics.median(values) for name, values in times.items()}


def _measure_size(group, nbytes: int, iterations: int, odc) -> dict:
    from odc_pp import _C
    world, rank = group.world_size, group.rank
    numel = nbytes // 4
    shard_size = -(-numel // world)
    src, dst = torch.ones(numel), torch.zeros(numel)
    shard = odc.symmetric_empty(shard_size, torch.float32, group)
    shard.fill_(1.0)
    accumulator = odc.symmetric_empty(shard_size, torch.float32, group)
    accumulator.zero_()
    output, gradient = torch.zeros(numel), torch.ones(numel)
    padded_out, reduced = torch.zeros(shard_size * world), torch.zeros(shard_size)
    padded_in = torch.ones(shard_size * world)
    window = odc.symmetric_empty(numel, torch.float32, group)  # whole tensor, for get / put
    window.fill_(1.0)
    peer = (rank + 1) % world
    odc.sync(group)

    def push():
        odc.scatter_accumulate(accumulator, gradient, group).wait()
        odc.sync(group)

    ops = {
        # single-thread copies on rank 0 alone: libc memcpy (the reference) and the
        # transport's copy kernel
        "memcpy_1thread": (lambda: _C.libc_copy_bytes(dst.data_ptr(), src.data_ptr(), nbytes),
                           True),
        "kernel_1thread": (lambda: _C.copy_bytes(dst.data_ptr(), src.data_ptr(), nbytes, 1),
                           True),
        # the kernel on every rank at once: the memory-bandwidth share a rank really has
        # while all ranks gather
        "kernel_concurrent": (lambda: _C.copy_bytes(dst.data_ptr(), src.data_ptr(), nbytes, 1),
                              False),
        "odc_gather": (lambda: odc.gather_into_tensor(output, shard, group), False),
        "odc_scatter_accumulate": (push, False),
        # rank 0 alone reads / writes the whole tensor in rank 1's memory
        "odc_get": (lambda: odc.get(output, window, peer, group), True),
        "odc_put": (lambda: odc.put(window, gradient, peer, group).wait(), True),
        "gloo_all_gather": (lambda: dist.all_gather_into_tensor(padded_out, shard.clone()),
                            False),
        "gloo_reduce_scatter": (lambda: dist.reduce_scatter_tensor(reduced, padded_in), False),
    }
    medians = _interleaved_medians(ops, iterations, rank)
    group.destroy()  # unmaps the peers' buffers of this size
    row = {"mib": nbytes / 2**20}
    row.update({f"{name}_gbps": nbytes / seconds / 1e9 for name, seconds in medians.items()})
    return row


def _worker(rank: int, world: int, sizes_mib: list[float], threads: int) -> list | None:
    from odc_pp.odc import primitives as odc
    rows = []
    for mib in sizes_mib:
        group = odc.new_group(config=odc.TransportConfig(timeout_s=120, num_threads=threads))
        nbytes = int(mib * 2**20)
        rows.append(_measure_size(group, nbytes, 31 if nbytes <= 16 * 2**20 else 11, odc))
    return rows if rank == 0 else None


_TEXT_COLUMNS = [
    ("MiB", "mib"), ("memcpy", "memcpy_1thread_gbps"), ("kernel", "kernel_1thread_gbps"),
    ("cc_kern", "kernel_concurrent_gbps"), ("gather", "odc_gather_gbps"),
    ("scatter", "odc_scatter_accumulate_gbps"), ("get", "odc_get_gbps"),
    ("put", "odc_put_gbps"), ("gloo_ag", "gloo_all_gather_gbps"),
    ("gloo_rs", "gloo_reduce_scatter_gbps"), ("g/mem", "gather_vs_memcpy"),
    ("g/cc", "gather_vs_concurrent_kernel"), ("g/ag", "gather_vs_gloo_all_gather"),
    ("s/rs", "scatter_vs_gloo_reduce_scatter"), ("get/mem", "get_vs_memcpy"),
    ("put/mem", "put_vs_memcpy"),
]


def emit_json(result: dict, args) -> bool:
    """Write ``result`` to ``--out`` if given; print it and return True with ``--json``."""
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    if args.json:
        print(text)
    return args.json


def print_table(rows: list[dict], columns: list[tuple[str, str]]) -> None:
    """One line per row: the ``(header, key)`` columns, two decimals."""
    print(" ".join(f"{header:>7}" for header, _ in columns))
    for row in rows:
        print(" ".join(f"{row[key]:>7.2f}" for _, key in columns))


def _copy_kernel() -> str:
    from odc_pp import _C
    return _C.copy_kernel()


def _add_ratios(row: dict) -> dict:
    row["gather_vs_memcpy"] = row["odc_gather_gbps"] / row["memcpy_1thread_gbps"]
    row["gather_vs_kernel"] = row["odc_gather_gbps"] / row["kernel_1thread_gbps"]
    row["gather_vs_concurrent_kernel"] = row["odc_gather_gbps"] / row["kernel_concurrent_gbps"]
    row["get_vs_memcpy"] = row["odc_get_gbps"] / row["memcpy_1thread_gbps"]
    row["put_vs_memcpy"] = row["odc_put_gbps"] / row["memcpy_1thread_gbps"]
    row["gather_vs_gloo_all_gather"] = row["odc_gather_gbps"] / row["gloo_all_gather_gbps"]
    row["scatter_vs_gloo_reduce_scatter"] = (row["odc_scatter_accumulate_gbps"]
                                             / row["gloo_reduce_scatter_gbps"])
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--threads", type=int, default=0,
                        help="TransportConfig.num_threads (0 = auto)")
    args = parser.parse_args(argv)
    world = 2
    rows = run_workers(_worker, world, args.sizes_mib, args.threads,
                       config=LaunchConfig(timeout_s=1800, process_group_timeout_s=300))[0]
    rows = [_add_ratios(row) for row in rows]
    result = {"benchmark": "odc transport vs memcpy and gloo", "ranks": world, "num_threads": args.threads,
              "host_cpus": os.cpu_count(), "torch": torch.__version__,
              "copy_kernel": _copy_kernel(), "rows": rows,
              "targets": {"gather_vs_memcpy_at_16mib_plus": 0.7,
                          "gather_vs_gloo_all_gather": 3.0,
                          "scatter_vs_gloo_reduce_scatter": 2.0}}
    if not emit_json(result, args):
        print(f"copy kernel: {result['copy_kernel']}; GB/s and ratios; cc_kern: the copy "
              f"kernel on both ranks at once")
        print_table(rows, _TEXT_COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
