"""benchmarks/bench_mixed_mm.py's summary of issue 10's floors, on synthetic rows (CPU only): each
floor's value is the geomean over the run's shapes at its M, PASS / FAIL against its bound, the
worst shape named; a run in another configuration is not scored."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
_SPEC = importlib.util.spec_from_file_location(
    "bench_mixed_mm", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_mixed_mm.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _row(m, n, i4, bf16=100.0, tiny=None, i8=None, k=4096):
    row = {"m": m, "n": n, "k": k, "bf16_mm": bf16, "gemmgen_i4": i4}
    if tiny is not None:
        row["tinygemm"] = tiny
    if i8 is not None:
        row["gemmgen_i8"] = i8
    return row


def _lines(rows):
    return {line.split(":")[0]: line for line in bench.floor_checks(rows)}


def test_floors_take_the_geomean_per_m_and_name_the_worst_shape(monkeypatch):
    monkeypatch.setattr(bench, "ACT_NAME", "bf16")
    monkeypatch.setattr(bench, "GROUP", 128)
    monkeypatch.setattr(bench, "I8_GROUP", None)
    rows = [_row(16, 4096, 50.0, tiny=80.0, i8=60.0), _row(16, 8192, 25.0, tiny=90.0, i8=62.0),  # 2x, 4x
            _row(64, 4096, 40.0), _row(64, 8192, 60.0),  # 2.5x, 1.67x: geomean 2.04
            _row(4096, 4096, 120.0)]  # 0.83x
    lines = _lines(rows)
    m16 = lines["- gemmgen i4 x bf16 mm at M = 16 >= 2.5"]
    assert "PASS (2.83x over 2 shapes)" in m16 and "worst shape 2.00x (N=4096 K=4096)" in m16
    assert "PASS (2.04x over 2 shapes)" in lines["- gemmgen i4 x bf16 mm at M = 64 >= 2.0"]
    assert "FAIL (0.83x over 1 shapes)" in lines["- gemmgen i4 x bf16 mm at M = 4096 >= 0.85"]
    assert lines["- gemmgen i4 x bf16 mm at M = 1 >= 2.5"].endswith("not evaluated (no points in this run)")
    tiny = lines["- gemmgen i4 x tinygemm at M = 16 > 1"]
    assert "PASS" in tiny and "worst shape 1.60x (N=4096 K=4096)" in tiny
    assert "not evaluated" in lines["- gemmgen i4 x tinygemm at M = 64 > 1"]  # no tinygemm there
    i8 = lines["- gemmgen i8 (per channel) x bf16 mm at M = 16 >= 1.6"]
    assert "PASS (1.64x over 2 shapes)" in i8 and "worst shape 1.61x (N=8192 K=4096)" in i8
    level = [_row(1, 4096, 20.0, tiny=20.0)]  # as fast as tinygemm is not faster
    assert "FAIL (1.00x" in _lines(level)["- gemmgen i4 x tinygemm at M = 1 > 1"]
    rows[1]["gemmgen_i8"] = 70.0  # 1.43x: the geomean drops to 1.54
    assert "FAIL (1.54x" in _lines(rows)["- gemmgen i8 (per channel) x bf16 mm at M = 16 >= 1.6"]


def test_another_configuration_is_not_scored(monkeypatch):
    monkeypatch.setattr(bench, "ACT_NAME", "fp16")
    monkeypatch.setattr(bench, "GROUP", 128)
    monkeypatch.setattr(bench, "I8_GROUP", None)
    (line,) = bench.floor_checks([_row(16, 4096, 10.0)])
    assert line.startswith("- not evaluated: the floors are stated for bf16") and "this run: fp16" in line
