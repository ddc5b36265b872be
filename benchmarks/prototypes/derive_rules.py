#!/usr/bin/env python3
"""Dispatch rules over (m, n, k) for the W8A8 sm90 manifest, learned from measurements (session 29).

The manifest's rules serve every shape a GPU's table does not (a GPU without a table, `tuned=False`,
a manifest edited since its tune). M buckets alone cannot reach the oracle on new shapes: the
best config per M, chosen on all measured shapes, scores 0.975-0.977 of the oracle (geomean). This
grows a small decision tree instead (`gemmgen.tuning.select.RuleTree`, which `gemmgen tune
--select` uses too): every split is `m <= t`, `n <= t` or `k <= t` (what the manifest's
conditions can say), every leaf one config (one tree for int8 and e4m3, whose configs share
names), grown greedily on Σ log(oracle time / config time) to --depth levels, a split kept only
if it gains more than --min-gain per point and leaves two (N, K) or more on each side of an n or
k split; then written as ordered manifest rules (first match wins).

Data: a tuned table's stored times (each kernel with its manifest knobs) and tune stores (.jsonl,
or .jsonl.gz as in benchmarks/data/), bf16 out with bias, at the M of --m. Scores, ratio = oracle /
chosen (the oracle: the fastest candidate of any knob setting):
  LOMO       leave one model out: the tree grown without a model's shapes, scored on them
  --check    the same rules scored on another table's data (e.g. the H100's), beside the
             manifest's rules there
  --cost-model  the tables' cost model on the same folds (the table path for unlisted shapes)
  --derived     more variables for the tree to split on, computed from (n, k, m): `tiles` (128 x 128
             output tiles), `tiles256` (128 x 256), `mn` (tried in session 30: +0.002-0.003 LOMO
             geomean, a worse worst on the H100's data; not a manifest variable)

The shipped rules are the tree of the session-29 data: the table's 7 models of then and the
Mistral-Nemo / Gemma-2 store (`--table-models session29`, below; tests/test_tuning_select.py
checks it). Session 30 added those three models to the table (re-timed there); the tree grown on
that data changes one threshold (k <= 14336 for k <= 8192) and scores below the shipped rules
both on it (0.986 / 0.983 e4m3 / int8 against 0.987 / 0.984: the growth is greedy) and on the
H100's data (0.966 / 0.957 against 0.968 / 0.959), so the rules stayed.

    python benchmarks/prototypes/derive_rules.py --table-models session29 \\
        --store benchmarks/data/w8a8_h200_store_mistral_gemma_s29.jsonl.gz \\
        --check gemmgen/manifests/w8a8_sm90.tuned.h100-80gb-hbm3.yaml
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gemmgen import dispatch
from gemmgen.bindings.library import manifest_library
from gemmgen.generator.manifest import load_manifest
from gemmgen.settings import DEFAULT_MANIFEST_DIR
from gemmgen.tuning import select
from gemmgen.tuning.table import load_table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dispatch_model_cv as cv  # noqa: E402  (its data loading and cost-model fit)

MANIFEST = Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.yaml"
M16 = "1,8,16,32,64,96,128,192,256,384,512,768,1024,2048,4096,8192"
# The models the H200 table held when the shipped rules were grown (session 29); session 30 added
# Mistral-Nemo-12B and the Gemma-2 models, which the rules' data takes from the store as then.
SESSION29_TABLE_MODELS = ("Llama-3-8B", "Llama-2-70B", "Llama-3-70B (TP=8)", "Qwen2.5-7B", "Qwen2.5-72B",
                          "Llama-3.2-3B", "Qwen3-32B")
DERIVED = {  # a variable computed from (n, k, m), for --derived
    "tiles": lambda n, k, m: -(-m // 128) * -(-n // 128),
    "tiles256": lambda n, k, m: -(-m // 128) * -(-n // 256),
    "mn": lambda n, k, m: m * n,
}


def load_points(table_path: Path, stores: list[Path], library, m_grid: set[int],
                table_models: set[str] | None = None):
    """({(dtype, n, k, m): {config: µs}}, table) at the M of `m_grid` (`points_of` the data
    dispatch_model_cv.py reads: the table's stored times (of `table_models` only, if given),
    then the stores')."""
    table = load_table(table_path)
    return points_of(cv.load_data(table, stores, library, table_models), library, m_grid), table


def points_of(data, library, m_grid: set[int]) -> dict:
    """{(dtype, n, k, m): {config: µs}} from dispatch_model_cv.load_data's (times, oracle, _) at
    the M of `m_grid`: each config's time with its manifest knobs, and under the key None the
    point's oracle (its fastest candidate of any knobs)."""
    config_of = {name: kernel.spec.origin.config for name, kernel in library.kernels.items()}
    times, oracle, _ = data
    points = {}
    for dtype, rows in times.items():
        for (n, k, m), row in rows.items():
            if m in m_grid:
                points[(dtype, n, k, m)] = {**{config_of[name]: us for name, us in row.items()},
                                            None: oracle[dtype][(n, k, m)]}  # never a config's name
    return points


def score(ratios: list[float]) -> str:
    geomean = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / len(ratios))
    return f"{geomean:.3f}, worst {min(ratios):.3f}, {sum(r < 0.9 for r in ratios)} of {len(ratios)} below 0.90"


def manifest_choice(point) -> str:
    dtype, n, k, m = point
    return dispatch.choose("scaled_mm", a_dtype=dtype, out_dtype="bf16", epilogue="ScaledEpilogueBias", m=m, n=n,
                           k=k, arch="sm90a", tuned=False, manifests=[str(MANIFEST)]).kernel.spec.origin.config


def cost_model_folds(data, features, points, model_of, models) -> None:
    """The tables' cost model (fitted and used as dispatch does) on the same leave-one-model-out
    folds and points: what the table path does for a shape of a model it never measured."""
    times, oracle, _ = data
    every = {p[1:3] for p in points}
    for dtype in sorted({p[0] for p in points}):
        ratios = []
        for model in models:
            test = {s for s in every if model_of.get(s, "?") == model}
            fitted = cv.fit(times[dtype], every - test, features)
            ratios += cv.scores(fitted, features, times[dtype], oracle[dtype], test, {p[3] for p in points})
        print(f"{dtype}: the cost model, leave one model out: {score(ratios)}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.tuned.h200.yaml")
    parser.add_argument("--store", type=Path, nargs="*", default=[])
    parser.add_argument("--m", default=M16, help="the M to learn from and score (default: the held-out grid)")
    parser.add_argument("--depth", type=int, default=select.TREE_DEPTH)
    parser.add_argument("--min-gain", type=float, default=select.TREE_MIN_GAIN)
    parser.add_argument("--check", type=Path, nargs="*", default=[], help="other tables to score the rules on")
    parser.add_argument("--cost-model", action="store_true",
                        help="also score the tables' cost model on the same folds (dispatch_model_cv.py's fit)")
    parser.add_argument("--table-models", nargs="*", metavar="MODEL",
                        help="take only these models' shapes from the table (the stores serve the others): "
                             "--table-models session29 is the data the shipped rules were grown from")
    parser.add_argument("--derived", nargs="*", default=[], choices=sorted(DERIVED),
                        help="derived variables the tree may split on besides m, n and k")
    args = parser.parse_args(argv)
    library = manifest_library(MANIFEST)
    table = load_table(args.table)
    table_models = None
    if args.table_models is not None:
        table_models = set(SESSION29_TABLE_MODELS if args.table_models == ["session29"] else args.table_models)
        known = set(cv.models_of(load_table(args.table)).values())
        if not table_models or table_models - known:
            parser.error(f"--table-models: {', '.join(sorted(table_models - known)) or 'none given'}: expected "
                         f"'session29' alone, or models of {', '.join(sorted(known))}")
    data = cv.load_data(table, args.store, library, table_models)
    times = points_of(data, library, {int(m) for m in args.m.split(",")})
    configs = list(dict.fromkeys(c.name for f in load_manifest(MANIFEST).families for c in f.configs))
    rank = {c: i for i, c in enumerate(configs)}.get  # ties go to the manifest's earlier config

    # a point as the tree sees it: (dtype, *derived, n, k, m)
    variables = select.TREE_VARIABLES + tuple((name, -4 - i) for i, name in enumerate(reversed(args.derived)))

    def seen(point) -> tuple:
        return (point[0], *(DERIVED[name](*point[1:]) for name in args.derived), *point[1:])

    def grow(points) -> select.RuleTree:
        return select.RuleTree.grow({seen(p): times[p] for p in points}, lambda c: c, rank, configs,
                                    args.depth, args.min_gain, variables)

    def ratio(rows, point, config) -> float:
        return rows[point][None] / rows[point][config] if config in rows[point] else 0.0

    model_of = cv.models_of(table)
    points = sorted(times)
    models = sorted({model_of.get(p[1:3], "?") for p in points})
    print(f"{len(points)} points ({len({p[1:3] for p in points})} (N, K) of {len(models)} models, int8 and e4m3)")
    lomo: dict[str, list[float]] = {}
    manifest: dict[str, list[float]] = {}
    for model in models:
        tree = grow([p for p in points if model_of.get(p[1:3], "?") != model])
        for p in points:
            if model_of.get(p[1:3], "?") == model:
                lomo.setdefault(p[0], []).append(ratio(times, p, tree.decide(seen(p))))
    for p in points:
        manifest.setdefault(p[0], []).append(ratio(times, p, manifest_choice(p)))
    for dtype in sorted(lomo):
        print(f"{dtype}: learned rules, leave one model out: {score(lomo[dtype])}; "
              f"the manifest's rules on the same points: {score(manifest[dtype])}")
    if args.cost_model:
        features = cv.shipped_features(library, int(table.metadata["sm_count"]))
        cost_model_folds(data, features, points, model_of, models)
    tree = grow(points)
    for path in args.check:
        grid = {m for c in load_table(path).classes.values() for (_, _, m) in (c.model.times if c.model else {})}
        other, _ = load_points(path, [], library, grid)
        for dtype in sorted({p[0] for p in other}):
            mine = [ratio(other, p, tree.decide(seen(p))) for p in other if p[0] == dtype]
            theirs = [ratio(other, p, manifest_choice(p)) for p in other if p[0] == dtype]
            print(f"{path.name} {dtype}: learned rules {score(mine)}; the manifest's rules {score(theirs)}")
    rules = tree.rules()
    print(f"\n{len(rules)} rules (grown on every point):")
    for condition, config in rules:
        print(f'      - {{when: "{condition}", use: {config}}}')


if __name__ == "__main__":
    main()
