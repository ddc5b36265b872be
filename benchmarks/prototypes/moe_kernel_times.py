"""A measurement prototype (session 54, benchmarks/RESULTS.md), not a benchmark of record: the
device time of each kernel gemmgen's MoE op launches (group setup, the row-max memset, the
grouped GEMM, the SwiGLU or quantize pass), from torch.profiler over 20 calls, at
bench_moe.py's Mixtral-8x7B rows (its inputs and routings, weights rotated over two copies).

    python benchmarks/prototypes/moe_kernel_times.py [--dtypes e4m3 int8 a8w4 a8w4g] [--tokens 256 1024]
        [--kernels NAME ...]      # forced kernels by name (default: dispatch's pick)
        [--rows 64 80 ...]        # instead of --tokens: every expert holds exactly this many rows
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_moe  # noqa: E402  (the benchmark's data and op wrappers)

CALLS = 20


def kernel_times(fn) -> dict[str, list[float]]:
    """Device µs of each kernel name over CALLS calls of fn(i), after 10 warm-up calls."""
    for i in range(10):
        fn(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            fn(i)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times.setdefault(event.name, []).append(event.device_time)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["e4m3", "int8"], choices=sorted(bench_moe.DTYPES))
    p.add_argument("--model", default="mixtral-8x7b", choices=sorted(bench_moe.MODELS))
    p.add_argument("--tokens", nargs="+", type=int, default=[256, 1024])
    p.add_argument("--kernels", nargs="+", default=[None], metavar="NAME")
    p.add_argument("--rows", nargs="+", type=int, default=None,
                   help="rows an expert, the same for every expert (replaces --tokens)")
    args = p.parse_args(argv)
    model = bench_moe.MODELS[args.model]
    for dtype in args.dtypes:
        weights = bench_moe.make_weights(model, dtype, 2)
        cases = ([(f"{rows} rows", "each", [rows] * model.experts) for rows in args.rows]
                 if args.rows else
                 [(tokens, routing, bench_moe.routing_counts(model, tokens, routing, args.model))
                  for tokens in args.tokens for routing in bench_moe.ROUTINGS])
        for tokens, routing, counts in cases:
            inputs = bench_moe.make_inputs(model, dtype, counts, 2)
            for kernel in args.kernels:
                times = kernel_times(bench_moe.gemmgen_fn(weights.packed, inputs, kernel))
                print(f"{dtype} {args.model} T={tokens} {routing} (rows an expert "
                      f"{min(counts)}-{max(counts)}), kernel {kernel or 'dispatched'}:")
                total = 0.0
                for name, values in sorted(times.items(), key=lambda kv: -sum(kv[1])):
                    values.sort()
                    total += sum(values) / CALLS
                    print(f"  {len(values) // CALLS}x median {values[len(values) // 2]:8.1f} µs  "
                          f"{name[:110]}")
                print(f"  sum per call {total:.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
