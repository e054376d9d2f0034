"""ODC transport bandwidth vs. the local memcpy limit and gloo collectives, in one run.

Two ranks on this host (gloo). For each size (bytes of the full tensor): single-thread
memcpy GB/s (rank 0 alone, and every rank at once), ODC gather_into_tensor and scatter_accumulate (+ wait + sync)
GB/s, and gloo all_gather_into_tensor / reduce_scatter_tensor GB/s. GB/s = full-tensor
bytes / median seconds. Ratios are printed next to the targets of issue 3.

    python benchmarks/bench_transport.py [--json] [--sizes-mib 1 4 16 64 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _median_seconds(fn, iterations: int) -> float:
    times = []
    for _ in range(iterations):
        dist.barrier()
        start = time.perf_counter()
        fn()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slower rank defines the op
        times.append(float(elapsed))
    return statistics.median(times)


def _measure_size(group, nbytes: int, iterations: int, odc) -> dict:
    from odc_pp import _C
    world = group.world_size
    numel = nbytes // 4
    shard_size = -(-numel // world)
    row = {"mib": nbytes / 2**20}
    gbps = lambda seconds: nbytes / seconds / 1e9  # noqa: E731
    if group.rank == 0:
        src, dst = torch.ones(numel), torch.empty(numel)
        times = []
        for _ in range(iterations):
            start = time.perf_counter()
            _C.copy_bytes(dst.data_ptr(), src.data_ptr(), nbytes, 1)
            times.append(time.perf_counter() - start)
        row["memcpy_1thread_gbps"] = gbps(statistics.median(times))
        del src, dst
    dist.barrier()
    # the same copy on every rank at once: the memory-bandwidth share a rank really has
    # while all ranks gather (the slower rank defines the time, as for the collectives)
    src, dst = torch.ones(numel), torch.zeros(numel)
    row["memcpy_concurrent_gbps"] = gbps(_median_seconds(
        lambda: _C.copy_bytes(dst.data_ptr(), src.data_ptr(), nbytes, 1), iterations))
    del src, dst
    shard = odc.symmetric_empty(shard_size, torch.float32, group)
    shard.fill_(1.0)
    accumulator = odc.symmetric_empty(shard_size, torch.float32, group)
    accumulator.zero_()
    output = torch.empty(numel)
    gradient = torch.ones(numel)
    odc.sync(group)
    row["odc_gather_gbps"] = gbps(_median_seconds(
        lambda: odc.gather_into_tensor(output, shard, group), iterations))

    def push():
        odc.scatter_accumulate(accumulator, gradient, group).wait()
        odc.sync(group)

    row["odc_scatter_accumulate_gbps"] = gbps(_median_seconds(push, iterations))
    padded_out = torch.empty(shard_size * world)
    reduced = torch.empty(shard_size)
    padded_in = torch.ones(shard_size * world)
    row["gloo_all_gather_gbps"] = gbps(_median_seconds(
        lambda: dist.all_gather_into_tensor(padded_out, shard.clone()), iterations))
    row["gloo_reduce_scatter_gbps"] = gbps(_median_seconds(
        lambda: dist.reduce_scatter_tensor(reduced, padded_in), iterations))
    group.destroy()  # unmaps the peers' buffers of this size
    return row


def _worker(rank: int, world: int, port: int, sizes_mib: list[float], threads: int,
            queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    from odc_pp.odc import primitives as odc
    rows = []
    for mib in sizes_mib:
        group = odc.new_group(config=odc.TransportConfig(timeout_s=120, num_threads=threads))
        nbytes = int(mib * 2**20)
        rows.append(_measure_size(group, nbytes, 21 if nbytes <= 16 * 2**20 else 7, odc))
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _add_ratios(row: dict) -> dict:
    row["gather_vs_memcpy"] = row["odc_gather_gbps"] / row["memcpy_1thread_gbps"]
    row["gather_vs_concurrent_memcpy"] = row["odc_gather_gbps"] / row["memcpy_concurrent_gbps"]
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
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    processes = mp.start_processes(_worker, args=(world, _free_port(), args.sizes_mib, args.threads, queue),
                                   nprocs=world, join=False, start_method="spawn")
    rows = [_add_ratios(row) for row in queue.get(timeout=1800)]
    processes.join()
    result = {"benchmark": "odc transport vs memcpy and gloo", "ranks": world, "num_threads": args.threads,
              "host_cpus": os.cpu_count(), "torch": torch.__version__, "rows": rows,
              "targets": {"gather_vs_memcpy_at_16mib_plus": 0.7,
                          "gather_vs_gloo_all_gather": 3.0,
                          "scatter_vs_gloo_reduce_scatter": 2.0}}
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text + "\n")
    if args.json:
        print(text)
    else:
        print(f"{'MiB':>6} {'memcpy':>8} {'gather':>8} {'scatter':>8} {'gloo_ag':>8} "
              f"{'gloo_rs':>8} {'cc_mem':>8} {'g/mem':>6} {'g/cc':>6} {'g/ag':>6} {'s/rs':>6}"
              "  (GB/s, ratios; cc_mem: memcpy on both ranks at once)")
        for row in rows:
            print(f"{row['mib']:>6.0f} {row['memcpy_1thread_gbps']:>8.2f} "
                  f"{row['odc_gather_gbps']:>8.2f} {row['odc_scatter_accumulate_gbps']:>8.2f} "
                  f"{row['gloo_all_gather_gbps']:>8.2f} {row['gloo_reduce_scatter_gbps']:>8.2f} "
                  f"{row['memcpy_concurrent_gbps']:>8.2f} "
                  f"{row['gather_vs_memcpy']:>6.2f} {row['gather_vs_concurrent_memcpy']:>6.2f} "
                  f"{row['gather_vs_gloo_all_gather']:>6.2f} "
                  f"{row['scatter_vs_gloo_reduce_scatter']:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
