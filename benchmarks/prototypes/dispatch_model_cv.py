#!/usr/bin/env python3
"""Cost-model variants for untuned W8A8 shapes, scored offline from stored measurements (session 29).

Data: a tuned table's `model.times` (each kernel's µs with its manifest knobs at the table's
points) and tune stores (`gemmgen tune` .jsonl, or .jsonl.gz as in benchmarks/data/, read as
`gemmgen tune` reads them: a candidate's last time) holding
every candidate at other points. A point's oracle is its fastest candidate of any knob setting.
For each variant of the cost features, the model is fitted and used exactly as dispatch uses it
(`CostModel.blended_estimates` from the nearest measured shapes, the lowest estimate wins) and scored by
oracle time / chosen kernel's time, two ways:
  held-out   fitted on the table's shapes, scored on the stores' other shapes (issue 14's protocol)
  LOMO       leave one model out: fitted on every other model's shapes (table and stores), scored
             on that model's
both over every M measured, or the M of --m. Shapes map to models through
gemmgen/manifests/shapes/ (a shape of several models: the table's model first).

    python benchmarks/prototypes/dispatch_model_cv.py \\
        --store benchmarks/data/w8a8_h200_store_qwen_llama32_s29.jsonl.gz
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from gemmgen import families
from gemmgen.bindings.library import manifest_library
from gemmgen.settings import DEFAULT_MANIFEST_DIR
from gemmgen.tuning import cost_model
from gemmgen.tuning.measure import Candidate, Store
from gemmgen.tuning.shapes import SHAPES_DIR, load_shapes
from gemmgen.tuning.table import load_table

MANIFEST = Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.yaml"


def load_data(table, stores: list[Path], library, table_models: set[str] | None = None):
    """({dtype: {(n, k, m): {kernel: µs with manifest knobs}}}, {dtype: {point: oracle µs}}, table shapes).

    `table_models`: take only these models' shapes from the table (`models_of`'s names), as it
    was before later models were added to it; the stores serve the others."""
    times: dict[str, dict] = {}
    oracle: dict[str, dict] = {}
    model_of = models_of(table)
    tuned = {(s.n, s.k) for c in table.classes.values() for s in c.shapes
             if table_models is None or model_of.get((s.n, s.k)) in table_models}
    for key, ctable in table.classes.items():
        if key[2:] != ("bf16", "ScaledEpilogueBias") or ctable.model is None:
            continue
        for point, row in ctable.model.times.items():
            if point[:2] in tuned:
                times.setdefault(key[1], {})[point] = dict(row)
                oracle.setdefault(key[1], {})[point] = min(row.values())
    for path in stores:  # the store's last time of each candidate, as `gemmgen tune` reads it
        for record in Store(path).records.values():
            if record.cls[2:] != ("bf16", "ScaledEpilogueBias") or (record.n, record.k) in tuned:
                continue  # another class; or the table's own measurement of the shape stands
            dtype, point = record.cls[1], (record.n, record.k, record.m)
            best = oracle.setdefault(dtype, {})
            best[point] = min(best.get(point, math.inf), record.us)
            if record.candidate == Candidate.of(library.kernels[record.kernel]):
                times.setdefault(dtype, {}).setdefault(point, {})[record.kernel] = record.us
    return times, oracle, tuned


def models_of(table) -> dict[tuple[int, int], str]:
    """(N, K) -> the model of gemmgen/manifests/shapes/ it belongs to (a shape of several models:
    the table's first)."""
    model_of = {}
    first = [SHAPES_DIR / name for name in table.metadata.get("shapes") or ()]
    for path in first + sorted(set(SHAPES_DIR.glob("*.yaml")) - set(first)):
        for shape in load_shapes(path):
            model_of.setdefault((shape.n, shape.k), shape.model)
    return model_of


def shipped_features(library, sms: int):
    family = families.for_op("scaled_mm")
    return lambda name, m, n, k: family.cost_features(library.kernels[name].spec, m, n, k, sms)


def streamk_rounded_features(library, sms: int):
    """Feature set 1 (`w8a8-tiles-1`, shipped until session 30): a stream-K kernel's waves
    rounded up like every other kernel's, though it splits the work evenly over the SMs."""
    base = shipped_features(library, sms)

    def features(name, m, n, k):
        values = base(name, m, n, k)
        if getattr(library.kernels[name].spec.config, "tile_scheduler", "") != "streamk":
            return values
        k_iterations, waves = values[5], math.ceil(values[6] / values[5] - 1e-9)
        return [values[0], waves * k_iterations, waves, *values[3:]]
    return features


def data_parallel_whole_waves_features(library, sms: int):
    """Session 60: a data-parallel kernel without the continuous tiles x K / SMs feature (its
    tiles run in whole waves), so the fit cannot dilute the rounding up of its waves; stream-K
    kernels keep theirs. Aimed at (5376, 21504, 2048), where the shipped model takes a 128x128
    pingpong tile (6 waves, the last 9% full) over stream-K (10% faster)."""
    base = shipped_features(library, sms)

    def features(name, m, n, k):
        values = base(name, m, n, k)
        if getattr(library.kernels[name].spec.config, "tile_scheduler", "") == "streamk":
            return values
        return [*values[:6], 0.0]
    return features


def idle_tail_features(library, sms: int):
    """Session 60: the shipped features and one more, the idle share of a data-parallel
    kernel's last wave x K iterations (rounded-up waves x K - tiles x K / SMs; 0 for stream-K)."""
    base = shipped_features(library, sms)

    def features(name, m, n, k):
        values = base(name, m, n, k)
        if getattr(library.kernels[name].spec.config, "tile_scheduler", "") == "streamk":
            return [*values, 0.0]
        return [*values, values[1] - values[6]]
    return features


VARIANTS = {"shipped (w8a8-tiles-2: stream-K waves continuous)": shipped_features,
            "w8a8-tiles-1 (stream-K waves rounded up)": streamk_rounded_features,
            "data-parallel kernels in whole waves only (session 60)": data_parallel_whole_waves_features,
            "idle last-wave share x K added (session 60)": idle_tail_features}
REFERENCE_COUNTS = (1, 2, cost_model.REFERENCES)  # measured shapes each estimate is transferred from


def fit(times: dict, shapes: set, features) -> cost_model.CostModel:
    """The model of `features` fitted to the points of `shapes` (as `gemmgen tune` fits it)."""
    points = {p: row for p, row in times.items() if (p[0], p[1]) in shapes}
    return cost_model.fit_model("variant", points, features, sorted({kernel for row in points.values() for kernel in row}))


def scores(model, features, times, oracle, shapes: set, m_grid: set | None,
           references: int = cost_model.REFERENCES) -> list[float]:
    ratios = []
    for (n, k, m), row in times.items():
        if (n, k) not in shapes or (m_grid is not None and m not in m_grid):
            continue
        estimates = model.blended_estimates(m, n, k, model.nearest_shapes(n, k, references), features,
                                            list(model.coef))
        chosen = min(estimates, key=lambda name: (estimates[name], name))
        ratios.append(oracle[(n, k, m)] / row[chosen] if chosen in row else 0.0)
    return ratios


def summary(ratios: list[float]) -> str:
    geomean = math.exp(sum(math.log(max(r, 1e-9)) for r in ratios) / len(ratios))
    return f"{geomean:.3f} / {min(ratios):.3f} ({len(ratios)})"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.tuned.h200.yaml")
    parser.add_argument("--store", type=Path, nargs="*", default=[])
    parser.add_argument("--m", help="comma-separated M to score (default: every M measured)")
    args = parser.parse_args(argv)
    library = manifest_library(MANIFEST)
    table = load_table(args.table)
    sms = int(table.metadata["sm_count"])
    times, oracle, tuned = load_data(table, args.store, library)
    model_of = models_of(table)
    every = {(n, k) for rows in times.values() for n, k, _ in rows}
    held_out = every - tuned
    m_grid = {int(m) for m in args.m.split(",")} if args.m else None
    print(f"table {args.table.name}: {len(tuned)} shapes; stores: {len(held_out)} other shapes; "
          f"models: {len({model_of.get(s, '?') for s in every})}")
    print("| variant | reference shapes | dtype | held-out geomean / worst (points) | LOMO geomean / worst (points) |")
    print("|---|---:|---|---|---|")
    models = sorted({model_of.get(s, "?") for s in every})
    for label, make in VARIANTS.items():
        features = make(library, sms)
        for dtype in sorted(times):
            fitted = fit(times[dtype], tuned, features)
            folds = []
            for model in models:
                test = {s for s in every if model_of.get(s, "?") == model}
                folds.append((test, fit(times[dtype], every - test, features)))
            for count in REFERENCE_COUNTS:
                held = scores(fitted, features, times[dtype], oracle[dtype], held_out, m_grid,
                              count) if held_out else []
                lomo = []
                for test, folded in folds:
                    lomo += scores(folded, features, times[dtype], oracle[dtype], test, m_grid, count)
                print(f"| {label} | {count} | {dtype} | {summary(held) if held else '-'} | {summary(lomo)} |")

if __name__ == "__main__":
    main()
