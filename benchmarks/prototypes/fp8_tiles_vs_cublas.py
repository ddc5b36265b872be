#!/usr/bin/env python3
"""fp8 tiles of one library against torch._scaled_mm (row-wise, fast accumulation, bias, bf16 out)
at the points of issue 14's fp8 floor (the 8 Llama shapes, M 512-8192), and which kernel torch
runs there (session 61).

Every e4m3 -> bf16 bias kernel of the library under GEMMGEN_BUILD_DIR is called with its manifest
knobs through the family's tuning call, on the tuner's inputs (`make_problem`: rotated past twice
the L2, full-range data). Each point's candidates and torch are timed in three rounds, order rotated
round to round, each a CUDA graph of the rotated calls replayed back to back
(`graph_time_us`, as `bench_scaled_mm.py --timing graph`); the median of the rounds. Prints each
kernel's speed over torch per point, their geomeans, the best of the two shipped 128x128 pingpong
tiles against the best of all, and (--kernel-names) the CUDA kernels torch.profiler sees for
`_scaled_mm` and `_int_mm` at each point.

    GEMMGEN_BUILD_DIR=... python benchmarks/prototypes/fp8_tiles_vs_cublas.py [--m 512 1024] [--json out.json]

after `gemmgen build benchmarks/manifests/w8a8_sm90_fp8_cublas_class.yaml`.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

from gemmgen.bindings.library import all_kernels
from gemmgen.families.w8a8 import ops
from gemmgen.families.w8a8 import tuning as w8a8_tuning
from gemmgen.tuning.measure import Candidate, graph_time_us

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
          (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]
CLASS = ("scaled_mm", "e4m3", "bf16", "ScaledEpilogueBias")
SHIPPED = ("t128x128x128_c2x1x1_pp", "t128x128x128_c1x2x1_pp")  # `large`, `large_c12`


def geomean(values) -> float:
    values = [v for v in values if v == v]
    return math.exp(sum(map(math.log, values)) / len(values))


def torch_kernel_names(m: int, n: int, k: int) -> tuple[str, str]:
    """The CUDA kernels of one `_scaled_mm` (e4m3, row-wise) and one `_int_mm` call."""
    from torch.profiler import ProfilerActivity, profile
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    ai = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    wi = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    sa, sb = torch.rand(m, 1, device="cuda"), torch.rand(1, n, device="cuda")
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    calls = (lambda: torch._scaled_mm(a, w.t(), sa, sb, bias=bias, out_dtype=torch.bfloat16,
                                      use_fast_accum=True),
             lambda: torch._int_mm(ai, wi.t()))
    names = []
    for call in calls:
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        names.append(" + ".join(e.name for e in prof.events()
                                if e.device_type == torch.autograd.DeviceType.CUDA))
    return names[0], names[1]


def time_point(m: int, n: int, k: int, kernels: list[str], rounds: int) -> dict[str, float]:
    p = w8a8_tuning.make_problem(CLASS, m, n, k)
    calls = {}
    for name in kernels:
        candidate = Candidate.of(all_kernels()[name])

        def call(i, c=candidate):
            a, b = p.pool[i]
            ops._scaled_mm_out_impl(p.out, a, b, p.scale_a, p.scale_b, p.bias, None, None,
                                    c.kernel, None, 1, c.knobs)
        calls[name.split("_bias_")[1]] = call

    def torch_call(i):
        a, b = p.pool[i]
        torch._scaled_mm(a, b, p.scale_a, p.scale_b, bias=p.bias, out_dtype=torch.bfloat16,
                         use_fast_accum=True)
    calls["torch"] = torch_call
    order = list(calls)
    times: dict[str, list[float]] = {name: [] for name in order}
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            times[name].append(graph_time_us(calls[name], len(p.pool), 5)[0])
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernel-names", action="store_true", help="also print torch's kernels")
    parser.add_argument("--json", help="write every median here")
    args = parser.parse_args()
    kernels = sorted(name for name in all_kernels() if "_e4m3_bf16_scaled_bias_" in name)
    results = {}
    for n, k in SHAPES:
        for m in args.m:
            if args.kernel_names:
                fp8, int8 = torch_kernel_names(m, n, k)
                print(f"N={n} K={k} M={m}: _scaled_mm {fp8} | _int_mm {int8}")
            med = time_point(m, n, k, kernels, args.rounds)
            results[f"{n},{k},{m}"] = med
            print(f"N={n:5d} K={k:5d} M={m:5d} torch {med['torch']:8.1f} µs | " +
                  " ".join(f"{x} {med['torch'] / med[x]:.3f}" for x in med if x != "torch"), flush=True)
            torch.cuda.empty_cache()
    names = [x for x in next(iter(results.values())) if x != "torch"]
    print("geomean x torch:", " ".join(
        f"{x} {geomean(r['torch'] / r[x] for r in results.values()):.3f}" for x in names))
    shipped = [x for x in names if x.startswith(SHIPPED)]
    if shipped:
        print("best of the shipped pingpong tiles x torch:",
              f"{geomean(r['torch'] / min(r[x] for x in shipped) for r in results.values()):.3f};",
              f"best of all: {geomean(r['torch'] / min(r[x] for x in names) for r in results.values()):.3f}",
              f"(worst point {min(r['torch'] / min(r[x] for x in names) for r in results.values()):.3f})")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
