"""The cost model that lets a tuned table choose a kernel for a shape it was not tuned on.

A tuned table holds winners per measured (N, K) and M bucket. For an unmeasured (N, K) the old
rule — the winner of the nearest measured shape — transfers badly: whether a kernel wins
depends on how its tiles fill the GPU (waves), on K's depth and on the bytes it moves, and those
change with the shape. So `gemmgen tune` also stores, per kernel of a tuned class, its measured
time at every tuned point and the coefficients of a small linear cost model fitted to those
times; for an unmeasured (N, K) each kernel's time is estimated as

    est(kernel, m, n, k) = measured(kernel, m', n', k') · cost(kernel, m, n, k) / cost(kernel, m', n', k')

with (n', k') a measured shape and m' its nearest measured M: the measurement carries what the
model misses about the kernel, the model only says how the time moves from the measured shape to
the asked one. The transfers from the REFERENCES nearest measured shapes (log distance) are
averaged in log space, each weighted 1 / (distance + 0.1) (`blended_estimates`): one reference
alone carries its own timing noise and its own wave pattern into every estimate (session 31: the
nearest shape only scored 0.991 / 0.794 geomean / worst over the H200 table's 16 models left out
one at a time, e4m3, and the four nearest 0.993 / 0.864; benchmarks/RESULTS.md). The fastest
estimate wins. Measured on held-out model shapes (benchmarks/dispatch_quality.py), this picks
better than the nearest shape's winner and than the manifest's rules.

cost(kernel, ...) = Σ coef_i · feature_i, the features given by the op family
(`OpFamily.cost_features`, e.g. waves × K iterations, bytes read); coefficients are fitted
non-negative to relative error (`fit`). Pure Python: the table is read without torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

Point = tuple[int, int, int]  # (n, k, m)
REFERENCES = 4  # measured shapes an unlisted shape's estimates are transferred from


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    size = len(rhs)
    a = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, size):
            factor = a[r][col] / a[col][col]
            for c in range(col, size + 1):
                a[r][c] -= factor * a[col][c]
    x = [0.0] * size
    for r in range(size - 1, -1, -1):
        x[r] = (a[r][size] - sum(a[r][c] * x[c] for c in range(r + 1, size))) / a[r][r]
    return x


def _nnls(gram: list[list[float]], moment: list[float], iterations: int = 200) -> list[float]:
    """Non-negative least squares (Lawson-Hanson active set) on the normal equations:
    minimise |X c - y|² over c >= 0, given gram = XᵀX and moment = Xᵀy."""
    size = len(moment)
    coef = [0.0] * size
    passive: set[int] = set()
    tolerance = 1e-12 * max(1.0, max(abs(v) for v in moment))
    for _ in range(iterations):
        gradient = [moment[i] - sum(gram[i][j] * coef[j] for j in range(size)) for i in range(size)]
        free = [i for i in range(size) if i not in passive and gradient[i] > tolerance]
        if not free:
            break
        passive.add(max(free, key=lambda i: gradient[i]))
        while True:
            order = sorted(passive)
            sub = _solve([[gram[i][j] for j in order] for i in order], [moment[i] for i in order])
            if sub is None:  # a feature collinear with the others: leave it out
                passive.discard(order[-1])
                break
            trial = dict(zip(order, sub))
            if all(v > 0 for v in trial.values()):
                coef = [trial.get(i, 0.0) for i in range(size)]
                break
            step = min(coef[i] / (coef[i] - trial[i]) for i in order if trial[i] <= 0)
            coef = [coef[i] + step * (trial.get(i, 0.0) - coef[i]) for i in range(size)]
            passive = {i for i in passive if coef[i] > 1e-15}
    return coef


def fit(features: Sequence[Sequence[float]], times: Sequence[float]) -> list[float]:
    """Non-negative coefficients c minimising Σ ((c·f - t) / t)² over the measured points
    (relative error: a 5 µs point counts as much as a 5 ms one)."""
    if not features:
        raise ValueError("no measured points to fit")
    size = len(features[0])
    gram = [[0.0] * size for _ in range(size)]
    moment = [0.0] * size
    for f, t in zip(features, times):
        weight = 1.0 / (t * t)
        for i in range(size):
            moment[i] += weight * f[i] * t
            for j in range(size):
                gram[i][j] += weight * f[i] * f[j]
    # columns scaled to unit norm first: features span many orders of magnitude (1 to 1e5)
    scale = [math.sqrt(gram[i][i]) or 1.0 for i in range(size)]
    scaled = _nnls([[gram[i][j] / (scale[i] * scale[j]) for j in range(size)] for i in range(size)],
                   [moment[i] / scale[i] for i in range(size)])
    return [c / scale[i] for i, c in enumerate(scaled)]


def fit_model(feature_set: str, measured: dict[Point, dict[str, float]],
              features_of: Callable[[str, int, int, int], Sequence[float]],
              kernels: Sequence[str]) -> "CostModel | None":
    """A model of `feature_set` fitted to `measured` ((n, k, m) -> kernel name -> µs with its
    manifest knobs), each of `kernels` on the points that measured it (`features_of(name, m, n,
    k)`); None when none of them was measured. What `gemmgen tune` stores, and what a table of
    an older feature set is refitted to from its stored times."""
    coef: dict[str, tuple[float, ...]] = {}
    kept: dict[Point, dict[str, float]] = {}
    for name in kernels:
        points = [(point, row[name]) for point, row in measured.items() if name in row]
        if not points:
            continue
        for point, us in points:
            kept.setdefault(point, {})[name] = us
        coef[name] = tuple(fit([features_of(name, m, n, k) for (n, k, m), _ in points], [us for _, us in points]))
    return CostModel(feature_set, coef, kept) if coef else None


def fit_for_family(family, kernels: Mapping, sm_count: int, measured: dict[Point, dict[str, float]],
                   names: Sequence[str] | None = None) -> "CostModel | None":
    """`fit_model` in the op family's own feature set (`family.cost_features(kernels[name].spec,
    ..., sm_count)`), for `names` (default: every kernel of `measured` that `kernels` holds)."""
    if names is None:
        names = sorted({name for row in measured.values() for name in row if name in kernels})
    return fit_model(family.cost_feature_set, measured,
                     lambda name, m, n, k: family.cost_features(kernels[name].spec, m, n, k, sm_count), names)


def shape_distance(shape: tuple[int, int], n: int, k: int) -> float:
    """|log(n' / n)| + |log(k' / k)|: how far the measured shape (n', k') lies from (n, k)."""
    return abs(math.log(shape[0] / n)) + abs(math.log(shape[1] / k))


def cost(coef: Sequence[float], features: Sequence[float]) -> float:
    return sum(c * f for c, f in zip(coef, features))


@dataclass(frozen=True)
class CostModel:
    """One tuned class's model: the feature set's name (the family's `cost_features` version),
    each kernel's coefficients, and each kernel's measured µs (manifest knobs) per point."""

    features: str
    coef: dict[str, tuple[float, ...]]
    times: dict[Point, dict[str, float]] = field(default_factory=dict)

    @functools.cached_property
    def shapes(self) -> frozenset[tuple[int, int]]:
        """The (n, k) with measured times."""
        return frozenset((pn, pk) for (pn, pk, _) in self.times)

    @functools.cached_property
    def measured_m(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """Each measured (n, k)'s M values, ascending (indexed once: a lookup asks per shape)."""
        index: dict[tuple[int, int], list[int]] = {}
        for (pn, pk, pm) in self.times:
            index.setdefault((pn, pk), []).append(pm)
        return {shape: tuple(sorted(ms)) for shape, ms in index.items()}

    def nearest_shape(self, n: int, k: int) -> tuple[int, int] | None:
        """The measured (n, k) nearest in log space (ties: the smaller), as tables look up."""
        nearest = self.nearest_shapes(n, k, 1)
        return nearest[0] if nearest else None

    def nearest_shapes(self, n: int, k: int, count: int = REFERENCES) -> list[tuple[int, int]]:
        """Up to `count` measured (n, k), nearest first in log space (ties: the smaller)."""
        return sorted(self.shapes, key=lambda s: (shape_distance(s, n, k), s))[:count]

    def blended_estimates(self, m: int, n: int, k: int, references: Sequence[tuple[int, int]],
                          features_of: Callable[[str, int, int, int], Sequence[float]],
                          kernels: Sequence[str]) -> dict[str, float]:
        """Estimated µs of each of `kernels` at (m, n, k): the `estimates` from each of
        `references`, averaged in log space with weights 1 / (log distance + 0.1). Only kernels
        that every reference estimates are compared (a kernel measured at fewer shapes would be
        averaged over other ones); when no kernel is, the nearest reference alone serves."""
        features_of = functools.cache(features_of)  # each kernel's features at (m, n, k): once, not per reference
        per_reference = [(1.0 / (shape_distance(r, n, k) + 0.1), self.estimates(m, n, k, r, features_of, kernels))
                         for r in references]
        per_reference = [(weight, found) for weight, found in per_reference if found]
        if not per_reference:
            return {}
        common = set.intersection(*(set(found) for _, found in per_reference))
        if not common:
            return per_reference[0][1]
        total = sum(weight for weight, _ in per_reference)
        return {name: math.exp(sum(weight * math.log(found[name]) for weight, found in per_reference) / total)
                for name in sorted(common)}

    def nearest_m(self, shape: tuple[int, int], m: int) -> int:
        """The M measured at `shape` nearest m in log space (ties: the smaller)."""
        return min(self.measured_m.get(shape, ()), key=lambda v: (abs(math.log(v / m)), v))

    def estimates(self, m: int, n: int, k: int, reference: tuple[int, int],
                  features_of: Callable[[str, int, int, int], Sequence[float]],
                  kernels: Sequence[str]) -> dict[str, float]:
        """Estimated µs of each of `kernels` at (m, n, k), transferred from the measured shape
        `reference` at its nearest measured M (see the module docstring). Kernels without a
        measurement there or with a zero modelled cost are left out."""
        if reference not in self.shapes:
            return {}
        near_m = self.nearest_m(reference, m)
        row = self.times[(*reference, near_m)]
        found: dict[str, float] = {}
        for name in kernels:
            coef = self.coef.get(name)
            if coef is None or name not in row:
                continue
            there_features = features_of(name, near_m, *reference)
            if len(there_features) != len(coef):
                raise ValueError(f"{name}: {len(coef)} coefficients for {len(there_features)} features")
            there = cost(coef, there_features)
            here = cost(coef, features_of(name, m, n, k))
            if there > 0 and here > 0:
                found[name] = row[name] * here / there
        return found


def gpu_time_ratios(own: CostModel, other: CostModel) -> dict[str, dict[int | None, float]]:
    """Each kernel's time in `own` (one GPU's table) over its time in `other` (another GPU's, the
    same kernels), geometric mean over the points both measured: per M, and over every shared
    point (key None). Kernels measured together nowhere are left out."""
    logs: dict[str, dict[int | None, list[float]]] = {}
    for point, row in own.times.items():
        there = other.times.get(point)
        if not there:
            continue
        for name, us in row.items():
            if name in there and us > 0 and there[name] > 0:
                per = logs.setdefault(name, {})
                value = math.log(us / there[name])
                per.setdefault(point[2], []).append(value)
                per.setdefault(None, []).append(value)
    return {name: {key: math.exp(sum(v) / len(v)) for key, v in per.items()} for name, per in logs.items()}


def sibling_estimates(ratios: dict[str, dict[int | None, float]], other: CostModel, m: int, n: int, k: int,
                      features_of: Callable[[str, int, int, int], Sequence[float]],
                      kernels: Sequence[str]) -> dict[str, float]:
    """Estimated µs on `ratios`' GPU at (m, n, k), a shape the other GPU's model measured: each
    kernel's time there (its `estimates` at that very shape: the nearest measured M, moved to m
    by its cost), times the kernel's ratio between the GPUs at that M (else over every shared
    point; `gpu_time_ratios`). Kernels without a ratio are left out."""
    if (n, k) not in other.shapes:
        return {}
    near_m = other.nearest_m((n, k), m)
    found = {}
    for name, us in other.estimates(m, n, k, (n, k), features_of, kernels).items():
        per = ratios.get(name)
        ratio = None if per is None else per.get(near_m, per.get(None))
        if ratio is not None:
            found[name] = us * ratio
    return found

