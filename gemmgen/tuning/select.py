"""Choosing from measured times: the winner per problem, M buckets, the pruned kernel set, and
dispatch rules over (m, n, k) (`RuleTree`). Pure functions over {point: {candidate: µs}}, so they are tested on
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
# Candidates re-timed side by side (interleaved rounds, each compared within its round: the
# tuner's "settled" times) are ties within this smaller fraction: their comparison no longer
# carries the clock's drift between one-pass timings minutes apart, which the 2% covers. With 2%
# the H200 MoE table kept the earlier config at 27 A8W4 points where another, settled, was 1-2%
# faster; taken, 12 benchmark rows ran 1.007-1.034x (benchmarks/RESULTS.md, session 58).
SETTLED_TOLERANCE = 0.01
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


# the variables a manifest condition compares, and where each sits in a point (M last)
TREE_VARIABLES = (("m", -1), ("n", -3), ("k", -2))
TREE_DEPTH = 6
TREE_MIN_GAIN = 0.002  # a split must raise the mean log(oracle / chosen) by this much per point
CANNOT_RUN = -50.0  # the log ratio of a group at a point it cannot run (or did not measure)


@dataclass(frozen=True)
class RuleTree:
    """Dispatch rules over (m, n, k) learned from measured times: a decision tree whose splits
    are `m <= t`, `n <= t` or `k <= t` (what a manifest condition can say) and whose leaves are
    groups. Grown greedily on Σ log(oracle / the group's best time) over the points, to `depth`
    levels; a split is kept when it gains more than `min_gain` per point and leaves two measured
    (N, K) or more on each side of an n or k split (one shape is no evidence about N or K). M
    buckets alone cannot follow what makes a config win on another shape (waves of tiles, K
    depth); measured on 37 shapes of 10 models, the tree's rules reach 0.980-0.982 of the oracle
    on a model left out of their data, the best config per M chosen on all of them 0.975-0.977
    (benchmarks/RESULTS.md, session 29)."""

    root: dict
    variables: tuple = TREE_VARIABLES  # (name, index in a point) of what a split may compare

    @classmethod
    def grow(cls, times: Times, group_of: Callable, group_rank: Callable, kept: Sequence,
             depth: int = TREE_DEPTH, min_gain: float = TREE_MIN_GAIN,
             variables: tuple = TREE_VARIABLES) -> "RuleTree":
        """`variables`: TREE_VARIABLES, or more (name, index) pairs whose values the points carry
        before (n, k, m) (e.g. a derived quantity to try, benchmarks/prototypes/derive_rules.py)."""
        scored = {}  # point -> {group: log(oracle / the group's best)}
        for point, row in times.items():
            oracle = min(row.values(), default=math.inf)
            if math.isfinite(oracle):
                bests = {g: best_in(row, lambda c, g=g: group_of(c) == g) for g in kept}
                scored[point] = {g: math.log(oracle / t) if math.isfinite(t) else CANNOT_RUN
                                 for g, t in bests.items()}
        if not scored:
            raise ValueError("no measured point to learn rules from")
        groups = sorted(kept, key=group_rank)
        return cls(_grow(sorted(scored), scored, groups, depth, min_gain, variables), variables)

    def decide(self, point: Point):
        node = self.root
        while "split" in node:
            name, index, threshold = node["split"]
            node = node["le"] if point[index] <= threshold else node["gt"]
        return node["use"]

    def rules(self) -> list[tuple[str, Hashable]]:
        """[(condition, group)] in first-match order, the last one "true": a left subtree's rules
        carry its `<=` bound (the tightest per variable), a right subtree's need none."""
        out: list[tuple[str, Hashable]] = []

        def walk(node: dict, bounds: dict) -> None:
            if "split" not in node:
                text = " and ".join(f"{v} <= {bounds[v]}" for v, _ in self.variables if v in bounds)
                out.append((text or "true", node["use"]))
                return
            name, _, threshold = node["split"]
            walk(node["le"], dict(bounds, **{name: min(threshold, bounds.get(name, threshold))}))
            walk(node["gt"], bounds)
        walk(self.root, {})
        return out


def _leaf(points, scored, groups) -> tuple[Hashable, float]:
    """The group with the largest Σ log ratio over `points` (ties: the lower rank), and that sum."""
    best, value = None, -math.inf
    for g in groups:
        total = sum(scored[p][g] for p in points)
        if best is None or total > value:
            best, value = g, total
    return best, value


def _grow(points, scored, groups, depth: int, min_gain: float, variables: tuple) -> dict:
    use, value = _leaf(points, scored, groups)
    node = {"use": use}
    if depth == 0:
        return node
    best = None
    for name, index in variables:
        for threshold in sorted({p[index] for p in points})[:-1]:
            left = [p for p in points if p[index] <= threshold]
            right = [p for p in points if p[index] > threshold]
            if name != "m" and min(len({p[-3:-1] for p in left}), len({p[-3:-1] for p in right})) < 2:
                continue
            gain = _leaf(left, scored, groups)[1] + _leaf(right, scored, groups)[1] - value
            if best is None or gain > best[0]:
                best = (gain, (name, index, threshold), left, right)
    if best is None or not best[0] > min_gain * len(points):
        return node
    _, split, left, right = best
    return {"split": split, "le": _grow(left, scored, groups, depth - 1, min_gain, variables),
            "gt": _grow(right, scored, groups, depth - 1, min_gain, variables)}
