"""benchmarks/compare_moe_runs.py (runs of bench_moe.py --json from two libraries), on the CPU:
best of a side's runs, ratios row by row, the per-kernel summary and the command's output."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("compare_moe_runs", ROOT / "benchmarks" / "compare_moe_runs.py")
compare_runs = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(compare_runs)


def row(tokens, routing, gemmgen, kernel_us, dtype="a8w4", model="qwen3-30b-a3b"):
    return {"dtype": dtype, "model": model, "tokens": tokens, "routing": routing, "gemmgen": gemmgen,
            "kernel_us": kernel_us, "notes": []}


def run(*rows):
    return {"meta": {"device": "test"}, "rows": list(rows)}


def test_each_side_keeps_its_best_time_and_the_ratio_is_base_over_other():
    base = compare_runs.best_times([
        run(row(256, "uniform", 80.0, {"wgmma16 64x16x128": 83.0, "wgmma32 128x32x128": 79.0})),
        run(row(256, "uniform", 78.0, {"wgmma16 64x16x128": 85.0, "wgmma32 128x32x128": 78.5}))])
    other = compare_runs.best_times([
        run(row(256, "uniform", 88.0, {"wgmma16 64x16x128": 88.8, "wgmma32 128x32x128": 85.8,
                                       "only here 1x1": 5.0}))])
    key = ("a8w4", "qwen3-30b-a3b", 256, "uniform")
    assert base[key + ("wgmma16 64x16x128",)] == 83.0 and base[key + (compare_runs.DISPATCHED,)] == 78.0
    pairs = compare_runs.compare(base, other)
    assert [p[0][-1] for p in pairs] == [compare_runs.DISPATCHED, "wgmma16 64x16x128", "wgmma32 128x32x128"]
    assert pairs[1][1:] == (83.0, 88.8, 83.0 / 88.8)
    summary = compare_runs.summary(pairs)
    assert summary["wgmma32 128x32x128"] == (78.5 / 85.8, 78.5 / 85.8, 78.5 / 85.8, 1)


def test_the_summary_is_a_geomean_over_rows_and_untimed_kernels_are_skipped():
    base = compare_runs.best_times([run(row(64, "uniform", 10.0, {"k": 10.0}), row(64, "skewed", 10.0, {"k": 40.0}),
                                        row(256, "uniform", 10.0, {"k": None, "j": math.inf}))])
    other = compare_runs.best_times([run(row(64, "uniform", 10.0, {"k": 20.0}), row(64, "skewed", 10.0, {"k": 20.0}),
                                         row(256, "uniform", 10.0, {"k": 30.0, "j": 1.0}))])
    geomean, low, high, rows = compare_runs.summary(compare_runs.compare(base, other))["k"]
    assert rows == 2 and (low, high) == (0.5, 2.0) and geomean == pytest.approx(1.0)


def test_the_command_prints_a_table_and_refuses_runs_with_nothing_in_common(tmp_path, capsys):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps(run(row(16, "uniform", 40.0, {"wgmma16 64x16x128": 44.0}))))
    b.write_text(json.dumps(run(row(16, "uniform", 44.0, {"wgmma16 64x16x128": 40.0}))))
    c.write_text(json.dumps(run(row(16, "uniform", 44.0, {"wgmma16 64x16x128": 40.0}, model="mixtral-8x7b"))))
    assert compare_runs.main([str(a), "--vs", str(b), "--rows"]) == 0
    out = capsys.readouterr().out
    assert "| wgmma16 64x16x128 | 1.100 | 1.100-1.100 | 1 |" in out and "| (dispatched) | 0.909 |" in out
    assert compare_runs.main([str(a), "--vs", str(c)]) == 1
    assert "no row and kernel in common" in capsys.readouterr().err
    assert compare_runs.main([str(a), "--vs", str(tmp_path / "missing.json")]) == 1
    assert "cannot read the runs" in capsys.readouterr().err
