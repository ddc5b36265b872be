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
from gemmgen.families.w8a8.tuning import make_problem
from gemmgen.tuning.measure import gpu_time_us

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mixed_mm import DEFAULT_MODELS, copy_bandwidth, geomean, model_shapes  # noqa: E402  (helpers only: no side effects)

SHAPES = model_shapes(DEFAULT_MODELS)  # the 8 Llama linears


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    print("| dtype | M | N x K | PDL off µs | PDL on µs | off / on | on / floor |")
    print("|---|---:|---|---:|---:|---:|---:|")
    ratios: dict[tuple[str, int], list[float]] = {}
    floors: dict[tuple[str, int], list[float]] = {}
    for dtype in (torch.int8, torch.float8_e4m3fn):
        label = "int8" if dtype == torch.int8 else "e4m3"
        for m in args.m:
            for n, k in SHAPES:
                # the tuner's inputs: operand pairs beyond 2x L2, per-token / per-channel scales, bias
                p = make_problem(("scaled_mm", label, "bf16", "ScaledEpilogueBias"), m, n, k)

                def call(i: int) -> None:
                    a, b = p.pool[i]
                    gemmgen.scaled_mm(a, b, p.scale_a, p.scale_b, torch.bfloat16, p.bias, out=p.out)

                launch.set_programmatic_dependent_launch(True)
                p.out.fill_(float("nan"))
                call(0)
                expected = reference.scaled_mm(*p.pool[0], p.scale_a, p.scale_b, torch.bfloat16, p.bias)
                torch.testing.assert_close(p.out.double(), expected, rtol=2 ** -7, atol=1e-2)
                samples: dict[bool, list[float]] = {False: [], True: []}
                for r in range(args.rounds):
                    for pdl in ((False, True) if r % 2 == 0 else (True, False)):
                        launch.set_programmatic_dependent_launch(pdl)
                        samples[pdl].append(gpu_time_us(call, len(p.pool)))
                off, on = statistics.median(samples[False]), statistics.median(samples[True])
                floor = n * k / bandwidth * 1e6  # the weight bytes at the copy rate (read + write bytes / s)
                ratios.setdefault((label, m), []).append(off / on)
                floors.setdefault((label, m), []).append(on / floor)
                print(f"| {label} | {m} | {n}x{k} | {off:.1f} | {on:.1f} | {off / on:.3f} | {on / floor:.2f} |")
    launch.set_programmatic_dependent_launch(True)
    print("\n| dtype | M | off / on geomean | on / weight-read floor geomean |\n|---|---:|---:|---:|")
    for key in ratios:
        print(f"| {key[0]} | {key[1]} | {geomean(ratios[key]):.3f} | {geomean(floors[key]):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
