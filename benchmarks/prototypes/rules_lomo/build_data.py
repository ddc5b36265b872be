#!/usr/bin/env python3
"""Flatten the stored W8A8 H200 measurements into one JSON dataset for rule learning (offline).

Sources: the H200 tuned table's `model.times` (each kernel with its manifest knobs, 34 M, 16
models) and the 5 tune stores in benchmarks/data (every candidate incl. knob variants; a
candidate's last, settled time, as `gemmgen tune` reads a store). Class: bf16 out, bias epilogue.

Two datasets (--prefer):
  store  (default) a point (dtype, n, k, m) that a store holds is taken from the store (the oracle
         is then the fastest candidate of any knobs, as dispatch_quality.py scores); the table serves
         the points no store holds (the 3 Llama models of session 22, and the 18 extra M of
         shapes the 16-M stores hold).
  table  as benchmarks/prototypes/dispatch_model_cv.py loads it: a shape the table lists is taken
         from the table alone (oracle = fastest kernel with manifest knobs), the stores serve the
         other shapes (the 3 fresh session-32 models).

Each record: dtype, n, k, m, model, src, cfg (config -> µs with manifest knobs), oracle (µs),
knob (config -> µs, the config's best over any knobs the source measured).

    python benchmarks/prototypes/rules_lomo/build_data.py --prefer store   # -> $RULES_LOMO_DATA
    python benchmarks/prototypes/rules_lomo/build_data.py --prefer table   #    (/tmp/rules_lomo)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from gemmgen.bindings.library import manifest_library
from gemmgen.settings import DEFAULT_MANIFEST_DIR
from gemmgen.tuning.measure import Candidate, Store
from gemmgen.tuning.table import load_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/prototypes
import dispatch_model_cv as cv  # noqa: E402
from common import DATA_DIR  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.yaml"
TABLE = Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.tuned.h200.yaml"
STORES = sorted((ROOT / "benchmarks" / "data").glob("w8a8_h200_store_*.jsonl.gz"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefer", choices=("store", "table"), default="store")
    ap.add_argument("--out", type=Path, help="default: $RULES_LOMO_DATA/data_<prefer>.json")
    args = ap.parse_args()
    if args.out is None:
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        args.out = DATA_DIR / f"data_{args.prefer}.json"
    library = manifest_library(MANIFEST)
    config_of = {name: k.spec.origin.config for name, k in library.kernels.items()}
    manifest_cand = {name: Candidate.of(k) for name, k in library.kernels.items()}
    table = load_table(TABLE)
    model_of = cv.models_of(table)

    tab: dict = {}  # (dtype, n, k, m) -> {config: µs}
    for key, ct in table.classes.items():
        if key[2:] != ("bf16", "ScaledEpilogueBias") or ct.model is None:
            continue
        for (n, k, m), row in ct.model.times.items():
            tab[(key[1], n, k, m)] = {config_of[name]: us for name, us in row.items()
                                      if us is not None and math.isfinite(us)}
    sto: dict = {}  # (dtype, n, k, m) -> ({config: µs manifest knobs}, oracle, {config: best any knobs})
    for path in STORES:
        for r in Store(path).records.values():
            if r.cls[2:] != ("bf16", "ScaledEpilogueBias") or r.us is None or not math.isfinite(r.us):
                continue
            p = (r.cls[1], r.n, r.k, r.m)
            cfg, orc, knob = sto.setdefault(p, ({}, [math.inf], {}))
            c = config_of[r.kernel]
            orc[0] = min(orc[0], r.us)
            knob[c] = min(knob.get(c, math.inf), r.us)
            if r.candidate == manifest_cand[r.kernel]:
                cfg[c] = r.us
    table_shapes = {(n, k) for (_, n, k, _) in tab}
    out = []
    for p in sorted(set(tab) | set(sto)):
        dtype, n, k, m = p
        if args.prefer == "store":
            use_store = p in sto
        else:
            use_store = (n, k) not in table_shapes
        if use_store and p in sto:
            cfg, orc, knob = sto[p]
            if len(cfg) < 10:
                continue
            rec = dict(cfg=cfg, oracle=orc[0], knob=knob, src="store")
        elif not use_store and p in tab:
            cfg = tab[p]
            if len(cfg) < 10:
                continue
            rec = dict(cfg=cfg, oracle=min(cfg.values()), knob=dict(cfg), src="table")
        else:
            continue
        out.append(dict(dtype=dtype, n=n, k=k, m=m, model=model_of.get((n, k), "?"), **rec))
    args.out.write_text(json.dumps(out))
    models = sorted({r["model"] for r in out})
    print(f"{len(out)} points, {len({(r['n'], r['k']) for r in out})} (N, K), {len(models)} models: {models}")
    for d in sorted({r["dtype"] for r in out}):
        rs = [r for r in out if r["dtype"] == d]
        print(d, len(rs), "store", sum(r["src"] == "store" for r in rs), "table", sum(r["src"] == "table" for r in rs))


if __name__ == "__main__":
    main()
