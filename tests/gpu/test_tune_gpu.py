"""A small real tune on the GPU (2 shapes × a few M), end to end: measure, table, determinism,
--select, and dispatch through the tuned table (with its knobs) against a float64 reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gemmgen
from gemmgen import dispatch
from gemmgen.bindings import launch as launch_module
from gemmgen.bindings import library as library_module
from gemmgen.families.w8a8 import ops
from gemmgen.families.w8a8.abi import RASTER_CODES
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest
from gemmgen.tuning import tune as tuning
from gemmgen.tuning.measure import Candidate, Store
from gemmgen.tuning.shapes import WeightShape
from gemmgen.tuning.table import load_table, table_path_for

SHAPES = [WeightShape("o_proj", 4096, 4096, "test", "test:1"),
          WeightShape("qkv_proj", 6144, 4096, "test", "test:2")]
GRID = (8, 256, 4096)


@pytest.fixture(scope="module")
def tuned(w8a8_dispatch_library, tmp_path_factory):
    """Two independent fresh tunes of the sm90a library's int8 kernels; the table texts."""
    root = tmp_path_factory.mktemp("tune")
    library = w8a8_dispatch_library
    texts = []
    for run in range(2):
        options = tuning.TuneOptions(shapes=SHAPES, m_grid=GRID, library=library.name,
                                     dtypes=("int8",), fresh=True, out=str(root / f"run{run}.tuned.yaml"),
                                     select=run == 0, select_dir=str(root / "pruned"), seed=run)
        texts.append(tuning.tune(options).read_text())
    return library, root, texts


def test_two_tunes_choose_within_the_tolerance(tuned):
    """What the tuner guarantees: timings are noisy, so two tunes may pick different kernels at a
    near-tie, but the second tune's choice is within the tie tolerance of the first's when the
    two are timed side by side (plus a margin for the noise of that check itself)."""
    library, root, texts = tuned
    tables = [load_table(root / f"run{i}.tuned.yaml", known_kernels=library.kernels) for i in range(2)]
    meta = tables[0].metadata
    assert (meta["gpu"], meta["sm_count"]) == dispatch.gpu_identity(None)
    assert meta["kernel_set"] == library.kernel_set
    tolerance, margin = meta["tie_tolerance"], 0.03
    differing = 0
    for key, first in tables[0].classes.items():
        second = tables[1].classes[key]
        for shape in SHAPES:
            for m in GRID:
                picks = [Candidate(t.lookup(m, shape.n, shape.k).bucket.kernel,
                                   *dataclasses.astuple(t.lookup(m, shape.n, shape.k).bucket.knobs))
                         for t in (first, second)]
                if picks[0] == picks[1]:
                    continue
                differing += 1
                problem = tuning.make_problem(key, m, shape)
                # up to three side-by-side timings: noise only makes a true tie look apart, and a
                # real gap beyond the tolerance shows in every one (one timing once failed on a
                # fresh H200 host and passed when re-run, session 28)
                seen = []
                for _ in range(3):
                    us = tuning.retime_side_by_side(picks, lambda c: tuning.time_candidate(c, problem, key))
                    a, b = us[picks[0]], us[picks[1]]
                    seen.append(f"{a:.2f} vs {b:.2f}")
                    if max(a, b) <= min(a, b) * (1 + tolerance + margin):
                        break
                else:
                    raise AssertionError(f"{key} n={shape.n} k={shape.k} m={m}: {picks[0].label()} vs "
                                         f"{picks[1].label()} side by side, µs: {'; '.join(seen)}")
    print(f"{differing} of {len(tables[0].classes) * len(SHAPES) * len(GRID)} points picked "
          "different candidates (each within the tolerance side by side)")


def test_select_writes_a_buildable_pruned_manifest(tuned):
    library, root, _ = tuned
    manifest_name = tuning.manifest_of(library).name
    pruned = root / "pruned" / manifest_name
    names = {spec.name for spec in expand(load_manifest(pruned))}
    assert 0 < len(names) <= len(library.kernels)
    load_table(table_path_for(pruned, tuning.gpu_identity()[0]), known_kernels=names)


def test_dispatch_uses_the_tuned_table_and_its_knobs(tuned, monkeypatch):
    library, root, _ = tuned
    table = load_table(root / "run0.tuned.yaml", known_kernels=library.kernels)
    with_table = dataclasses.replace(library, tables=(table,))  # as if `gemmgen build` published it
    others = tuple(lib for lib in library_module.libraries() if lib is not library)
    launched = []
    real_launch = launch_module.launch

    def recording_launch(chosen, buffer, device, *workspace_bytes):
        launched.append((chosen.name, ops._ARGS_LAYOUT.unpack_from(buffer)[-4:-1]))  # raster, swizzle, split-K
        return real_launch(chosen, buffer, device, *workspace_bytes)
    try:
        monkeypatch.setattr(dispatch, "libraries", lambda: (with_table, *others))
        monkeypatch.setattr(launch_module, "launch", recording_launch)
        gemmgen.reload()
        for m, n in ((8, 4096), (4096, 6144), (300, 5120)):
            k = 4096
            choice = dispatch.choose("scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16,
                                     epilogue="ScaledEpilogueBias", m=m, n=n, k=k)
            assert choice.source == "table", choice.reason
            if n == 5120:  # a shape the tune did not see: the table's cost model picks
                assert "cost model estimate" in choice.reason, choice.reason
            a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
            b = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda").t()
            scale_a = torch.rand(m, 1, device="cuda") * 1e-3
            scale_b = torch.rand(1, n, device="cuda") * 1e-3
            bias = torch.randn(n, device="cuda").to(torch.bfloat16)
            out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out)
            knobs = choice.knobs  # the op launched the table's kernel with the table's knobs
            assert launched[-1] == (choice.kernel.name, (RASTER_CODES[knobs.raster], knobs.swizzle,
                                                         knobs.split_k_slices))
            ref = (a.double() @ b.double()) * scale_a.double() * scale_b.double() + bias.double()
            assert not out.isnan().any()
            torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
    finally:
        monkeypatch.undo()
        gemmgen.reload()


def test_retune_re_times_chosen_points_of_a_table(tuned, tmp_path):
    """`gemmgen tune --retune` on the GPU: one shape of the first tune's table re-timed at one M
    (a store of its own); the written table keeps every other point's pick, and the re-timed
    point's pick is the old one or one that beat it side by side by more than the tie tolerance."""
    library, root, _ = tuned
    source = root / "run0.tuned.yaml"
    options = tuning.TuneOptions(shapes=[SHAPES[1]], m_grid=(4096,), library=library.name, dtypes=("int8",),
                                 fresh=True, retune=str(source), out=str(tmp_path / "retuned.tuned.yaml"),
                                 command="test --retune")
    path = tuning.tune(options)
    assert tuning.store_path(library, options).name.endswith("-retune.jsonl")
    before = load_table(source, known_kernels=library.kernels)
    after = load_table(path, known_kernels=library.kernels)
    assert "# Re-tuned by: test --retune (M 4096; 1 points re-timed" in path.read_text()
    store = Store(tuning.store_path(library, options))
    for key, old in before.classes.items():
        for shape in SHAPES:
            for m in GRID:
                was, now = (t.classes[key].lookup(m, shape.n, shape.k).bucket for t in (before, after))
                if (shape.n, m) != (6144, 4096):
                    assert (now.kernel, now.knobs) == (was.kernel, was.knobs)
                    continue
                row = store.times(key, {(shape.n, shape.k)})[(shape.n, shape.k, m)]
                old_pick, new_pick = tuning._candidate_of(was), tuning._candidate_of(now)
                if tuning.near_ties(store, key, shape.n, shape.k, m, options.tolerance) != [old_pick]:
                    assert store.get(key, shape.n, shape.k, m, old_pick).settled  # re-timed side by side
                tolerance = tuning.tie_tolerance(store, key, shape.n, shape.k, m, row, options)
                assert new_pick == old_pick or row[old_pick] > min(row.values()) * (1 + tolerance)
