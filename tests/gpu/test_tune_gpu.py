"""A small real tune on the GPU (2 shapes × a few M), end to end: measure, table, determinism,
--select, and dispatch through the tuned table (with its knobs) against a float64 reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gemmgen
from gemmgen import dispatch
from gemmgen.bindings import library as library_module
from gemmgen.families.w8a8 import ops
from gemmgen.families.w8a8.abi import RASTER_CODES
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest
from gemmgen.tuning import tune as tuning
from gemmgen.tuning.shapes import WeightShape
from gemmgen.tuning.table import load_table, table_path_for

SHAPES = [WeightShape("o_proj", 4096, 4096, "test", "test:1"),
          WeightShape("qkv_proj", 6144, 4096, "test", "test:2")]
GRID = (8, 256, 4096)


@pytest.fixture(scope="module")
def tuned(gpu_ready, tmp_path_factory):
    """Two independent fresh tunes of the sm90a library's int8 kernels; the table texts."""
    root = tmp_path_factory.mktemp("tune")
    library = tuning.choose_library(None, "w8a8")
    texts = []
    for run in range(2):
        options = tuning.TuneOptions(shapes=SHAPES, m_grid=GRID, library=library.name,
                                     dtypes=("int8",), fresh=True, out=str(root / f"run{run}.tuned.yaml"),
                                     select=run == 0, select_dir=str(root / "pruned"), seed=run)
        texts.append(tuning.tune(options).read_text())
    return library, root, texts


def test_two_tunes_choose_the_same_kernels(tuned):
    library, root, texts = tuned
    tables = [load_table(root / f"run{i}.tuned.yaml", known_kernels=library.kernels) for i in range(2)]
    assert texts[0] == texts[1], "two tunes on the same GPU wrote different tables"
    meta = tables[0].metadata
    assert (meta["gpu"], meta["sm_count"]) == dispatch.gpu_identity(None)
    assert meta["kernel_set"] == library.kernel_set


def test_select_writes_a_buildable_pruned_manifest(tuned):
    library, root, _ = tuned
    manifest_name = tuning.manifest_of(library).name
    pruned = root / "pruned" / manifest_name
    names = {spec.name for spec in expand(load_manifest(pruned))}
    assert 0 < len(names) <= len(library.kernels)
    load_table(table_path_for(pruned), known_kernels=names)


def test_dispatch_uses_the_tuned_table_and_its_knobs(tuned, monkeypatch):
    library, root, _ = tuned
    table = load_table(root / "run0.tuned.yaml", known_kernels=library.kernels)
    with_table = dataclasses.replace(library, tuned=table)  # as if `gemmgen build` published it
    others = tuple(lib for lib in library_module.libraries() if lib is not library)
    launched = []
    real_launch = ops._launch

    def recording_launch(chosen, buffer, device):
        launched.append((chosen.name, ops._ARGS_LAYOUT.unpack_from(buffer)[-4:-1]))  # raster, swizzle, split-K
        return real_launch(chosen, buffer, device)
    try:
        monkeypatch.setattr(dispatch, "libraries", lambda: (with_table, *others))
        monkeypatch.setattr(ops, "_launch", recording_launch)
        gemmgen.reload()
        for m, n in ((8, 4096), (4096, 6144), (300, 5120)):
            k = 4096
            choice = dispatch.choose("scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16,
                                     epilogue="ScaledEpilogueBias", m=m, n=n, k=k)
            assert choice.source == "table", choice.reason
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
