#!/usr/bin/env python3
"""An unlisted shape that another GPU's table measured: its times there, scaled per kernel, against
this GPU's own cost model (session 31). Offline, from the two shipped W8A8 tables (no GPU).

The H100's and the H200's tables list the same kernels on GPUs of the same SM count; the H200's
covers more models. For an (N, K) one table lacks and the other lists, dispatch can transfer
across shapes within its own table (`CostModel.blended_estimates`, the 4 nearest shapes) or
across GPUs at the very shape (`cost_model.sibling_estimates`: each kernel's time on the other
GPU times its time ratio between the GPUs over the shapes both list, at the same M). Scored by
leaving each model of one table out (its times dropped from that table, the other table whole,
as when a model is tuned on one GPU only), ratio = that GPU's oracle / the chosen kernel's time,
both with the manifest knobs the tables store:
  own model       the table's cost model fitted without the model, 4 nearest shapes
  other's winner  the other GPU's fastest kernel at the shape, as it is
  sibling         `sibling_estimates` with the ratios of the shapes left in
  both            the geometric mean of the own model's and the sibling's estimates: what dispatch
                  does (`dispatch._sibling_measurement`, session 31)

    python benchmarks/prototypes/sibling_table_cv.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from gemmgen.bindings.library import manifest_library
from gemmgen.settings import DEFAULT_MANIFEST_DIR
from gemmgen.tuning import cost_model
from gemmgen.tuning.cost_model import CostModel
from gemmgen.tuning.table import load_table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dispatch_model_cv as cv  # noqa: E402  (its data loading, fit, features and summary)

TABLES = {"H100": Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.tuned.h100-80gb-hbm3.yaml",
          "H200": Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.tuned.h200.yaml"}


def main() -> None:
    library = manifest_library(cv.MANIFEST)
    features = cv.shipped_features(library, 132)
    data = {gpu: cv.load_data(load_table(path), [], library)[:2] for gpu, path in TABLES.items()}
    print("| table (models left out one at a time) | dtype | own model | other GPU's winner | sibling | both (shipped) |")
    print("|---|---|---|---|---|---|")
    for gpu, other_gpu in (("H100", "H200"), ("H200", "H100")):
        table = load_table(TABLES[gpu])
        model_of = cv.models_of(table)
        for dtype in sorted(data[gpu][0]):
            times, oracle = data[gpu][0][dtype], data[gpu][1][dtype]
            other_times = data[other_gpu][0][dtype]
            other = CostModel("sibling", cv.fit(other_times, {(n, k) for n, k, _ in other_times}, features).coef,
                              other_times)
            every = {(n, k) for n, k, _ in times}
            own, winner, sibling, both = [], [], [], []
            for model in sorted({model_of.get(s, "?") for s in every}):
                test = {s for s in every if model_of.get(s, "?") == model}
                if not test <= other.shapes:
                    continue  # the other table does not list this model: no sibling measurement
                fitted = cv.fit(times, every - test, features)
                kept = CostModel("kept", {}, {p: row for p, row in times.items() if p[:2] not in test})
                ratios = cost_model.gpu_time_ratios(kept, other)
                for (n, k, m), row in times.items():
                    if (n, k) not in test:
                        continue
                    picks = []
                    est = fitted.blended_estimates(m, n, k, fitted.nearest_shapes(n, k), features, list(fitted.coef))
                    picks.append(min(est, key=lambda x: (est[x], x)))
                    there = other_times[(n, k, m)]
                    picks.append(min(there, key=lambda x: (there[x], x)))
                    sib = cost_model.sibling_estimates(ratios, other, m, n, k, features, list(there))
                    picks.append(min(sib, key=lambda x: (sib[x], x)))
                    mean = {x: math.sqrt(est[x] * sib[x]) for x in est if x in sib}
                    picks.append(min(mean, key=lambda x: (mean[x], x)))
                    for bucket, pick in zip((own, winner, sibling, both), picks):
                        bucket.append(oracle[(n, k, m)] / row[pick] if pick in row else 0.0)
            if own:
                print(f"| {gpu} (sibling: {other_gpu}) | {dtype} | {cv.summary(own)} | {cv.summary(winner)} | "
                      f"{cv.summary(sibling)} | {cv.summary(both)} |")


if __name__ == "__main__":
    main()
