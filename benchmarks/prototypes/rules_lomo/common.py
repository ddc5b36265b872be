"""Shared helpers: dataset loading, a prototype `when:` evaluator, scoring (offline, no GPU)."""
from __future__ import annotations

import json
import os
import math
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
# the flattened datasets (build_data.py --out), several MB each: outside the repository
DATA_DIR = Path(os.environ.get("RULES_LOMO_DATA", "/tmp/rules_lomo"))
MANIFEST = ROOT / "gemmgen" / "manifests" / "w8a8_sm90.yaml"
M16 = (1, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192)
SMS = 132
CONFIGS = ["swap16", "swap32", "swap64", "swap128", "mid_k256", "mid", "large", "large_c12", "wide", "large_sk"]
FAMILY_OF = {"int8": "int8", "e4m3": "fp8"}


def load(name: str = "store") -> list[dict]:
    return json.loads((DATA_DIR / f"data_{name}.json").read_text())


def shipped_rules() -> dict[str, list[tuple[str, str]]]:
    """{dtype: [(when, config)]} from the manifest (the repo's file, read only)."""
    doc = yaml.safe_load(MANIFEST.read_text())
    fam = {f["name"]: [(r["when"], r["use"]) for r in f["dispatch"]] for f in doc["families"]}
    return {d: fam[f] for d, f in FAMILY_OF.items()}


def cdiv(a, b):
    return -(-a // b)


def env(m: int, n: int, k: int) -> dict:
    """Variables a prototype extended condition may use (only m, n, k are in today's language)."""
    return {"m": m, "n": n, "k": k, "sms": SMS, "cdiv": cdiv, "min": min, "max": max}


def compile_rules(rules):
    """[(when, config)] -> f(m, n, k) -> config; `when` evaluated as Python over env()."""
    code = [(compile(w.replace("true", "True").replace("false", "False"), w, "eval"), c) for w, c in rules]

    def decide(m, n, k):
        e = env(m, n, k)
        for cond, c in code:
            if eval(cond, {"__builtins__": {}}, e):  # noqa: S307 - our own prototype rules
                return c
        raise ValueError(f"no rule matched m={m} n={n} k={k}")
    return decide


def ratio(rec: dict, config: str) -> float:
    t = rec["cfg"].get(config)
    return rec["oracle"] / t if t else 0.0


def summarize(ratios) -> str:
    r = np.asarray(ratios, float)
    if len(r) == 0:
        return "-"
    g = float(np.exp(np.mean(np.log(np.maximum(r, 1e-9)))))
    return f"{g:.3f} / {r.min():.3f} ({(r < 0.9).sum()}<0.90 of {len(r)})"


def geo_worst(ratios):
    r = np.asarray(ratios, float)
    return float(np.exp(np.mean(np.log(np.maximum(r, 1e-9))))), float(r.min()), int((r < 0.9).sum()), len(r)
