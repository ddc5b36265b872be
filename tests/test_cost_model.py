"""The tuned tables' cost model (gemmgen/tuning/cost_model.py) and per-GPU tables: the fit, the
estimate transferred from the nearest measured shape, the W8A8 features, the table's `model`
section (round trip, file:line errors), dispatch on an unlisted shape, and which GPU's table
serves (CPU only)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from gemmgen import dispatch
from gemmgen.bindings.library import _load_tuned_tables
from gemmgen.build.builder import tuned_tables_text
from gemmgen.errors import ManifestError
from gemmgen.families.w8a8 import FAMILY as W8A8
from gemmgen.generator.kernel_config import RuntimeKnobs
from gemmgen.tuning import cost_model
from gemmgen.tuning.cost_model import CostModel
from gemmgen.tuning.table import (Bucket, ClassTable, ShapeEntry, gpu_slug, kernel_set_hash, load_table,
                                  published_table_name, render_table, table_for_gpu, table_path_for,
                                  table_paths_for)

from test_tuning_dispatch import GPU, _choose, _library, _name, use  # noqa: F401  (fixture)

KEY = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")


# ------------------------------------------------------------------------------- the fit

def test_fit_recovers_exact_non_negative_coefficients():
    rng = random.Random(1)
    truth = [2.0, 0.5, 0.0, 3.0]
    rows = [[1.0, rng.uniform(1, 100), rng.uniform(1, 10), rng.uniform(0, 5)] for _ in range(40)]
    times = [cost_model.cost(truth, r) for r in rows]
    assert cost_model.fit(rows, times) == pytest.approx(truth, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 6), st.integers(3, 30))
def test_fit_meets_the_optimality_conditions(seed, size, points):
    """Karush-Kuhn-Tucker for min Σ((c·f - t)/t)² over c >= 0: every coefficient non-negative,
    the gradient's descent direction zero where a coefficient is positive and pointing below
    zero (no gain from raising it) where it is zero."""
    rng = random.Random(seed)
    rows = [[rng.uniform(0, 10) for _ in range(size)] for _ in range(points)]
    times = [rng.uniform(1, 100) for _ in range(points)]
    coef = cost_model.fit(rows, times)
    assert all(c >= 0 for c in coef)
    residual = [(cost_model.cost(coef, r) - t) / (t * t) for r, t in zip(rows, times)]
    descent = [-sum(res * r[i] for res, r in zip(residual, rows)) for i in range(size)]
    scale = max(1.0, max(abs(d) for d in descent), sum(1 / t for t in times))
    for c, d in zip(coef, descent):
        assert d <= 1e-6 * scale
        if c > 1e-9:
            assert abs(d) <= 1e-6 * scale


def test_fit_refuses_no_points():
    with pytest.raises(ValueError, match="no measured points"):
        cost_model.fit([], [])


# ------------------------------------------------------------------------- the estimate

def _features(name, m, n, k):
    return [1.0, float(m * n * k) / 1e6] if name == "a" else [2.0, float(n * k) / 1e6]


def test_estimate_scales_the_nearest_measurement_by_the_model():
    model = CostModel("demo", {"a": (1.0, 1.0), "b": (1.0, 3.0), "gone": (1.0, 1.0)},
                      {(100, 100, 8): {"a": 4.0, "b": 5.0}, (100, 100, 64): {"a": 9.0, "b": 7.0}})
    found = model.estimates(10, 200, 100, (100, 100), _features, ["a", "b", "gone"])
    # m = 10 is nearest the measured m = 8 (log distance); "gone" has no measurement
    there_a, here_a = 1 + 8 * 100 * 100 / 1e6, 1 + 10 * 200 * 100 / 1e6
    there_b, here_b = 2 + 3 * 100 * 100 / 1e6, 2 + 3 * 200 * 100 / 1e6
    assert found == pytest.approx({"a": 4.0 * here_a / there_a, "b": 5.0 * here_b / there_b})
    # m = 48 is nearest 64: its measurement, scaled down to m = 48
    assert model.estimates(48, 100, 100, (100, 100), _features, ["a"]) == pytest.approx(
        {"a": 9.0 * (1 + 48 * 100 * 100 / 1e6) / (1 + 64 * 100 * 100 / 1e6)})
    assert model.estimates(8, 100, 100, (999, 100), _features, ["a"]) == {}


def test_estimates_from_several_shapes_are_a_distance_weighted_log_mean():
    times = {(100, 100, 8): {"a": 4.0, "b": 5.0}, (400, 100, 8): {"a": 20.0, "b": 30.0},
             (100, 1600, 8): {"a": 50.0}}
    model = CostModel("demo", {"a": (1.0, 1.0), "b": (1.0, 3.0)}, times)
    # nearest first in log distance; ties go to the smaller shape; count caps the list
    assert model.nearest_shapes(200, 100) == [(100, 100), (400, 100), (100, 1600)]
    assert model.nearest_shapes(200, 100, 1) == [(100, 100)] and model.nearest_shape(200, 100) == (100, 100)
    assert model.nearest_shapes(300, 100, 2) == [(400, 100), (100, 100)]
    refs = [(100, 100), (400, 100)]
    blended = model.blended_estimates(8, 300, 100, refs, _features, ["a", "b"])
    for name in ("a", "b"):
        parts = [(1 / (cost_model.shape_distance(r, 300, 100) + 0.1),
                  model.estimates(8, 300, 100, r, _features, [name])[name]) for r in refs]
        expected = math.exp(sum(w * math.log(v) for w, v in parts) / sum(w for w, _ in parts))
        assert blended[name] == pytest.approx(expected)
        # between the two single-reference estimates, nearer the nearer shape's (400 for 300)
        lo, hi = sorted(v for _, v in parts)
        assert lo < blended[name] < hi
        assert abs(blended[name] - parts[1][1]) < abs(blended[name] - parts[0][1])
    # only kernels every reference estimates are compared ("b" lacks (100, 1600))
    assert set(model.blended_estimates(8, 100, 400, [(100, 100), (100, 1600)], _features, ["a", "b"])) == {"a"}
    # none in common: the nearest reference alone serves; no reference measured: nothing
    only_b = CostModel("demo", {"a": (1.0, 1.0), "b": (1.0, 3.0)},
                       {(100, 100, 8): {"b": 5.0}, (400, 100, 8): {"a": 20.0}})
    assert only_b.blended_estimates(8, 150, 100, [(100, 100), (400, 100)], _features, ["a", "b"]) == \
        only_b.estimates(8, 150, 100, (100, 100), _features, ["a", "b"])
    assert model.blended_estimates(8, 300, 100, [(999, 999)], _features, ["a"]) == {}


def test_time_ratios_between_two_gpus_and_the_estimate_from_the_other_gpu():
    # GPU 1 (own) runs "a" 2x and "b" 1.5x the time of GPU 2 at m = 8; at m = 64 "a" only 1.6x
    own = CostModel("demo", {}, {(100, 100, 8): {"a": 4.0, "b": 3.0}, (100, 100, 64): {"a": 16.0},
                                 (300, 100, 8): {"a": 12.0, "b": 9.0}})
    other = CostModel("demo", {"a": (1.0, 1.0), "b": (1.0, 3.0)},
                      {(100, 100, 8): {"a": 2.0, "b": 2.0}, (100, 100, 64): {"a": 10.0},
                       (300, 100, 8): {"a": 6.0, "b": 6.0}, (700, 100, 8): {"a": 5.0, "b": 7.0},
                       (700, 100, 64): {"a": 20.0, "b": 30.0}})
    ratios = cost_model.gpu_time_ratios(own, other)
    assert ratios["a"] == pytest.approx({8: 2.0, 64: 1.6, None: (2.0 * 2.0 * 1.6) ** (1 / 3)})
    assert ratios["b"] == pytest.approx({8: 1.5, None: 1.5})
    # at (700, 100), which only the other GPU measured: its times there x the ratio at that M
    assert cost_model.sibling_estimates(ratios, other, 8, 700, 100, _features, ["a", "b"]) == pytest.approx(
        {"a": 5.0 * 2.0, "b": 7.0 * 1.5})
    # m = 64: "b" has no ratio at 64, so its ratio over every shared point serves
    assert cost_model.sibling_estimates(ratios, other, 64, 700, 100, _features, ["a", "b"]) == pytest.approx(
        {"a": 20.0 * 1.6, "b": 30.0 * 1.5})
    # m = 48 is moved from the other GPU's nearest measured m (64) by its cost model
    moved = other.estimates(48, 700, 100, (700, 100), _features, ["a"])["a"]
    assert cost_model.sibling_estimates(ratios, other, 48, 700, 100, _features, ["a"]) == pytest.approx(
        {"a": moved * 1.6})
    # a kernel no shared point measured has no ratio; a shape the other GPU did not measure: nothing
    assert cost_model.sibling_estimates({"b": ratios["b"]}, other, 8, 700, 100, _features, ["a", "b"]) == \
        pytest.approx({"b": 7.0 * 1.5})
    assert cost_model.sibling_estimates(ratios, other, 8, 900, 100, _features, ["a", "b"]) == {}


def test_w8a8_cost_features_count_waves_and_k_steps(case):
    specs = {s.origin.config: s for s in case.expand() if s.dispatch_class == KEY}
    # small: 64x64x128 swap-AB, cluster 1x1: Dᵀ is 4096 x 4 -> 64 x 1 tiles
    assert W8A8.cost_features(specs["small"], 4, 4096, 4096, 132) == [
        1.0, 32.0, 1.0, (4096 * 4096 + 4 * 4096) / 1e6, 4 * 4096 * 2 / 1e6, 32.0, 64 * 32 / 132]
    # large: 128x128x128, cluster 2x1: 300 rows -> 3 tiles, rounded up to 4; 4096 cols -> 32
    f = W8A8.cost_features(specs["large"], 300, 4096, 1000, 132)
    assert f[:3] == [1.0, 8.0, 1.0] and f[5] == 8.0 and f[6] == pytest.approx(4 * 32 * 8 / 132)


# ---------------------------------------------------------------------- the table section

def _model_table(library, tmp_path, *, gpu=GPU, features=W8A8.cost_feature_set, times=None):
    small, large = _name(library, "small"), _name(library, "large")
    shape = ShapeEntry(4096, 4096, (Bucket(8, large, RuntimeKnobs("along_n", 4)),
                                    Bucket(4096, small, RuntimeKnobs())))
    measured = times or {(4096, 4096, 4): {small: 10.0, large: 12.0},
                         (4096, 4096, 2048): {small: 300.0, large: 100.0}}
    model = CostModel(features, {small: (1.0, 0.5, 0, 0, 0, 0, 0), large: (2.0, 0.2, 1.0, 0, 0, 0, 0)},
                      measured)
    meta = {"library": "demo", "arch": "sm90a", "gpu": gpu[0], "sm_count": gpu[1],
            "kernel_set": kernel_set_hash(library.kernels)}
    path = tmp_path / "demo.tuned.yaml"
    path.write_text(render_table(meta, [ClassTable(KEY, (shape,), model=model)]))
    return path


def test_the_model_section_reads_back(case, tmp_path):
    library = _library(case)
    path = _model_table(library, tmp_path)
    table = load_table(path, known_kernels=library.kernels)
    model = table.classes[KEY].model
    assert model.features == W8A8.cost_feature_set and set(model.coef) == {_name(library, "small"), _name(library, "large")}
    assert model.times[(4096, 4096, 2048)][_name(library, "large")] == 100.0
    assert model.coef[_name(library, "large")] == (2.0, 0.2, 1.0, 0, 0, 0, 0)


def test_round_values_with_an_exponent_read_back(case, tmp_path):
    """A time of 20000 µs or a coefficient of 1e-06 at 4 / 6 significant digits is spelled `2e+04`
    / `1e-06` by %g, which YAML 1.1 reads as a string: the writer gives each a decimal point
    (an H200 tune wrote 2e+04 and its table was refused, session 32)."""
    library = _library(case)
    small, large = _name(library, "small"), _name(library, "large")
    path = _model_table(library, tmp_path, times={(4096, 4096, 4): {small: 1e-06, large: 12.0},
                                                  (4096, 4096, 8192): {small: 20000.0, large: 3e5}})
    text = path.read_text()
    assert "2.0e+04" in text and "3.0e+05" in text and "1.0e-06" in text
    model = load_table(path, known_kernels=library.kernels).classes[KEY].model
    assert model.times[(4096, 4096, 8192)] == {small: 20000.0, large: 300000.0}
    assert model.times[(4096, 4096, 4)][small] == 1e-06
    # a table written before the fix (2e+04, 1e-06 without a point) reads the same
    path.write_text(text.replace("2.0e+04", "2e+04").replace("1.0e-06", "1e-06"))
    assert load_table(path, known_kernels=library.kernels).classes[KEY].model.times == model.times


@pytest.mark.parametrize("edit, key", [
    (lambda t: t.replace(f"      features: {W8A8.cost_feature_set}", "      features: 7"), "features"),
    (lambda t: t.replace("[2, 0.2, 1, 0, 0, 0, 0]", "[2, -0.2, 1, 0, 0, 0, 0]"), "coef"),
    (lambda t: t.replace("[2, 0.2, 1, 0, 0, 0, 0]", "[2, 0.2]"), "coef"),
    (lambda t: t.replace("[4096, 4096, 4, 12, 10]", "[4096, 4096, 4, 12]"), "times"),
    (lambda t: t.replace("[4096, 4096, 4, 12, 10]", "[4096, 4096, 0, 12, 10]"), "times"),
])
def test_a_broken_model_section_is_a_file_line_error(case, tmp_path, edit, key):
    library = _library(case)
    path = _model_table(library, tmp_path)
    text = path.read_text()
    path.write_text(edit(text))
    assert path.read_text() != text
    with pytest.raises(ManifestError) as info:
        load_table(path)
    assert info.value.key == key and str(path) in str(info.value) and info.value.line > 0


def test_a_model_naming_a_kernel_the_library_lacks_is_an_error(case, tmp_path):
    library = _library(case)
    path = _model_table(library, tmp_path)
    with pytest.raises(ManifestError, match="not a kernel of this library"):
        load_table(path, known_kernels=[k for k in library.kernels if "t128x128" not in k])


# ----------------------------------------------------------------------------- dispatch

def _install(library, path):
    object.__setattr__(library, "tables", (load_table(path, library.kernels),))
    return library


def test_an_unlisted_shape_takes_the_lowest_estimate(case, use, tmp_path):
    library = use(_install(_library(case), _model_table(_library(case), tmp_path)))
    small, large = _name(library, "small"), _name(library, "large")
    choice = _choose(2048, n=8192)   # the model transfers (4096, 4096, 2048) to n = 8192
    model = library.tables[0].classes[KEY].model

    def est(name):
        spec = library.kernels[name].spec
        here = cost_model.cost(model.coef[name], W8A8.cost_features(spec, 2048, 8192, 4096, 132))
        there = cost_model.cost(model.coef[name], W8A8.cost_features(spec, 2048, 4096, 4096, 132))
        return model.times[(4096, 4096, 2048)][name] * here / there
    expected = min((small, large), key=est)
    assert choice.source == "table" and choice.kernel.name == expected
    assert choice.knobs == library.kernels[expected].spec.knobs  # the kernel's manifest knobs
    assert f"cost model estimate {est(expected):.1f} µs" in choice.reason
    assert "nearest measured shape (n=4096, k=4096)" in choice.reason
    # the listed shape itself still takes its bucket (and knobs)
    assert _choose(4).knobs == RuntimeKnobs("along_n", 4)


def test_the_model_can_pick_what_the_nearest_winner_would_not(case, use, tmp_path):
    """At the measured shape small wins at m = 4 (10 vs 12 µs) but the table's bucket says large;
    far in K the model's estimates decide, not the bucket."""
    base = _library(case)
    small, large = _name(base, "small"), _name(base, "large")
    times = {(4096, 4096, 4): {small: 10.0, large: 12.0}}
    library = use(_install(base, _model_table(base, tmp_path, times=times)))
    choice = _choose(4, k=8192)
    assert choice.kernel.name == small and "cost model" in choice.reason


def test_a_model_of_another_feature_set_is_refitted_from_the_stored_times(case, use, tmp_path, caplog,
                                                                           monkeypatch):
    """A table an older gemmgen wrote (another feature set) still chooses by its cost model: the
    model is refitted to the times the table stores, once a process, with one warning; it
    chooses as the same table rewritten by `gemmgen tune --refit` does."""
    from gemmgen.tuning import tune as tuning
    base = _library(case)
    small, large = _name(base, "small"), _name(base, "large")
    times = {(4096, 4096, m): {small: 5.0 + m / 20, large: 12.0 + m / 100} for m in (4, 64, 512, 2048)}
    old_path = _model_table(base, tmp_path, features="w8a8-tiles-0", times=times)
    library = use(_install(base, old_path))
    fits = []
    real_fit = cost_model.fit_model
    monkeypatch.setattr(cost_model, "fit_model", lambda *a, **kw: fits.append(a) or real_fit(*a, **kw))
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        choices = [_choose(m, n=5120, k=6144) for m in (4, 64, 2048, 2048)]
    assert all("cost model" in c.reason for c in choices)
    assert [c.kernel.name for c in choices[:3]] == [small, small, large]  # as the times say
    warnings = [r.getMessage() for r in caplog.records if "feature set 'w8a8-tiles-0'" in r.getMessage()]
    assert len(warnings) == 1 and "refitted" in warnings[0] and "--refit" in warnings[0]
    # the model dispatch used: fitted once, this gemmgen's features on the stored times
    assert len(fits) == 1
    ctable = library.tables[0].classes[KEY]
    used = dispatch._current_model(library, library.tables[0], ctable, W8A8)
    direct = real_fit(W8A8.cost_feature_set, times, lambda name, m, n, k: W8A8.cost_features(
        library.kernels[name].spec, m, n, k, GPU[1]), [small, large])
    assert used.features == W8A8.cost_feature_set and used.times == ctable.model.times
    assert all(used.coef[name] == pytest.approx(direct.coef[name], rel=1e-9, abs=1e-12) for name in direct.coef)
    assert used.coef != ctable.model.coef and len(fits) == 1  # still once: memoized

    monkeypatch.setattr(tuning, "libraries", lambda: (library,))  # the built library the table names
    out = tuning.refit_table(old_path, tmp_path / "refit" / "demo.tuned.yaml", None, "gemmgen tune --refit x")
    refit = load_table(out, known_kernels=library.kernels)
    old = load_table(old_path, known_kernels=library.kernels)
    model = refit.classes[KEY].model
    assert model.features == W8A8.cost_feature_set and model.times == old.classes[KEY].model.times
    assert all(model.coef[name] == pytest.approx(direct.coef[name], rel=1e-5, abs=1e-12) for name in direct.coef)
    def buckets(table):
        return [(s.n, s.k, [(b.m_max, b.kernel, b.knobs) for b in s.buckets]) for s in table.classes[KEY].shapes]
    assert buckets(refit) == buckets(old) and refit.metadata == old.metadata
    assert "# Refitted by: gemmgen tune --refit x" in out.read_text()
    use(_install(_library(case), out))
    assert [_choose(m, n=5120, k=6144).kernel.name for m in (4, 64, 2048)] == [c.kernel.name for c in choices[:3]]


def test_w8a8_stream_k_waves_are_not_rounded_up(case):
    """A stream-K kernel spreads the tiles' K iterations over every SM: 200 tiles on 132 SMs are
    1.52 waves of work for it, 2 for a data-parallel kernel."""
    spec = next(s for s in case.expand() if s.dispatch_class == KEY and s.origin.config == "large")
    streamk = dataclasses.replace(spec, config=dataclasses.replace(spec.config, cluster=(1, 1, 1),
                                                                   tile_scheduler="streamk"))
    plain = dataclasses.replace(spec, config=dataclasses.replace(spec.config, cluster=(1, 1, 1)))
    m, n, k = 128 * 10, 128 * 20, 1280  # 10 x 20 = 200 tiles of 128 x 128, 10 K iterations
    assert W8A8.cost_features(plain, m, n, k, 132)[1:3] == [20.0, 2.0]
    assert W8A8.cost_features(streamk, m, n, k, 132)[1:3] == pytest.approx([10 * 200 / 132, 200 / 132])
    assert W8A8.cost_features(streamk, m, n, k, 132)[3:] == W8A8.cost_features(plain, m, n, k, 132)[3:]


# ---------------------------------------------------------------------------- per GPU

def test_gpu_slugs_and_table_paths(tmp_path):
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3" and gpu_slug("NVIDIA H200") == "h200"
    manifest = tmp_path / "w8a8_sm90.yaml"
    assert table_path_for(manifest, "NVIDIA H200") == tmp_path / "w8a8_sm90.tuned.h200.yaml"
    for name in ("w8a8_sm90.tuned.yaml", "w8a8_sm90.tuned.h200.yaml", "w8a8_sm90.tuned.h100-80gb-hbm3.yaml",
                 "other.tuned.h200.yaml"):
        (tmp_path / name).write_text("")
    assert [p.name for p in table_paths_for(manifest)] == [
        "w8a8_sm90.tuned.h100-80gb-hbm3.yaml", "w8a8_sm90.tuned.h200.yaml", "w8a8_sm90.tuned.yaml"]
    assert published_table_name(tmp_path / "w8a8_sm90.tuned.h200.yaml", manifest) == "tuned.h200.yaml"
    assert published_table_name(tmp_path / "w8a8_sm90.tuned.yaml", manifest) == "tuned.yaml"


def _gpu_tables(case, tmp_path):
    library = _library(case)
    tables = []
    for gpu in (("NVIDIA H100 80GB HBM3", 132), ("NVIDIA H200", 132)):
        folder = tmp_path / gpu_slug(gpu[0])
        folder.mkdir()
        tables.append(load_table(_model_table(library, folder, gpu=gpu), library.kernels))
    return library, tables


def test_each_gpu_gets_its_own_table_and_a_like_gpu_a_neighbour(case, tmp_path):
    library, (h100, h200) = _gpu_tables(case, tmp_path)
    kernel_set = library.kernel_set
    assert table_for_gpu([h100, h200], ("NVIDIA H200", 132), kernel_set) == (h200, None)
    assert table_for_gpu([h100, h200], ("NVIDIA H100 80GB HBM3", 132), kernel_set) == (h100, None)
    table, note = table_for_gpu([h200], ("NVIDIA H100 80GB HBM3", 132), kernel_set)
    assert table is h200 and "same arch and SM count" in note
    table, note = table_for_gpu([h100, h200], ("NVIDIA H100 PCIe", 114), kernel_set)
    assert table is None and "this GPU is NVIDIA H100 PCIe (114 SMs)" in note
    table, note = table_for_gpu([h100, h200], None, kernel_set)
    assert table is h100 and "no GPU visible" in note
    assert table_for_gpu([h100], None, kernel_set) == (h100, None)
    table, note = table_for_gpu([h100], ("NVIDIA H100 80GB HBM3", 132), "0" * 16)
    assert table is None and "another kernel set" in note


def test_two_tables_of_one_gpu_keep_the_first(case, tmp_path, caplog):
    library = _library(case)
    specs = [k.spec for k in library.kernels.values()]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = _model_table(library, tmp_path / "a"), _model_table(library, tmp_path / "b")
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        tables = _load_tuned_tables([first, second], specs)
    assert [t.path for t in tables] == [str(first)]
    assert any("measured on the same GPU" in r.getMessage() for r in caplog.records)


def test_build_publishes_every_gpus_table(case, tmp_path):
    library = _library(case)
    manifest = case.write()
    for gpu in (("NVIDIA H100 80GB HBM3", 132), ("NVIDIA H200", 132)):
        path = _model_table(library, tmp_path, gpu=gpu)
        path.rename(table_path_for(manifest, gpu[0]))
    published = tuned_tables_text(manifest, case.expand(), print)
    assert set(published) == {"tuned.h100-80gb-hbm3.yaml", "tuned.h200.yaml"}
    assert "gpu: NVIDIA H200" in published["tuned.h200.yaml"]


def test_a_format_1_table_reads_but_may_not_carry_a_model(case, tmp_path):
    library = _library(case)
    path = _model_table(library, tmp_path)
    text = path.read_text()
    assert "format: 2" in text
    path.write_text(text.replace("format: 2", "format: 1"))
    with pytest.raises(ManifestError, match="needs format 2"):
        load_table(path)
    path.write_text(text.replace("format: 2", "format: 1").split("    model:")[0])
    assert load_table(path).classes[KEY].model is None


def test_a_repeated_point_and_the_message_of_a_bad_row(case, tmp_path):
    library = _library(case)
    path = _model_table(library, tmp_path)
    text = path.read_text()
    path.write_text(text.replace("[4096, 4096, 2048,", "[4096, 4096, 4,"))
    with pytest.raises(ManifestError, match=r"\(4096, 4096, 4\) listed twice"):
        load_table(path)
    path.write_text(text.replace("[4096, 4096, 4, 12, 10]", "[4096, 4096, 4, 12]"))
    with pytest.raises(ManifestError, match=r"got \[4096, 4096, 4, 12\]"):
        load_table(path)


def test_coefficients_that_do_not_match_the_features_fall_back(case, use, tmp_path, caplog):
    base = _library(case)
    path = _model_table(base, tmp_path)
    path.write_text(path.read_text().replace("[1, 0.5, 0, 0, 0, 0, 0]", "[1]").replace(
        "[2, 0.2, 1, 0, 0, 0, 0]", "[2]"))
    library = use(_install(base, path))
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        choice = _choose(4, n=5120)
    assert "nearest measured shape" in choice.reason and "cost model" not in choice.reason
    assert any("does not fit this gemmgen" in r.getMessage() for r in caplog.records)


def test_fit_handles_features_of_very_different_scales():
    rows = [[1e-9, 1e9], [2e-9, 1e9], [3e-9, 2e9]]
    truth = [1e10, 2e-9]
    times = [cost_model.cost(truth, r) for r in rows]
    assert cost_model.fit(rows, times) == pytest.approx(truth, rel=1e-6)


def test_refit_is_its_own_command(capsys):
    from gemmgen.cli import main
    assert main(["tune", "--refit", "some.tuned.yaml", "--shapes", "llama3_8b", "--m", "1,2"]) == 1
    assert "--shapes, --m belong to a tune" in capsys.readouterr().err


@pytest.mark.parametrize("gpu", ["h200", "h100-80gb-hbm3"])
def test_the_shipped_w8a8_tables_models_are_the_fit_of_their_times(gpu, tmp_path):
    """`gemmgen tune --refit` on a shipped table (no GPU; the kernels' shapes from the shipped
    manifest) gives back its cost model: the model a table ships is this gemmgen's features
    fitted to the times it stores."""
    from gemmgen.cli import main
    from gemmgen.settings import DEFAULT_MANIFEST_DIR
    shipped = f"{DEFAULT_MANIFEST_DIR}/w8a8_sm90.tuned.{gpu}.yaml"
    out = tmp_path / f"w8a8_sm90.tuned.{gpu}.yaml"
    assert main(["tune", "--refit", shipped, "--out", str(out)]) == 0
    before, after = load_table(shipped), load_table(out)
    assert before.classes.keys() == after.classes.keys()
    for key, ctable in before.classes.items():
        assert ctable.model.features == after.classes[key].model.features == W8A8.cost_feature_set
        assert ctable.model.coef == after.classes[key].model.coef and ctable.model.times == after.classes[key].model.times
