"""Choosing from measured times: the winner per problem, M buckets, the pruned kernel set, and
M-bucket dispatch rules. Pure functions over {point: {candidate: µs}}, so they are tested on
synthetic timings.

A *point* is one measured problem, a tuple whose last element is m, e.g. (n, k, m). A *candidate* is a kernel with run-time knobs. A
*group* is what pruning keeps or drops: one manifest config (every kernel and knob it builds).

Determinism: measured times carry noise, so candidates within `tolerance` of the fastest are
ties, and a tie goes to the candidate with the smallest `rank` (manifest order, default knobs
first). Two runs whose times differ by less than the tolerance's margin pick the same table.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping, Sequence

Point = tuple  # a measured problem, M last: (n, k, m) or (a dtype, n, k, m)
Times = Mapping[Point, Mapping[Hashable, float]]  # µs; math.inf: cannot implement the point

DEFAULT_TOLERANCE = 0.02
MIN_RATIO = 0.97  # pruning: each point keeps ≥ 97% of the oracle's speed ...
MIN_GEOMEAN = 0.99  # ... and ≥ 99% geomean over all points
EXHAUSTIVE_LIMIT = 16  # groups; above it the selection is greedy


def pick(times: Mapping[Hashable, float], rank: Callable, tolerance: float = DEFAULT_TOLERANCE):
    """The candidate to use: the lowest-rank one within `tolerance` of the fastest."""
    finite = {c: t for c, t in times.items() if math.isfinite(t)}
    if not finite:
        raise ValueError("no candidate implements this problem")
    best = min(finite.values())
    return min((c for c, t in finite.items() if t <= best * (1 + tolerance)), key=rank)


def buckets(winners: Mapping[int, Hashable]) -> list[tuple[int, Hashable]]:
    """{m: winner} → [(m_max, winner)]: runs of one winner merge; a bucket covers the M values
    above the previous measured M up to its own."""
    merged: list[tuple[int, Hashable]] = []
    for m in sorted(winners):
        if merged and merged[-1][1] == winners[m]:
            merged[-1] = (m, winners[m])
        else:
            merged.append((m, winners[m]))
    return merged


def best_in(times: Mapping[Hashable, float], members: Callable[[Hashable], bool]) -> float:
    return min((t for c, t in times.items() if members(c)), default=math.inf)


@dataclass(frozen=True)
class Selection:
    """A kept set of groups and how close it stays to the oracle (time ratios ≤ 1)."""

    kept: tuple
    worst: float
    geomean: float
    worst_point: Point | None


def _quality(times: Times, group_of: Callable, kept: frozenset) -> tuple[float, float, Point | None]:
    worst, worst_point, log_sum = 1.0, None, 0.0
    for point, row in times.items():
        oracle = min(row.values())
        ratio = oracle / best_in(row, lambda c: group_of(c) in kept)
        log_sum += math.log(ratio) if ratio > 0 else -math.inf
        if ratio < worst:
            worst, worst_point = ratio, point
    return worst, math.exp(log_sum / max(1, len(times))), worst_point


def select_groups(times: Times, group_of: Callable, group_rank: Callable,
                  min_ratio: float = MIN_RATIO, min_geomean: float = MIN_GEOMEAN) -> Selection:
    """The smallest set of groups whose per-point best is ≥ min_ratio of the oracle (the best of
    all candidates) at every point, and ≥ min_geomean in geomean.

    Exhaustive by increasing size up to EXHAUSTIVE_LIMIT groups (among equally small sets: the
    best geomean, then the lowest ranks); greedy above it. Never returns a set that breaks the
    thresholds: the full set always meets them (ratio 1 everywhere).
    """
    times = {p: row for p, row in times.items() if any(math.isfinite(t) for t in row.values())}
    groups = sorted({group_of(c) for row in times.values() for c in row}, key=group_rank)
    if not groups:
        raise ValueError("no measurements to select from")

    def feasible(kept: frozenset) -> tuple[float, float, Point | None] | None:
        # cheap check first: every point has a member within min_ratio of its oracle
        for row in times.values():
            oracle = min(row.values())
            if not any(group_of(c) in kept and t * min_ratio <= oracle for c, t in row.items()):
                return None
        worst, geo, where = _quality(times, group_of, kept)
        return (worst, geo, where) if geo >= min_geomean else None

    if len(groups) <= EXHAUSTIVE_LIMIT:
        for size in range(1, len(groups) + 1):
            found = []
            for combo in itertools.combinations(groups, size):
                q = feasible(frozenset(combo))
                if q is not None:
                    found.append((-q[1], [group_rank(g) for g in combo], combo, q))
            if found:
                _, _, combo, (worst, geo, where) = min(found, key=lambda f: (f[0], f[1]))
                return Selection(tuple(combo), worst, geo, where)
    kept: list = []
    while feasible(frozenset(kept)) is None:
        def gain(g):
            trial = frozenset(kept + [g])
            ok = sum(1 for row in times.values()
                     if any(group_of(c) in trial and t * min_ratio <= min(row.values())
                            for c, t in row.items()))
            return (ok, _quality(times, group_of, trial)[1])
        # max() keeps the first of equals: groups are in rank order
        kept.append(max((g for g in groups if g not in kept), key=gain))
    for g in sorted(kept, key=group_rank, reverse=True):  # drop what became redundant
        if len(kept) > 1 and feasible(frozenset(kept) - {g}) is not None:
            kept.remove(g)
    worst, geo, where = _quality(times, group_of, frozenset(kept))
    return Selection(tuple(sorted(kept, key=group_rank)), worst, geo, where)


def m_rules(times: Times, group_of: Callable, group_rank: Callable, kept: Sequence,
            tolerance: float = DEFAULT_TOLERANCE) -> list[tuple[int, Hashable]]:
    """Shape-independent M buckets over `kept` groups: at each measured M, the group with the
    best geomean (over the measured shapes) of its best time / the oracle; ties within
    `tolerance` go to the lower rank. Returns [(m_max, group)], runs merged."""
    by_m: dict[int, list[Mapping[Hashable, float]]] = {}
    for point, row in times.items():
        if any(math.isfinite(t) for t in row.values()):
            by_m.setdefault(point[-1], []).append(row)
    winners = {}
    for m, rows in by_m.items():
        score = {}
        for g in kept:
            logs = [math.log(best_in(row, lambda c, g=g: group_of(c) == g) / min(row.values()))
                    for row in rows]
            score[g] = math.exp(sum(logs) / len(logs))
        winners[m] = pick(score, group_rank, tolerance)
    return buckets(winners)
