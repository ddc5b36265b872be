"""benchmarks/bench_scaled_mm.py's summary of issue 14's floors, on synthetic rows (CPU only):
each floor's population, its PASS / FAIL and the worst point it names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
_SPEC = importlib.util.spec_from_file_location(
    "bench_scaled_mm", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scaled_mm.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)

BANDWIDTH = 4e12  # bytes/s: a 4096 x 4096 weight reads in 4.194 µs


def _row(impl, m, vs_baseline=None, median_us=10.0, n=4096, k=4096, model="demo"):
    return {"impl": impl, "m": m, "n": n, "k": k, "model": model, "vs_baseline": vs_baseline,
            "median_us": median_us}


def _lines(rows, **kw):
    return {line.split(":")[0]: line for line in bench.floor_checks(rows, BANDWIDTH, **kw)}


def test_fp8_floors_take_the_geomean_and_the_worst_point_from_m_512():
    rows = [_row("gemmgen_fp8", 512, 1.20), _row("gemmgen_fp8", 4096, 0.96, n=8192),
            _row("gemmgen_fp8", 256, 0.50)]  # below M = 512: not counted
    lines = _lines(rows)
    geo = lines["- fp8 x _scaled_mm rw geomean at M >= 512 >= 1.05"]
    assert "PASS (1.07x over 2 points)" in geo and "worst single point 0.96x (demo N=8192 K=4096 M=4096)" in geo
    assert "PASS (2 points)" in lines["- fp8 x _scaled_mm rw at every shape from M = 512 >= 0.95"]
    rows.append(_row("gemmgen_fp8", 8192, 0.94, model="other"))
    lines = _lines(rows)
    every = lines["- fp8 x _scaled_mm rw at every shape from M = 512 >= 0.95"]
    assert every.startswith("- fp8 x _scaled_mm rw at every shape from M = 512 >= 0.95: FAIL (3 points)")
    assert "0.94x (other N=4096 K=4096 M=8192)" in every
    assert "FAIL (1.03x over 3 points)" in lines["- fp8 x _scaled_mm rw geomean at M >= 512 >= 1.05"]


def test_int8_and_small_m_floors_and_what_a_run_did_not_measure():
    rows = [_row("gemmgen_int8", 1024, 1.7), _row("gemmgen_int8", 2048, 1.95),  # geomean 1.82
            _row("gemmgen_int8", 512, 1.0),  # below M = 1024: not counted
            _row("gemmgen_int8", 1, median_us=5.0), _row("gemmgen_int8", 16, median_us=6.0),
            _row("gemmgen_int8", 32, median_us=99.0)]  # above M = 16: not counted
    lines = _lines(rows)
    assert "PASS (1.82x over 2 points); worst single point 1.70x" in lines["- int8 x _int_mm geomean at M >= 1024 >= 1.8"]
    small = lines["- gemmgen i8 time / weight-read time geomean at M <= 16 <= 1.4"]
    read_us = 4096 * 4096 / BANDWIDTH * 1e6
    assert f"PASS ({(5.0 * 6.0) ** 0.5 / read_us:.2f}x over 2 points)" in small
    assert f"worst single point {6.0 / read_us:.2f}x (demo N=4096 K=4096 M=16)" in small
    assert lines["- fp8 x _scaled_mm rw geomean at M >= 512 >= 1.05"].endswith("not evaluated (no points in this run)")
    assert "not evaluated" in lines["- gemmgen fp8 time / weight-read time geomean at M <= 16 <= 1.4"]
    slow = _lines([_row("gemmgen_fp8", 8, median_us=7.0)])
    assert "FAIL" in slow["- gemmgen fp8 time / weight-read time geomean at M <= 16 <= 1.4"]


def test_a_run_without_fast_accum_says_its_baseline_is_not_the_issues():
    lines = bench.floor_checks([_row("gemmgen_fp8", 512, 1.1)], BANDWIDTH, fast_accum=False)
    assert "(use_fast_accum=False: the issue's baseline is fast-accum)" in lines[0]


def test_rounds_rotate_the_order_and_merge_to_the_median_round():
    assert bench.rotated(("a", "b", "c"), 0) == ["a", "b", "c"]
    assert bench.rotated(("a", "b", "c"), 1) == ["b", "c", "a"]
    assert bench.rotated(("a", "b", "c"), 4) == ["b", "c", "a"]

    def timed(us, status="ok"):
        return {"impl": "gemmgen_fp8", "m": 1024, "n": 4096, "k": 4096, "status": status,
                "median_us": us, "min_us": us * 0.9, "mean_us": us, "host_bound": 0,
                "tflops": None, "samples_us": f"{us:.2f}", "rounds": 1}

    merged = bench.merge_rounds([timed(30.0), timed(10.0), timed(12.0)])
    assert merged["median_us"] == 12.0 and merged["min_us"] == pytest.approx(9.0)
    assert merged["tflops"] == pytest.approx(2 * 1024 * 4096 * 4096 / 12e-6 / 1e12)
    assert merged["samples_us"] == "30.00 10.00 12.00" and merged["rounds"] == 3
    failed = dict(timed(10.0, "error: boom"), median_us=None)
    assert bench.merge_rounds([timed(10.0), failed]) is failed
