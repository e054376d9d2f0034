"""ODC transport on a GPU: gather / scatter_accumulate through CUDA IPC vs device-to-device
copy, in one run.

Two processes share the GPU(s) (rank r uses cuda:r mod device_count; with one GPU both
ranks use it, which CUDA IPC allows and NCCL does not). For each size (bytes of the full
tensor): a device-to-device copy on rank 0 alone (the local limit) and on both ranks at
once, ODC gather_into_tensor on rank 0 alone and on both ranks at once, a local fp32 add
on rank 0 alone and ODC scatter_accumulate (+ wait + sync). Every op runs once per round, rounds repeat, GB/s = full-tensor bytes /
median seconds (timed on the host around torch.cuda.synchronize()). Target of issue 3:
gather (rank 0 alone) >= 0.7x the device-to-device copy at >= 64 MiB.

    python benchmarks/bench_transport_gpu.py [--json] [--sizes-mib 16 64 256 1024] [--out FILE]

Needs CUDA and the odc_pp._C_cuda extension (built when nvcc is found at install time).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_transport import (ROOT, LaunchConfig, _interleaved_medians, emit_json,  # noqa: E402
                             print_table, run_workers)

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TARGET_GATHER_VS_D2D = 0.7
_TEXT_COLUMNS = [
    ("MiB", "mib"), ("d2d", "d2d_copy_gbps"), ("cc_d2d", "d2d_copy_concurrent_gbps"),
    ("g_alone", "odc_gather_alone_gbps"), ("gather", "odc_gather_gbps"),
    ("add", "local_add_gbps"), ("scatter", "odc_scatter_accumulate_gbps"),
    ("ga/d2d", "gather_alone_vs_d2d"), ("g/cc", "gather_vs_concurrent_d2d"),
    ("s/add", "scatter_vs_local_add"),
]


def _measure_size(group, nbytes: int, iterations: int, device: torch.device, odc) -> dict:
    world, rank = group.world_size, group.rank
    numel = nbytes // 4
    shard_size = -(-numel // world)
    src = torch.ones(numel, device=device)
    dst = torch.zeros(numel, device=device)
    shard = odc.symmetric_empty(shard_size, torch.float32, group, device=device)
    shard.fill_(1.0)
    accumulator = odc.symmetric_empty(shard_size, torch.float32, group, device=device)
    accumulator.zero_()
    output, gradient = torch.zeros(numel, device=device), torch.ones(numel, device=device)
    odc.sync(group)

    def push():
        odc.scatter_accumulate(accumulator, gradient, group).wait()
        odc.sync(group)

    ops = {
        "d2d_copy": (lambda: dst.copy_(src), True),
        "d2d_copy_concurrent": (lambda: dst.copy_(src), False),
        # rank 0 alone pulls (half of it from the other process through CUDA IPC): the
        # target's measure; both ranks at once share the GPU (time-sliced without MPS)
        "odc_gather_alone": (lambda: odc.gather_into_tensor(output, shard, group), True),
        "odc_gather": (lambda: odc.gather_into_tensor(output, shard, group), False),
        "local_add": (lambda: dst.add_(src), True),
        "odc_scatter_accumulate": (push, False),
    }
    medians = _interleaved_medians(ops, iterations, rank, synchronize=torch.cuda.synchronize)
    group.destroy()
    row = {"mib": nbytes / 2**20}
    row.update({f"{name}_gbps": nbytes / seconds / 1e9 for name, seconds in medians.items()})
    row["gather_alone_vs_d2d"] = row["odc_gather_alone_gbps"] / row["d2d_copy_gbps"]
    row["gather_vs_d2d"] = row["odc_gather_gbps"] / row["d2d_copy_gbps"]
    row["gather_vs_concurrent_d2d"] = row["odc_gather_gbps"] / row["d2d_copy_concurrent_gbps"]
    row["scatter_vs_local_add"] = row["odc_scatter_accumulate_gbps"] / row["local_add_gbps"]
    return row


def _worker(rank: int, world: int, sizes_mib: list[float]) -> list | None:
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    from odc_pp.odc import primitives as odc
    rows = []
    for mib in sizes_mib:
        group = odc.new_group(config=odc.TransportConfig(timeout_s=120))
        nbytes = int(mib * 2**20)
        rows.append(_measure_size(group, nbytes, 21 if nbytes <= 256 * 2**20 else 11,
                                  device, odc))
    return rows if rank == 0 else None


def _missing_cuda_backend() -> str | None:
    """Why this benchmark cannot run here, or None."""
    if not torch.cuda.is_available():
        return ("bench_transport_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                "benchmarks/bench_transport.py measures the CPU path")
    try:
        importlib.import_module("odc_pp._C_cuda")
    except ImportError as error:
        return (f"odc_pp._C_cuda is not built ({error}); reinstall with nvcc on PATH: "
                f"pip install --no-build-isolation --no-deps -e .")
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    problem = _missing_cuda_backend()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    world = 2
    rows = run_workers(_worker, world, args.sizes_mib,
                       config=LaunchConfig(timeout_s=1800, process_group_timeout_s=300))[0]
    result = {"benchmark": "odc transport (CUDA IPC) vs device-to-device copy", "ranks": world,
              "gpu": torch.cuda.get_device_name(0), "gpus_used": min(world,
                                                                       torch.cuda.device_count()),
              "torch": torch.__version__, "cuda": torch.version.cuda, "rows": rows,
              "targets": {"gather_alone_vs_d2d_at_64mib_plus": TARGET_GATHER_VS_D2D}}
    if not emit_json(result, args):
        print(f"{result['gpu']} ({result['gpus_used']} GPU(s) for {world} ranks); GB/s and "
              f"ratios; target ga/d2d >= {TARGET_GATHER_VS_D2D} at >= 64 MiB")
        print_table(rows, _TEXT_COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
