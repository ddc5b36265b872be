"""Check: (1) common.compile_rules on the manifest's rules == gemmgen dispatch.choose(tuned=False) on the
dataset's points; (2) the rules learn.py wrote (argument, default $RULES_LOMO_DATA/rules_base.yaml)
evaluated by gemmgen's own condition parser (first_match) == common.compile_rules on it."""
import random, sys, yaml
from pathlib import Path
from common import DATA_DIR, MANIFEST, compile_rules, load, shipped_rules
from gemmgen import dispatch
from gemmgen.generator.dispatch_rules import parse_condition, first_match
recs = load("table")
random.seed(0)
sample = random.sample(recs, 300)
rules = shipped_rules()
bad = 0
for r in sample:
    d, m, n, k = r["dtype"], r["m"], r["n"], r["k"]
    ch = dispatch.choose("scaled_mm", a_dtype=d, out_dtype="bf16", epilogue="ScaledEpilogueBias", m=m, n=n, k=k,
                         arch="sm90a", tuned=False, manifests=[str(MANIFEST)]).kernel.spec.origin.config
    bad += ch != compile_rules(rules[d])(m, n, k)
print("shipped rules: mismatches vs dispatch.choose(tuned=False):", bad, "of", len(sample))
doc = yaml.safe_load(Path(sys.argv[1] if len(sys.argv) > 1 else DATA_DIR / "rules_base.yaml").read_text())
for fam, d in (("fp8", "e4m3"), ("int8", "int8")):
    lst = [(x["when"], x["use"]) for x in doc[fam]["dispatch"]]
    conds = [parse_condition(w) for w, _ in lst]
    f = compile_rules(lst)
    mism = sum(lst[first_match(conds, r["m"], r["n"], r["k"])][1] != f(r["m"], r["n"], r["k"]) for r in recs if r["dtype"] == d)
    print(f"rules_base.yaml {fam}: gemmgen first_match vs prototype evaluator mismatches: {mism}")
