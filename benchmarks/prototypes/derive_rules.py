#!/usr/bin/env python3
"""Dispatch rules over (m, n, k) for the W8A8 sm90 manifest, learned from measurements (session 29).

The manifest's rules serve every shape a GPU's table does not (a GPU without a table, `tuned=False`,
a manifest edited since its tune). M buckets alone cannot reach the oracle on new shapes: the
best M-only rule set fitted to all measured shapes scores 0.972 of the oracle (geomean). This
grows a small decision tree instead: every split is `m <= t`, `n <= t` or `k <= t` (what the
manifest's conditions can say), every leaf one config (the same for int8 and e4m3, whose
configs share names), grown greedily to maximise Σ log(oracle time / config time) over the
measured points, to --depth levels, a split kept only if it gains more than --min-gain per point
and leaves at least two (N, K) on each side of an n or k split. The tree is then written as
ordered manifest rules (first match wins).

Data: a tuned table's stored times (each kernel with its manifest knobs) and tune stores (.jsonl,
or .jsonl.gz as in benchmarks/data/), bf16 out with bias, at the M of --m. Scores, ratio = oracle /
chosen (the oracle: the fastest candidate of any knob setting):
  LOMO       leave one model out: the tree grown without a model's shapes, scored on them
  --check    the same rules scored on another table's data (e.g. the H100's), beside the
             manifest's rules there

    python benchmarks/prototypes/derive_rules.py \\
        --store benchmarks/data/w8a8_h200_store_mistral_gemma_s29.jsonl.gz \\
        --check gemmgen/manifests/w8a8_sm90.tuned.h100-80gb-hbm3.yaml
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from pathlib import Path

from gemmgen import dispatch
from gemmgen.bindings.library import manifest_library
from gemmgen.generator.manifest import load_manifest
from gemmgen.settings import DEFAULT_MANIFEST_DIR
from gemmgen.tuning.shapes import SHAPES_DIR, load_shapes
from gemmgen.tuning.table import load_table

MANIFEST = Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.yaml"
M16 = "1,8,16,32,64,96,128,192,256,384,512,768,1024,2048,4096,8192"
VARIABLES = {"n": 0, "k": 1, "m": 2}  # a point is (n, k, m, dtype)


def read_store(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        yield from (json.loads(line) for line in handle if line.strip())


def load_points(table_path: Path, stores: list[Path], library, m_grid: set[int]):
    """({(n, k, m, dtype): {config: µs}}, {point: oracle µs}, table) at the M of `m_grid`."""
    config_of = {name: kernel.spec.origin.config for name, kernel in library.kernels.items()}
    table = load_table(table_path)
    times, oracle = {}, {}
    for key, ctable in table.classes.items():
        if key[2:] != ("bf16", "ScaledEpilogueBias") or ctable.model is None:
            continue
        for (n, k, m), row in ctable.model.times.items():
            if m in m_grid:
                times[(n, k, m, key[1])] = {config_of[name]: us for name, us in row.items()}
                oracle[(n, k, m, key[1])] = min(row.values())
    listed = {(s.n, s.k) for c in table.classes.values() for s in c.shapes}
    for path in stores:
        for r in read_store(path):
            point = (r["n"], r["k"], r["m"], r["cls"][1])
            if (r["us"] is None or r["cls"][2:] != ["bf16", "ScaledEpilogueBias"] or r["m"] not in m_grid
                    or point[:2] in listed):
                continue
            oracle[point] = min(oracle.get(point, math.inf), r["us"])
            knobs = library.kernels[r["kernel"]].spec.knobs
            if (r["raster"], r["swizzle"], r["split_k"]) == (knobs.raster, knobs.swizzle, knobs.split_k_slices):
                row = times.setdefault(point, {})
                config = config_of[r["kernel"]]
                row[config] = min(row.get(config, math.inf), r["us"])
    return times, oracle, table


def best_leaf(points, times, oracle, configs) -> tuple[str, float]:
    def value(config):
        return sum(math.log(oracle[p] / times[p][config]) if config in times[p] else -10.0 for p in points)
    return max(((c, value(c)) for c in configs), key=lambda cv: (cv[1], -configs.index(cv[0])))


def grow(points, times, oracle, configs, depth: int, min_gain: float) -> dict:
    leaf, value = best_leaf(points, times, oracle, configs)
    node = {"use": leaf}
    if depth == 0:
        return node
    best = None
    for var, index in VARIABLES.items():
        values = sorted({p[index] for p in points})
        for threshold in values[:-1]:
            left = [p for p in points if p[index] <= threshold]
            right = [p for p in points if p[index] > threshold]
            if var != "m" and min(len({p[:2] for p in left}), len({p[:2] for p in right})) < 2:
                continue
            gain = best_leaf(left, times, oracle, configs)[1] + best_leaf(right, times, oracle, configs)[1] - value
            if best is None or gain > best[0]:
                best = (gain, var, threshold, left, right)
    if best is None or best[0] <= min_gain * len(points):
        return node
    _, var, threshold, left, right = best
    return {"var": var, "t": threshold, "le": grow(left, times, oracle, configs, depth - 1, min_gain),
            "gt": grow(right, times, oracle, configs, depth - 1, min_gain)}


def decide(node: dict, point) -> str:
    while "var" in node:
        node = node["le"] if point[VARIABLES[node["var"]]] <= node["t"] else node["gt"]
    return node["use"]


def ordered_rules(node: dict, bounds: dict | None = None) -> list[tuple[str, str]]:
    """(condition, config) in first-match order: a left subtree's rules carry its `<=` bound (the
    tightest per variable), a right subtree needs none (its left sibling took the rest)."""
    bounds = bounds or {}
    if "var" not in node:
        text = " and ".join(f"{v} <= {t}" for v, t in sorted(bounds.items(), key=lambda vt: "mnk".index(vt[0])))
        return [(text or "true", node["use"])]
    tighter = dict(bounds, **{node["var"]: min(node["t"], bounds.get(node["var"], node["t"]))})
    return ordered_rules(node["le"], tighter) + ordered_rules(node["gt"], bounds)


def score(ratios: list[float]) -> str:
    geomean = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / len(ratios))
    return f"{geomean:.3f}, worst {min(ratios):.3f}, {sum(r < 0.9 for r in ratios)} of {len(ratios)} below 0.90"


def manifest_choice(point) -> str:
    n, k, m, dtype = point
    return dispatch.choose("scaled_mm", a_dtype=dtype, out_dtype="bf16", epilogue="ScaledEpilogueBias", m=m, n=n,
                           k=k, arch="sm90a", tuned=False, manifests=[str(MANIFEST)]).kernel.spec.origin.config


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.tuned.h200.yaml")
    parser.add_argument("--store", type=Path, nargs="*", default=[])
    parser.add_argument("--m", default=M16, help="the M to learn from and score (default: the held-out grid)")
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--min-gain", type=float, default=0.002)
    parser.add_argument("--check", type=Path, nargs="*", default=[], help="other tables to score the rules on")
    args = parser.parse_args(argv)
    library = manifest_library(MANIFEST)
    m_grid = {int(m) for m in args.m.split(",")}
    times, oracle, table = load_points(args.table, args.store, library, m_grid)
    # ties go to the manifest's earlier config
    configs = list(dict.fromkeys(c.name for f in load_manifest(MANIFEST).families for c in f.configs))
    model_of = {}
    first = [SHAPES_DIR / name for name in table.metadata.get("shapes") or ()]
    for path in first + sorted(set(SHAPES_DIR.glob("*.yaml")) - set(first)):
        for shape in load_shapes(path):
            model_of.setdefault((shape.n, shape.k), shape.model)
    points = sorted(times)
    models = sorted({model_of.get(p[:2], "?") for p in points})
    print(f"{len(points)} points ({len({p[:2] for p in points})} (N, K) of {len(models)} models, int8 and e4m3)")
    lomo: dict[str, list[float]] = {}
    for model in models:
        train = [p for p in points if model_of.get(p[:2], "?") != model]
        tree = grow(train, times, oracle, configs, args.depth, args.min_gain)
        for p in points:
            if model_of.get(p[:2], "?") == model:
                chosen = decide(tree, p)
                lomo.setdefault(p[3], []).append(oracle[p] / times[p][chosen] if chosen in times[p] else 0.0)
    manifest = {}
    for p in points:
        manifest.setdefault(p[3], []).append(oracle[p] / times[p][manifest_choice(p)])
    for dtype in sorted(lomo):
        print(f"{dtype}: learned rules, leave one model out: {score(lomo[dtype])}; "
              f"the manifest's rules on the same points: {score(manifest[dtype])}")
    tree = grow(points, times, oracle, configs, args.depth, args.min_gain)
    rules = ordered_rules(tree)
    for path in args.check:
        other, other_oracle, _ = load_points(path, [], library, {m for p in load_table(path).classes.values()
                                                                  for (_, _, m) in (p.model.times if p.model else {})})
        for dtype in sorted({p[3] for p in other}):
            mine = [other_oracle[p] / other[p][decide(tree, p)] for p in other if p[3] == dtype]
            theirs = [other_oracle[p] / other[p][manifest_choice(p)] for p in other if p[3] == dtype]
            print(f"{path.name} {dtype}: learned rules {score(mine)}; the manifest's rules {score(theirs)}")
    print(f"\n{len(rules)} rules (grown on every point):")
    for condition, config in rules:
        print(f'      - {{when: "{condition}", use: {config}}}')


if __name__ == "__main__":
    main()
