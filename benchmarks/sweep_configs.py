"""Time every W8A8 kernel of one library (scaled_mm, bias epilogue, bf16 out) over an M grid ×
weight shapes; report the best per M. (Mixed-input and MoE configs are compared side by side by
`bench_mixed_mm.py --kernels REGEX` and `bench_moe.py --kernels REGEX`.)

Used to choose the default manifest's dispatch table: for each dtype and M it prints each config's
geomean slowdown against the per-shape best (1.00 = best everywhere), and the winner.

    GEMMGEN_BUILD_DIR=... python benchmarks/sweep_configs.py --library w8a8_explore [--csv out.csv]

NOTES: GPU time is measured with the host hidden: a `torch.cuda._sleep` first fills the stream
queue, then events bracket a batch of calls that cycle through input sets larger than L2, so
neither Python overhead nor a warm L2 flatters small problems.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import statistics

import torch

import gemmgen
from gemmgen.bindings.library import all_kernels
from gemmgen.generator.kernel_config import RASTER_ORDERS, SWIZZLES, RuntimeKnobs

SHAPES = {"llama3-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
          "llama2-70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]}
M_GRID = [1, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192]
DTYPES = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn}


def make_sets(dtype, m, n, k, l2_bytes):
    per_set = (m * k + n * k)
    count = max(2, min(16, math.ceil(3 * l2_bytes / per_set)))
    sets = []
    for _ in range(count):
        if dtype == torch.int8:
            a = torch.randint(-128, 128, (m, k), dtype=dtype, device="cuda")
            w = torch.randint(-128, 128, (n, k), dtype=dtype, device="cuda")
        else:
            a = torch.randn(m, k, device="cuda").to(dtype)
            w = torch.randn(n, k, device="cuda").to(dtype)
        sets.append((a, w.t()))
    scale_a = torch.rand(m, 1, device="cuda") * 1e-3
    scale_b = torch.rand(1, n, device="cuda") * 1e-3
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return sets, scale_a, scale_b, bias, out


def gpu_time_us(fn, sets, batch=12, repeats=3) -> float:
    """Median over `repeats` of the mean per-call GPU time of a batch (host hidden)."""
    for i in range(3):
        fn(*sets[i % len(sets)])
    samples = []
    for _ in range(repeats):
        torch.cuda._sleep(4_000_000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(batch):
            fn(*sets[i % len(sets)])
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1000 / batch)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", default="w8a8_explore")
    parser.add_argument("--models", nargs="+", default=list(SHAPES))
    parser.add_argument("--m", type=int, nargs="+", default=M_GRID)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--configs", nargs="+", help="only these config names")
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--knobs", action="store_true",
                        help="also try every run-time raster order x swizzle size per kernel")
    parser.add_argument("--swizzles", type=int, nargs="+", choices=SWIZZLES, default=list(SWIZZLES),
                        help="swizzle sizes tried with --knobs")
    args = parser.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or 50 * 2**20
    kernels = [k for k in gemmgen.list_kernels("scaled_mm")
               if k.spec.library == args.library and k.spec.epilogue == "ScaledEpilogueBias"
               and k.spec.d == "bf16" and (not args.configs or k.spec.origin.config in args.configs)]
    if not kernels:
        parser.error(f"library {args.library!r} has no scaled_mm kernel with the bias epilogue and "
                     f"bf16 output{' among --configs' if args.configs else ''} (this sweep times "
                     "W8A8 configs only; mixed-input and MoE: bench_mixed_mm.py / bench_moe.py "
                     "--kernels)")
    knob_grid = ([RuntimeKnobs(r, s) for r in RASTER_ORDERS for s in args.swizzles] if args.knobs
                 else [None])
    rows = []
    for a_name in args.dtypes:
        dtype = DTYPES[a_name]
        candidates = [k for k in kernels if k.spec.a == a_name]
        for model in args.models:
            for n, k_dim in SHAPES[model]:
                for m in args.m:
                    sets, sa, sb, bias, out = make_sets(dtype, m, n, k_dim, l2)
                    for kern, knobs in [(k, kn) for k in candidates for kn in knob_grid]:
                        label = kern.spec.origin.config
                        if knobs is not None:
                            # NOTES: knobs are run-time arguments; this process rebinds the
                            # kernel's default knobs to try each one without rebuilding.
                            all_kernels()[kern.name] = dataclasses.replace(
                                kern, spec=dataclasses.replace(kern.spec, knobs=knobs))
                            label = f"{label}/{knobs.raster}/s{knobs.swizzle}"

                        def call(a, b, kern=kern):
                            gemmgen.scaled_mm(a, b, sa, sb, torch.bfloat16, bias, out=out, kernel=kern.name)
                        try:
                            us = gpu_time_us(call, sets)
                        except Exception as exc:  # a config that cannot implement the shape
                            print(f"skip {label} m={m} n={n} k={k_dim}: {exc}")
                            continue
                        finally:
                            all_kernels()[kern.name] = kern
                        rows.append(dict(dtype=a_name, model=model, n=n, k=k_dim, m=m,
                                         config=label, us=us, tflops=2 * m * n * k_dim / us / 1e6))
                    del sets
    if args.csv and rows:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    summarize(rows)


def summarize(rows, top: int = 6) -> None:
    """Per dtype and M: each config's geomean time over the per-shape best, and the winner.

    With many variants (--knobs) only the `top` best per M are listed.
    """
    best = {}
    for r in rows:
        key = (r["dtype"], r["n"], r["k"], r["m"])
        best[key] = min(best.get(key, math.inf), r["us"])
    for dtype in sorted({r["dtype"] for r in rows}):
        configs = sorted({r["config"] for r in rows if r["dtype"] == dtype})
        print(f"\n{dtype}: geomean time / per-shape best (lower is better; 1.00 = best on every shape)")
        wide = len(configs) <= 14
        if wide:
            print("     M " + " ".join(f"{c[:11]:>11}" for c in configs) + "   winner      best TFLOP/s")
        for m in sorted({r["m"] for r in rows}):
            ratios, tflops = {}, {}
            for c in configs:
                sel = [r for r in rows if r["dtype"] == dtype and r["m"] == m and r["config"] == c]
                if sel:
                    ratios[c] = math.exp(statistics.fmean(
                        math.log(r["us"] / best[(dtype, r["n"], r["k"], m)]) for r in sel))
                    tflops[c] = math.exp(statistics.fmean(math.log(r["tflops"]) for r in sel))
            winner = min(ratios, key=ratios.get)
            if wide:
                print(f"{m:6d} " + " ".join(f"{ratios.get(c, float('nan')):11.2f}" for c in configs)
                      + f"   {winner:<11} {tflops[winner]:7.1f}")
            else:
                ranked = sorted(ratios, key=ratios.get)[:top]
                print(f"{m:6d} " + "  ".join(f"{c} {ratios[c]:.3f} ({tflops[c]:.0f})" for c in ranked))


if __name__ == "__main__":
    main()
