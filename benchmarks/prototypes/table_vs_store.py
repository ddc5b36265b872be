#!/usr/bin/env python3
"""How far a shipped tuned table's picks are from the fastest candidate of a newer measurement
store, offline (session 59): whether a re-tune is worth its device time.

A store (`<build>/tune/*.jsonl`, or a `benchmarks/data/*.jsonl.gz`) holds every candidate's time
at each point (class, N, K, M) it reached, even when the tune that wrote it stopped early. For
each such point whose (N, K) the table lists in its class, the table's bucket (kernel and run-time
knobs) is looked up and its time in the store is divided by the fastest candidate's there: 1.000
means the table still picks the fastest. Points where the store lacks the table's candidate are
counted apart (a kernel the store's library did not have, or knobs it never timed).

    python benchmarks/prototypes/table_vs_store.py TABLE STORE [--shapes N,K ...] [--m 1 4 16]
        [--worst 5]

NOTES: the ratio is biased above 1. A store's fastest candidate is the minimum of twenty-odd
one-pass times, so where many candidates run within the timing noise of each other it is the
luckiest of them, and any fixed pick (even a perfect one) scores above 1 against it. Session 60
measured the size of that bias on the W8A8 H200 table at 1024-8192 rows, where the tile and knob
choices sit within 1-3% of each other: the table re-tuned at those points (`gemmgen tune
--retune`) scores 1.00 against its own store and 1.01-1.03 (geomean) against session 59's, as the
old table scores against session 60's store, and the benchmark runs the two tables at the same
speed (0.2% apart). Read a geomean of a few percent there as the noise of the two measurements; a
table is stale where the gap is well past that or the fastest candidate leads by a wide margin
in both stores.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gemmgen.tuning.measure import Candidate, Store  # noqa: E402
from gemmgen.tuning.table import load_table  # noqa: E402


def compare(table_path: Path, store_path: Path, shapes: set[tuple[int, int]] | None,
            ms: set[int] | None):
    """{(class, m): [(ratio, n, k, table candidate, fastest candidate, their µs)]} and the
    number of points whose table candidate the store lacks."""
    table = load_table(table_path)
    store = Store(store_path)
    rows: dict[tuple, list] = defaultdict(list)
    missing = 0
    for cls, ctable in table.classes.items():
        for (n, k, m), times in sorted(store.times(cls, shapes).items()):
            if ms and m not in ms:
                continue
            hit = ctable.lookup(m, n, k)
            if hit is None or not hit.exact_shape or hit.dropped:
                continue
            b = hit.bucket
            chosen = Candidate(b.kernel, b.knobs.raster, b.knobs.swizzle, b.knobs.split_k_slices)
            if chosen not in times:
                missing += 1
                continue
            fastest = min(times, key=times.get)
            rows[(cls, m)].append((times[chosen] / times[fastest], n, k, chosen, fastest,
                                   times[chosen], times[fastest]))
    return rows, missing


def describe(c: Candidate) -> str:
    """A candidate as the table spells it: the kernel and the knobs that are not the defaults."""
    knobs = [f"{name} {value}" for name, value, default in
             (("raster", c.raster, "heuristic"), ("swizzle", c.swizzle, 1), ("split", c.split_k, 1))
             if value != default]
    return c.kernel + (f" ({', '.join(knobs)})" if knobs else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", type=Path)
    p.add_argument("store", type=Path)
    p.add_argument("--shapes", nargs="+", default=None, metavar="N,K",
                   help="only these weight shapes (default: every shape both hold)")
    p.add_argument("--m", nargs="+", type=int, default=None, help="only these M")
    p.add_argument("--worst", type=int, default=3, help="list this many worst points a class")
    args = p.parse_args(argv)
    shapes = {tuple(int(v) for v in s.split(",")) for s in args.shapes} if args.shapes else None
    rows, missing = compare(args.table, args.store, shapes, set(args.m) if args.m else None)
    worst_of: dict[tuple, list] = defaultdict(list)
    for (cls, m), points in sorted(rows.items()):
        ratios = [r[0] for r in points]
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"{'/'.join(cls)} M={m:5d}: table / fastest geomean {geomean:.3f}, worst "
              f"{max(ratios):.3f} over {len(points)} shapes")
        worst_of[cls] += points
    for cls, points in worst_of.items():
        for ratio, n, k, chosen, fastest, t_chosen, t_fastest in sorted(points, key=lambda r: -r[0])[:args.worst]:
            if ratio > 1.0:
                print(f"  {'/'.join(cls)} {n}x{k}: {ratio:.3f}  table {describe(chosen)} "
                      f"{t_chosen:.1f} µs, fastest {describe(fastest)} {t_fastest:.1f} µs")
    if missing:
        print(f"({missing} points: the store lacks the table's candidate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
