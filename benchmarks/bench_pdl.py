#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) on and off for gemmgen's W8A8 scaled_mm, side by side.

For every M of --m and every Llama weight shape (N, K), int8 and e4m3 `gemmgen.scaled_mm` (bf16
out, bias; dispatch as shipped) are timed with PDL off and on, interleaved over --rounds rounds
(the median of each), the way `gemmgen tune` times: calls back to back behind a spin kernel,
inputs rotated beyond L2, full-range random data. PDL lets each call's kernel start its prologue
while the previous call's kernel finishes, which is what a model's stream of GEMMs sees. Also
printed: the weight-read floor (N·K bytes at the measured copy bandwidth) and time / floor.
Each call's output is first checked against `gemmgen.reference.scaled_mm` with PDL on.

    python benchmarks/bench_pdl.py [--m 1 16 64 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

try:
    import gemmgen
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gemmgen
from gemmgen import reference
from gemmgen.bindings import launch
from gemmgen.tuning.measure import gpu_time_us

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
          (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy of 1 GiB (read + write counted)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = gpu_time_us(lambda i: dst.copy_(src), 1)
    return 2 * src.numel() / (us * 1e-6)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    bandwidth = copy_bandwidth()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print("| dtype | M | N x K | PDL off µs | PDL on µs | off / on | on / floor |")
    print("|---|---:|---|---:|---:|---:|---:|")
    ratios: dict[tuple[str, int], list[float]] = {}
    floors: dict[tuple[str, int], list[float]] = {}
    for dtype in (torch.int8, torch.float8_e4m3fn):
        label = "int8" if dtype == torch.int8 else "e4m3"
        for m in args.m:
            for n, k in SHAPES:
                count = max(2, min(32, math.ceil(2 * l2 / (n * k + m * k)) + 1))
                gen = torch.Generator(device="cuda").manual_seed(n * 31 + k + m)
                pool = []
                for _ in range(count):
                    if dtype == torch.int8:
                        a = torch.randint(-128, 128, (m, k), dtype=dtype, device="cuda", generator=gen)
                        w = torch.randint(-128, 128, (n, k), dtype=dtype, device="cuda", generator=gen)
                    else:
                        a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
                        w = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
                    pool.append((a, w.t()))
                scale_a = torch.rand(m, 1, device="cuda", generator=gen) * 1e-3 + 1e-4
                scale_b = torch.rand(1, n, device="cuda", generator=gen) * 1e-3 + 1e-4
                bias = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
                out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

                def call(i: int) -> None:
                    a, b = pool[i]
                    gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out)

                launch.set_programmatic_dependent_launch(True)
                out.fill_(float("nan"))
                call(0)
                expected = reference.scaled_mm(pool[0][0], pool[0][1], scale_a, scale_b, torch.bfloat16, bias)
                torch.testing.assert_close(out.double(), expected, rtol=2 ** -7, atol=1e-2)
                samples: dict[bool, list[float]] = {False: [], True: []}
                for r in range(args.rounds):
                    for pdl in ((False, True) if r % 2 == 0 else (True, False)):
                        launch.set_programmatic_dependent_launch(pdl)
                        samples[pdl].append(gpu_time_us(call, len(pool)))
                off, on = statistics.median(samples[False]), statistics.median(samples[True])
                floor = n * k / bandwidth * 1e6  # the weight bytes at the copy rate (read + write bytes / s)
                ratios.setdefault((label, m), []).append(off / on)
                floors.setdefault((label, m), []).append(on / floor)
                print(f"| {label} | {m} | {n}x{k} | {off:.1f} | {on:.1f} | {off / on:.3f} | {on / floor:.2f} |")
    launch.set_programmatic_dependent_launch(True)
    print("\n| dtype | M | off / on geomean | on / weight-read floor geomean |\n|---|---:|---:|---:|")
    for key in ratios:
        geo = math.exp(statistics.fmean(map(math.log, ratios[key])))
        fl = math.exp(statistics.fmean(map(math.log, floors[key])))
        print(f"| {key[0]} | {key[1]} | {geo:.3f} | {fl:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
