#!/usr/bin/env python3
"""How steady one point's timing is (session 30): candidates of one W8A8 problem timed the tuner's
way (`time_candidate`), in interleaved rounds whose order rotates, every sample printed.

Two kinds of pair are in it: the same kernel under knob names CUTLASS resolves to the same launch
(at 6144 x 5120 x 384 with 64x128 tiles, 6 x 48 tiles: the heuristic raster is along M), which
must time alike, and a large-M point, where the GPU's clock falls as it heats. Run in session 30
on an H200 (benchmarks/RESULTS.md): ±0.5% at 384 rows, a 15% fall within seconds at 8192.

    GEMMGEN_BUILD_DIR=<a build with the shipped w8a8 library> python benchmarks/prototypes/timing_steadiness.py
"""

from __future__ import annotations

import statistics

from gemmgen.families.w8a8.tuning import make_problem, time_candidate
from gemmgen.tuning.measure import Candidate

PREFIX = {"e4m3": "sm90a_scaled_mm_e4m3_bf16_scaled_bias_", "int8": "sm90a_scaled_mm_i8_bf16_scaled_bias_"}
MID = "t64x128x128_c2x1x1_pp_sauto"
LARGE_C12 = "t128x128x128_c1x2x1_pp_sauto"


def samples(dtype: str, n: int, k: int, m: int, knobs: list[tuple[str, str, int]], rounds: int) -> None:
    """Print every candidate's samples over `rounds` rotating rounds, and their median."""
    problem = make_problem(("scaled_mm", dtype, "bf16", "ScaledEpilogueBias"), m, n, k)
    candidates = [Candidate(PREFIX[dtype] + tile, raster, swizzle) for tile, raster, swizzle in knobs]
    times: dict[Candidate, list[float]] = {c: [] for c in candidates}
    for r in range(rounds):
        for c in candidates[r % len(candidates):] + candidates[:r % len(candidates)]:
            times[c].append(time_candidate(c, problem))
    print(f"{dtype} n={n} k={k} m={m}")
    for c in candidates:
        print(f"   {c.label().removeprefix(PREFIX[dtype]):45s} median {statistics.median(times[c]):8.2f}  "
              + " ".join(f"{t:.1f}" for t in times[c]))


def main() -> None:
    for dtype in ("e4m3", "int8"):
        samples(dtype, 6144, 5120, 384, [(MID, "heuristic", 1), (MID, "along_m", 1), (MID, "along_n", 1),
                                         (LARGE_C12, "heuristic", 1)], rounds=10)
    samples("int8", 8192, 4608, 8192, [(LARGE_C12, "heuristic", 1), (LARGE_C12, "along_m", 1),
                                       (LARGE_C12, "along_m", 8), (LARGE_C12, "heuristic", 4)], rounds=6)


if __name__ == "__main__":
    main()
