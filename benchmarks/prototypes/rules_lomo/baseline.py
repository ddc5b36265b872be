"""Shipped rules scored per dtype (rules are fixed, so LOMO == scoring on every model's points),
plus upper bounds: best config with manifest knobs per point (what any rule list could reach at most)."""
import sys
import numpy as np
from common import M16, compile_rules, load, ratio, shipped_rules, summarize

for name in sys.argv[1:] or ["store", "table"]:
    data = load(name)
    rules = shipped_rules()
    print(f"== dataset {name}")
    for d in ("e4m3", "int8"):
        f = compile_rules(rules[d])
        rs = [r for r in data if r["dtype"] == d]
        sh = [ratio(r, f(r["m"], r["n"], r["k"])) for r in rs]
        sh16 = [x for x, r in zip(sh, rs) if r["m"] in M16]
        ub = [r["oracle"] / min(r["cfg"].values()) for r in rs]
        ub16 = [x for x, r in zip(ub, rs) if r["m"] in M16]
        print(f"{d} shipped all-M {summarize(sh)}  M16 {summarize(sh16)}")
        print(f"{d} best-config(manifest knobs) upper bound all-M {summarize(ub)}  M16 {summarize(ub16)}")
        low = sorted((x, r["n"], r["k"], r["m"], r["model"]) for x, r in zip(ub, rs) if x < 0.93)
        for l in low: print("   knob-miss", l)
