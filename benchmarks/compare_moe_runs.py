"""Compare `bench_moe.py --json` runs of two libraries: each forced kernel's time (and the
dispatched op's) row by row, base / other, and per kernel the geomean, the range and the count.

    GEMMGEN_BUILD_DIR=build_a python benchmarks/bench_moe.py --show-kernels --json a1.json ...
    GEMMGEN_BUILD_DIR=build_b python benchmarks/bench_moe.py --show-kernels --json b1.json ...
    python benchmarks/compare_moe_runs.py a1.json [a2.json ...] --vs b1.json [b2.json ...]

Both libraries are built from manifests with the same config names (a kernel is matched by its
label, e.g. `wgmma16 64x16x128`). With several runs a side (alternate them: a, b, a, b), each
row keeps a side's best time, as bench_moe.py keeps the better of a column's two timings. A ratio
above 1 means the other library (--vs) is faster. Timings on these machines are noisy: compare
runs made in one session, side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DISPATCHED = "(dispatched)"  # the op as dispatched: a row's `gemmgen` column


def row_key(row: dict) -> tuple:
    return (row["dtype"], row["model"], int(row["tokens"]), row["routing"])


def best_times(runs: list[dict]) -> dict[tuple, float]:
    """(dtype, model, tokens, routing, kernel) -> the best µs over the runs' rows; the kernel
    DISPATCHED is the row's dispatched op."""
    best: dict[tuple, float] = {}
    for run in runs:
        for row in run["rows"]:
            times = dict(row.get("kernel_us") or {})
            if isinstance(row.get("gemmgen"), (int, float)):
                times[DISPATCHED] = row["gemmgen"]
            for kernel, us in times.items():
                if isinstance(us, (int, float)) and math.isfinite(us) and us > 0:
                    key = row_key(row) + (kernel,)
                    best[key] = min(us, best.get(key, math.inf))
    return best


def compare(base: dict[tuple, float], other: dict[tuple, float]) -> list[tuple]:
    """(key, base µs, other µs, base / other) for every key both sides timed, in key order."""
    return [(key, base[key], other[key], base[key] / other[key]) for key in sorted(base.keys() & other.keys())]


def summary(pairs: list[tuple]) -> dict[str, tuple]:
    """kernel -> (geomean of base / other, min, max, rows)."""
    by_kernel: dict[str, list[float]] = {}
    for key, _, _, r in pairs:
        by_kernel.setdefault(key[-1], []).append(r)
    return {kernel: (math.exp(sum(map(math.log, v)) / len(v)), min(v), max(v), len(v))
            for kernel, v in sorted(by_kernel.items())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", nargs="+", type=Path, help="bench_moe.py --json files of the base library")
    p.add_argument("--vs", nargs="+", type=Path, required=True, metavar="JSON",
                   help="bench_moe.py --json files of the other library")
    p.add_argument("--rows", action="store_true", help="also print every row's two times")
    args = p.parse_args(argv)
    try:
        base = best_times([json.loads(f.read_text()) for f in args.base])
        other = best_times([json.loads(f.read_text()) for f in args.vs])
    except (OSError, ValueError, KeyError) as exc:
        print(f"compare_moe_runs: cannot read the runs: {exc}", file=sys.stderr)
        return 1
    pairs = compare(base, other)
    if not pairs:
        print("compare_moe_runs: the two sides timed no row and kernel in common", file=sys.stderr)
        return 1
    if args.rows:
        for (dtype, model, tokens, routing, kernel), a, b, r in pairs:
            print(f"{dtype:6s} {model:18s} T={tokens:5d} {routing:7s} {kernel:28s} {a:9.1f} {b:9.1f}  {r:.3f}")
        print()
    print("| kernel | base µs / other µs, geomean | range | rows |")
    print("|---|---:|---|---:|")
    for kernel, (g, lo, hi, n) in summary(pairs).items():
        print(f"| {kernel} | {g:.3f} | {lo:.3f}-{hi:.3f} | {n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
