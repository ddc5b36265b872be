"""Choosing from measured times, on synthetic timings: ties, buckets, determinism, pruning."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from gemmgen.tuning import select


def test_pick_breaks_ties_within_tolerance_by_rank():
    rank = {"a": 0, "b": 1, "c": 2}.get
    assert select.pick({"a": 10.15, "b": 10.0, "c": 12.0}, rank, 0.02) == "a"  # a within 2% of b
    assert select.pick({"a": 10.3, "b": 10.0, "c": 12.0}, rank, 0.02) == "b"   # a 3% slower
    assert select.pick({"a": math.inf, "b": 11.0, "c": 10.0}, rank, 0.02) == "c"
    with pytest.raises(ValueError, match="no candidate"):
        select.pick({"a": math.inf}, rank)


def test_buckets_merge_runs_of_one_winner():
    assert select.buckets({1: "s", 8: "s", 16: "m", 64: "m", 128: "s", 4096: "l"}) == [
        (8, "s"), (64, "m"), (128, "s"), (4096, "l")]
    assert select.buckets({5: "x"}) == [(5, "x")]


def _synthetic_times(rng: random.Random, noise: float) -> dict:
    """Three shapes x an M grid x 4 candidates whose true times differ by ≥ 6% or ≤ 0.5%."""
    truth = {}
    for n, k in ((4096, 4096), (6144, 4096), (28672, 4096)):
        for m in (1, 16, 64, 256, 1024, 4096):
            base = 10.0 + m * n * k / 1e9
            # "b" ties with "a" (0.4%) at small M; "c" wins clearly at large M
            truth[(n, k, m)] = {"a": base, "b": base * 1.004,
                                "c": base * (1.10 if m < 1024 else 0.85), "d": base * 1.3}
    return {p: {c: t * (1 + rng.uniform(-noise, noise)) for c, t in row.items()}
            for p, row in truth.items()}


def test_winners_are_deterministic_under_noise_below_the_tolerance():
    rank = {"a": 0, "b": 1, "c": 2, "d": 3}.get
    tables = set()
    for seed in range(25):
        times = _synthetic_times(random.Random(seed), noise=0.004)
        winners = tuple(sorted((p, select.pick(row, rank, 0.02)) for p, row in times.items()))
        tables.add(winners)
    assert len(tables) == 1
    (winners,) = tables
    assert {w for p, w in winners if p[2] < 1024} == {"a"}   # the tie goes to the lower rank
    assert {w for p, w in winners if p[2] >= 1024} == {"c"}


def _brute_force_minimum(times, groups, min_ratio, min_geomean):
    for size in range(1, len(groups) + 1):
        for combo in itertools.combinations(groups, size):
            ratios = [min(row.values()) / min(row[g] for g in combo) for row in times.values()]
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            if min(ratios) >= min_ratio and geo >= min_geomean:
                return size
    raise AssertionError("the full set always qualifies")


@pytest.mark.parametrize("seed", range(60))
def test_pruning_never_drops_below_the_thresholds_and_is_minimal(seed):
    rng = random.Random(seed)
    groups = [f"g{i}" for i in range(rng.randint(2, 7))]
    times = {}
    for point in range(rng.randint(3, 25)):
        times[(4096, 4096, point + 1)] = {g: rng.uniform(1.0, 1.6) for g in groups}
    chosen = select.select_groups(times, lambda c: c, lambda g: int(g[1:]))
    ratios = [min(row.values()) / min(row[g] for g in chosen.kept) for row in times.values()]
    assert min(ratios) >= select.MIN_RATIO
    assert math.exp(sum(map(math.log, ratios)) / len(ratios)) >= select.MIN_GEOMEAN
    assert math.isclose(chosen.worst, min(ratios)) and chosen.geomean >= select.MIN_GEOMEAN
    assert len(chosen.kept) == _brute_force_minimum(times, groups, select.MIN_RATIO, select.MIN_GEOMEAN)
    again = select.select_groups(dict(reversed(list(times.items()))), lambda c: c, lambda g: int(g[1:]))
    assert again.kept == chosen.kept  # order of the measurements does not matter


def test_pruning_counts_every_knob_of_a_group_and_skips_unrunnable_candidates():
    # candidates (group, knob); g2 cannot run point 2 but g1's knob variant covers it
    times = {(1, 1, 1): {("g1", 0): 10.0, ("g1", 1): 9.0, ("g2", 0): 9.1},
             (1, 1, 2): {("g1", 0): 10.0, ("g1", 1): 20.0, ("g2", 0): math.inf},
             (1, 1, 3): {("g1", 0): 10.0, ("g3", 0): 30.0}}
    chosen = select.select_groups(times, lambda c: c[0], lambda g: g)
    assert chosen.kept == ("g1",) and chosen.worst == 1.0


def test_greedy_selection_above_the_exhaustive_limit_still_meets_the_thresholds(monkeypatch):
    monkeypatch.setattr(select, "EXHAUSTIVE_LIMIT", 2)
    rng = random.Random(7)
    groups = [f"g{i}" for i in range(8)]
    times = {(1, 1, p): {g: rng.uniform(1.0, 2.0) for g in groups} for p in range(30)}
    chosen = select.select_groups(times, lambda c: c, lambda g: int(g[1:]))
    ratios = [min(row.values()) / min(row[g] for g in chosen.kept) for row in times.values()]
    assert min(ratios) >= select.MIN_RATIO and chosen.geomean >= select.MIN_GEOMEAN


def test_rule_tree_learns_m_buckets_when_only_m_matters():
    times = {}
    for n in (4096, 8192):
        times[(n, 4096, 16)] = {"small": 5.0, "large": 9.0}
        times[(n, 4096, 64)] = {"small": 6.0, "large": 6.05}
        times[(n, 4096, 4096)] = {"small": 900.0, "large": 500.0}
    tree = select.RuleTree.grow(times, lambda c: c, {"small": 0, "large": 1}.get, ["small", "large"])
    assert tree.rules() == [("m <= 64", "small"), ("true", "large")]


def test_rule_tree_splits_on_n_and_k_where_the_winner_depends_on_them():
    """`narrow` wins on N <= 2048 and `deep` on K > 8192 (at M > 64), `small` at M <= 64,
    `large` elsewhere; each region spans two shapes or more. The rules, in first-match order,
    decide every point as the tree does, and pick the region's winner."""
    groups = {"small": 0, "large": 1, "narrow": 2, "deep": 3}

    def winner(n, k, m):
        return "small" if m <= 64 else "narrow" if n <= 2048 else "deep" if k > 8192 else "large"

    times = {}
    for n in (1024, 2048, 4096, 8192):
        for k in (4096, 8192, 14336, 28672):
            for m in (16, 64, 256, 4096):
                times[("int8", n, k, m)] = {g: (1.0 if g == winner(n, k, m) else 1.3) * (m + 100)
                                            for g in groups}
    tree = select.RuleTree.grow(times, lambda c: c, groups.get, list(groups))
    rules = tree.rules()
    assert rules[-1][0] == "true" and len(rules) == 4
    assert {g for _, g in rules} == set(groups)
    assert any("n <= 2048" in c for c, _ in rules) and any("k <= 8192" in c for c, _ in rules)

    def first_match(point):
        values = {"n": point[1], "k": point[2], "m": point[3]}
        for condition, group in rules:
            if condition == "true" or all(values[v] <= int(t) for v, _, t in
                                          (part.split() for part in condition.split(" and "))):
                return group
    for point in times:
        assert first_match(point) == tree.decide(point) == winner(*point[1:]), point


def test_rule_tree_needs_two_shapes_to_split_on_n_or_k():
    """One odd shape is no evidence about N: its own winner does not get a rule."""
    times = {}
    for n, k in ((4096, 4096), (8192, 4096), (1280, 4096)):
        for m in (16, 4096):
            odd = n == 1280
            # b wins at the odd shape by 20%: an n split would gain (> the minimum), an m split not
            times[(n, k, m)] = {"a": 10.0 if not odd else 12.0, "b": 12.0 if not odd else 10.0}
    tree = select.RuleTree.grow(times, lambda c: c, {"a": 0, "b": 1}.get, ["a", "b"])
    assert tree.rules() == [("true", "a")]


def test_the_shipped_w8a8_rules_are_the_tree_of_the_committed_measurements():
    """Both families of w8a8_sm90.yaml carry the rules that benchmarks/prototypes/derive_rules.py
    grows from the committed measurements (the H200 table's stored times of the models it held in
    session 29, and the store in benchmarks/data/ for the others), as the manifest and
    benchmarks/RESULTS.md say: editing the rules, the tree or the data without the others fails
    here."""
    import importlib.util
    from gemmgen.bindings.library import manifest_library
    from gemmgen.generator.manifest import load_manifest
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("derive_rules", root / "benchmarks/prototypes/derive_rules.py")
    derive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive)
    manifest = load_manifest(derive.MANIFEST)
    times, _ = derive.load_points(root / "gemmgen/manifests/w8a8_sm90.tuned.h200.yaml",
                                  [root / "benchmarks/data/w8a8_h200_store_mistral_gemma_s29.jsonl.gz"],
                                  manifest_library(derive.MANIFEST), {int(m) for m in derive.M16.split(",")},
                                  set(derive.SESSION29_TABLE_MODELS))
    configs = list(dict.fromkeys(c.name for f in manifest.families for c in f.configs))
    assert len({p[1:3] for p in times}) == 37 and {p[0] for p in times} == {"int8", "e4m3"}
    grown = select.RuleTree.grow(times, lambda c: c, {c: i for i, c in enumerate(configs)}.get, configs).rules()
    for family in manifest.families:
        shipped = [(r.condition.source, family.configs[r.config_index].name) for r in family.dispatch]
        assert shipped == grown, family.name


def test_rule_tree_splits_on_a_variable_the_points_carry():
    """`variables` adds what a point carries before (n, k, m), e.g. output tiles: one split on it
    says what takes several on m and n."""
    times = {}
    for n in (1280, 2560, 5120, 10240):
        for m in (128, 256, 512, 1024):
            tiles = (m // 128) * (n // 128)
            times[(tiles, n, 4096, m)] = {"a": 10.0, "b": 12.0} if tiles <= 40 else {"a": 12.0, "b": 10.0}
    variables = select.TREE_VARIABLES + (("tiles", -4),)
    tree = select.RuleTree.grow(times, lambda c: c, {"a": 0, "b": 1}.get, ["a", "b"], depth=1,
                                variables=variables)
    assert tree.rules() == [("tiles <= 40", "a"), ("true", "b")]
    assert all(tree.decide(p) == min(row, key=row.get) for p, row in times.items())
    plain = select.RuleTree.grow({p[1:]: row for p, row in times.items()}, lambda c: c, {"a": 0, "b": 1}.get,
                                 ["a", "b"], depth=1)
    assert sum(plain.decide(p[1:]) != min(row, key=row.get) for p, row in times.items()) > 0
