#!/usr/bin/env python3
"""Learn W8A8 sm90 dispatch rules (decision list) from stored H200 times; score leave-one-model-out.

A best-first decision tree (numpy, no new dependency): each split is `var <= t` over the chosen
variables, each leaf one config (manifest knobs); grown by the largest gain of
Σ_points u(oracle / config time) with u(r) = log r - lam * max(0, log(tau / r)) (lam = 0: the
geomean objective of gemmgen.tuning.select.RuleTree; lam > 0 also pushes points out from under
tau), until --leaves leaves or no split gains more than --min-gain per point of the node. A split
on anything but m must leave --min-shapes (N, K) on each side. The tree is written as an ordered
rule list (first match wins), each leaf's path bounds as its `when:`.

Variables: `base` = m, n, k (today's condition language). `ext` adds derived integers
(prototype extension, see README.md): output tiles of each tile shape (t128 = cdiv(m,128) *
cdiv(n,128), t256 (128 x 256), t64 (64 x 128), sw64 = cdiv(n,64) * cdiv(m,64), sw128 =
cdiv(n,128) * cdiv(m,64), sw32 = cdiv(n,64)*cdiv(m,32)), waves (cdiv(t128, 132)), the last
wave's fill in % (eff128 = 100 * t128 // (waves * 132)), and kt = cdiv(k, 128).

Scores (ratio = oracle / chosen): per dtype, geomean / worst over every held-out point (all M the
dataset holds for that model) and over the 16-M grid.

    python benchmarks/prototypes/rules_lomo/learn.py --vars base --leaves 25 --lam 4 --tau 0.93 \
        --min-shapes 4 --yaml /tmp/rules_lomo/rules_base.yaml
"""
from __future__ import annotations

import argparse
import heapq
import json
import sys

import numpy as np

from common import CONFIGS, M16, SMS, compile_rules, geo_worst, load, shipped_rules, summarize, cdiv

BASE = ["m", "n", "k"]


def derived(m, n, k):
    t128 = cdiv(m, 128) * cdiv(n, 128)
    waves = cdiv(t128, SMS)
    return {
        "t128": t128, "t256": cdiv(m, 128) * cdiv(n, 256), "t64": cdiv(m, 64) * cdiv(n, 128),
        "sw64": cdiv(n, 64) * cdiv(m, 64), "sw128": cdiv(n, 128) * cdiv(m, 64), "sw32": cdiv(n, 64) * cdiv(m, 32),
        "waves": waves, "eff128": 100 * t128 // (waves * SMS), "kt": cdiv(k, 128),
    }


EXPR = {  # how an extended variable would read in a condition (prototype language)
    "t128": "cdiv(m,128)*cdiv(n,128)", "t256": "cdiv(m,128)*cdiv(n,256)", "t64": "cdiv(m,64)*cdiv(n,128)",
    "sw64": "cdiv(n,64)*cdiv(m,64)", "sw128": "cdiv(n,128)*cdiv(m,64)", "sw32": "cdiv(n,64)*cdiv(m,32)",
    "waves": "cdiv(cdiv(m,128)*cdiv(n,128),sms)",
    "eff128": "100*(cdiv(m,128)*cdiv(n,128))//(cdiv(cdiv(m,128)*cdiv(n,128),sms)*sms)",
    "kt": "cdiv(k,128)",
}
EXT = BASE + list(EXPR)

GEOM = {  # config geometry as the output grid sees it: (rows of m a tile, cols of n a tile, cluster m, cluster n)
    "sw16": (16, 64, 1, 1), "sw32": (32, 64, 1, 1), "sw64": (64, 64, 1, 1), "sw128": (64, 128, 1, 1),
    "mid": (64, 128, 2, 1), "midk": (64, 128, 1, 2), "lg": (128, 128, 2, 1), "lc12": (128, 128, 1, 2),
    "wide": (128, 256, 2, 1),
}


def grid_tiles(m, n, tm, tn, cm, cn):
    """Output tiles of a (tm x tn) tile grid over m x n, each side padded to whole clusters."""
    return cdiv(cdiv(m, tm), cm) * cm * cdiv(cdiv(n, tn), cn) * cn


def geom_vars(m, n, k):
    out = {}
    for g, geometry in GEOM.items():
        t = grid_tiles(m, n, *geometry)
        w = cdiv(t, SMS)
        out[f"T_{g}"] = t
        out[f"W_{g}"] = w
        out[f"E_{g}"] = 100 * t // (w * SMS)
    out["skw"] = 100 * cdiv(m, 128) * cdiv(n, 128) // SMS  # stream-K's continuous waves x 100
    out["kt"] = cdiv(k, 128)
    return out


for _g, (_tm, _tn, _cm, _cn) in GEOM.items():
    EXPR[f"T_{_g}"] = f"tiles({_tm},{_tn},{_cm},{_cn})"
    EXPR[f"W_{_g}"] = f"waves({_tm},{_tn},{_cm},{_cn})"
    EXPR[f"E_{_g}"] = f"fill({_tm},{_tn},{_cm},{_cn})"
EXPR["skw"] = "100*cdiv(m,128)*cdiv(n,128)//sms"
EXT2 = BASE + [f"{p}_{g}" for g in GEOM for p in "TWE"] + ["skw", "kt"]


def pad_vars(m, n, k):
    """D_g: 100 x (waves x tile area) of geometry g over the smallest such over all geometries and
    stream-K's continuous share (cdiv(m,128)*cdiv(n,128)*128*128/sms): how much padded work a
    kernel of that grid does per SM against the least-padded one."""
    P = {}
    for g, (tm, tn, cm, cn) in GEOM.items():
        P[g] = cdiv(grid_tiles(m, n, tm, tn, cm, cn), SMS) * tm * tn
    P["sk"] = cdiv(cdiv(m, 128) * cdiv(n, 128) * 128 * 128, SMS)
    lo = min(P.values())
    return {f"D_{g}": 100 * p // lo for g, p in P.items()}


EXT3 = BASE + ["kt"] + [f"D_{g}" for g in list(GEOM) + ["sk"]] + [f"E_{g}" for g in GEOM]
for _g in list(GEOM) + ["sk"]:
    EXPR[f"D_{_g}"] = f"padded('{_g}')"  # printed by name; defined in README.md (prototype)


def matrix(recs, names):
    rows = []
    for r in recs:
        dv = {**derived(r["m"], r["n"], r["k"]), **geom_vars(r["m"], r["n"], r["k"]), **pad_vars(r["m"], r["n"], r["k"])}
        rows.append([r[v] if v in r else dv[v] for v in names])
    X = np.array(rows, float)
    T = np.array([[r["cfg"].get(c, np.inf) for c in CONFIGS] for r in recs], float)
    O = np.array([r["oracle"] for r in recs], float)
    S = np.array([hash((r["n"], r["k"])) for r in recs])
    return X, T, O, S


def utility(R, tau, lam):
    lr = np.log(np.maximum(R, 1e-9))
    return lr - lam * np.maximum(0.0, np.log(tau) - lr)


class Tree:
    def __init__(self, names, leaves, min_gain, min_shapes, rank):
        self.names, self.leaves, self.min_gain, self.min_shapes, self.rank = names, leaves, min_gain, min_shapes, rank

    def best_leaf(self, U):
        s = U.sum(0) + self.rank  # tiny tie-break towards the earlier config
        j = int(np.argmax(s))
        return j, float(U[:, j].sum())

    def best_split(self, idx, X, U, S):
        U_ = U[idx]
        _, base = self.best_leaf(U_)
        best = None
        for f, name in enumerate(self.names):
            x = X[idx, f]
            order = np.argsort(x, kind="stable")
            xs, Us = x[order], U_[order]
            cs = np.cumsum(Us, 0)
            tot = cs[-1]
            cut = np.nonzero(xs[:-1] < xs[1:])[0]  # split after position i
            if len(cut) == 0:
                continue
            left = cs[cut].max(1)
            right = (tot - cs[cut]).max(1)
            gain = left + right - base
            if name != "m" and self.min_shapes > 1:
                ss = S[idx][order]
                ok = np.zeros(len(cut), bool)
                # shapes on each side: count distinct (small sets; fine at this size)
                for ci, i in enumerate(cut):
                    if gain[ci] <= 0:
                        continue
                    ok[ci] = (len(set(ss[: i + 1])) >= self.min_shapes and len(set(ss[i + 1:])) >= self.min_shapes)
                gain = np.where(ok, gain, -np.inf)
            ci = int(np.argmax(gain))
            if np.isfinite(gain[ci]) and (best is None or gain[ci] > best[0]):
                thr = xs[cut[ci]]
                best = (float(gain[ci]), f, float(thr))
        return best

    def fit(self, X, U, S):
        self.nodes = []  # node: dict(idx, use, split, le, gt)
        root = {"idx": np.arange(len(X))}
        root["use"] = self.best_leaf(U[root["idx"]])[0]
        heap, count, leaves = [], 0, 1

        def push(node):
            nonlocal count
            sp = self.best_split(node["idx"], X, U, S)
            if sp and sp[0] > self.min_gain * len(node["idx"]):
                heapq.heappush(heap, (-sp[0], count, node, sp))
                count += 1
        push(root)
        while heap and leaves < self.leaves:
            _, _, node, (g, f, thr) = heapq.heappop(heap)
            idx = node["idx"]
            le, gt = idx[X[idx, f] <= thr], idx[X[idx, f] > thr]
            node["split"] = (f, thr)
            node["le"] = {"idx": le, "use": self.best_leaf(U[le])[0]}
            node["gt"] = {"idx": gt, "use": self.best_leaf(U[gt])[0]}
            leaves += 1
            push(node["le"])
            push(node["gt"])
        self.root = root
        return self

    def decide_X(self, X):
        out = np.empty(len(X), int)
        for i, x in enumerate(X):
            node = self.root
            while "split" in node:
                f, thr = node["split"]
                node = node["le"] if x[f] <= thr else node["gt"]
            out[i] = node["use"]
        return out

    def rules(self):
        out = []

        def walk(node, bounds):
            if "split" not in node:
                conds = [f"{EXPR.get(v, v)} <= {t}" for v, t in bounds.items()]
                out.append((" and ".join(conds) or "true", CONFIGS[node["use"]]))
                return
            f, thr = node["split"]
            name = self.names[f]
            walk(node["le"], {**bounds, name: min(int(thr), bounds.get(name, int(thr)))})  # the tightest bound
            walk(node["gt"], bounds)  # first match wins: the le branch's rules come first
        walk(self.root, {})
        # merge consecutive rules with the same config? keep as is (readability), drop dead duplicates
        return simplify(out)


def simplify(rules):
    """Drop a rule directly followed by 'true' with the same config... keep it simple: merge
    adjacent rules whose config equals the next rule's when the next rule's condition is a
    superset (conservative: only when the next is 'true')."""
    out = []
    for cond, c in rules:
        out.append((cond, c))
    while len(out) >= 2 and out[-1][0] == "true" and out[-2][1] == out[-1][1]:
        out.pop(-2)
    return out


def run(args, recs_all, dtype_list, quiet=False):
    names = {"base": BASE, "ext": EXT, "ext2": EXT2, "ext3": EXT3}.get(args.vars) or args.vars.split(",")
    rank = -1e-9 * np.arange(len(CONFIGS))
    models = sorted({r["model"] for r in recs_all})
    train_m = None if args.train_m == "all" else set(M16)
    res = {}
    groups = [dtype_list] if args.shared else [[d] for d in dtype_list]
    held = {d: [] for d in dtype_list}
    for grp in groups:
        recs = [r for r in recs_all if r["dtype"] in grp]
        X, T, O, S = matrix(recs, names)
        U = utility(O[:, None] / T, args.tau, args.lam)
        M = np.array([r["m"] for r in recs])
        mod = np.array([r["model"] for r in recs])
        trainable = np.ones(len(recs), bool) if train_m is None else np.isin(M, list(train_m))
        for model in models:
            tr = (mod != model) & trainable
            te = mod == model
            tree = Tree(names, args.leaves, args.min_gain, args.min_shapes, rank).fit(X[tr], U[tr], S[tr])
            ch = tree.decide_X(X[te])
            r = O[te] / T[te][np.arange(te.sum()), ch]
            for i, rr, c in zip(np.nonzero(te)[0], r, ch):
                held[recs[i]["dtype"]].append((rr, recs[i], CONFIGS[c]))
        full = Tree(names, args.leaves, args.min_gain, args.min_shapes, rank).fit(X[trainable], U[trainable], S[trainable])
        for d in grp:
            res[d] = full
    return held, res


def report(held, label):
    lines = []
    for d, items in held.items():
        allr = [x[0] for x in items]
        m16 = [x[0] for x in items if x[1]["m"] in M16]
        lines.append(f"{label} {d}: LOMO all-M {summarize(allr)} | 16-M {summarize(m16)}")
    return lines


def write_yaml(args, full, label):
    from common import FAMILY_OF
    lines = [f"# Rules grown on all 19 models' stored H200 times by benchmarks/prototypes/rules_lomo/learn.py {label}",
             "# (paste each list as the `dispatch:` of its family in gemmgen/manifests/w8a8_sm90.yaml)"]
    base_lang = set(full[next(iter(full))].names) <= set(BASE)
    if not base_lang:
        lines.append("# PROTOTYPE LANGUAGE: conditions use arithmetic / derived names that the manifest language "
                     "does not allow today (see README.md)")
    for d, tree in full.items():
        rules = tree.rules()
        if base_lang:
            from gemmgen.generator.dispatch_rules import check_rule_table, parse_condition
            check_rule_table([parse_condition(c) for c, _ in rules])  # raises on a gap / unreachable rule
        lines.append(f"{FAMILY_OF[d]}:  # {d}, {len(rules)} rules")
        lines.append("    dispatch:")
        for cond, c in rules:
            lines.append(f'      - {{when: "{cond}", use: {c}}}')
    open(args.yaml, "w").write("\n".join(lines) + "\n")
    print(f"wrote {args.yaml}" + (" (checked by gemmgen's check_rule_table)" if base_lang else ""))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="table")
    ap.add_argument("--vars", default="base")
    ap.add_argument("--leaves", type=int, default=20)
    ap.add_argument("--min-gain", type=float, default=0.0005)
    ap.add_argument("--min-shapes", type=int, default=2)
    ap.add_argument("--tau", type=float, default=0.92)
    ap.add_argument("--lam", type=float, default=0.0)
    ap.add_argument("--shared", action="store_true", help="one tree for int8 and e4m3")
    ap.add_argument("--train-m", choices=("all", "16"), default="all")
    ap.add_argument("--show", action="store_true", help="print the rules grown on all models and the low points")
    ap.add_argument("--json", help="write held-out ratios here")
    ap.add_argument("--yaml", help="write the rules grown on all 19 models here (a manifest `dispatch:` snippet per family)")
    args = ap.parse_args(argv)
    recs = load(args.data)
    held, full = run(args, recs, ["e4m3", "int8"])
    label = f"[{args.vars} L{args.leaves} tau{args.tau} lam{args.lam} ms{args.min_shapes} {'shared' if args.shared else 'perdtype'} train{args.train_m}]"
    for line in report(held, label):
        print(line)
    if args.show:
        for d, tree in full.items():
            print(f"\n# {d}: {len(tree.rules())} rules grown on all 19 models")
            for cond, c in tree.rules():
                print(f'      - {{when: "{cond}", use: {c}}}')
        for d, items in held.items():
            low = sorted((x[0], x[1]["n"], x[1]["k"], x[1]["m"], x[1]["model"]) for x in items if x[0] < 0.9)
            print(f"\n{d}: {len(low)} held-out points below 0.90:")
            for l in low:
                print("   ", f"{l[0]:.3f}", l[1:])
    if args.yaml:
        write_yaml(args, full, label)
    if args.json:
        json.dump({d: [(x[0], x[1]["n"], x[1]["k"], x[1]["m"], x[1]["model"], x[2]) for x in items] for d, items in held.items()},
                  open(args.json, "w"))


if __name__ == "__main__":
    main()
