"""The tuned table: schema (file:line errors), round trip, lookup, and metadata checks."""

from __future__ import annotations

import pytest

from gemmgen.errors import ManifestError
from gemmgen.generator.kernel_config import RuntimeKnobs
from gemmgen.tuning.table import (Bucket, ClassTable, ShapeEntry, kernel_set_hash, load_table,
                                  render_table, table_path_for)

META = {"library": "w8a8", "arch": "sm90a", "kernel_set": "abc123", "gpu": "NVIDIA H200",
        "sm_count": 132, "cuda": "13.0", "cutlass": "4.2.0.0", "gemmgen": "0.1.0",
        "torch": "2.11.0+cu130", "shapes": ["llama3_8b.yaml"], "m_grid": [1, 16, 64, 4096],
        "tie_tolerance": 0.02}
KEY = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")


def _table() -> list[ClassTable]:
    small = ShapeEntry(4096, 4096, (Bucket(16, "k_small", RuntimeKnobs()),
                                    Bucket(64, "k_mid", RuntimeKnobs("along_n", 4)),
                                    Bucket(4096, "k_large", RuntimeKnobs("along_m", 8, 1))))
    wide = ShapeEntry(28672, 4096, (Bucket(4096, "k_wide", RuntimeKnobs("heuristic", 2)),))
    split = ShapeEntry(4096, 14336, (Bucket(8, "k_split", RuntimeKnobs(split_k_slices=4)),
                                     Bucket(4096, "k_large", RuntimeKnobs())))
    return [ClassTable(KEY, (small, wide, split))]


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "w8a8.tuned.yaml"
    path.write_text(render_table(META, _table(), ["a header line"]))
    return path


def test_round_trip_keeps_every_field(table_file):
    table = load_table(table_file)
    assert table.metadata == META | {"buckets": 6}  # render_table counts the buckets
    (ctable,) = table.classes.values()
    assert ctable.key == KEY
    by_shape = {(s.n, s.k): s for s in ctable.shapes}
    assert [(b.m_max, b.kernel, b.knobs) for b in by_shape[(4096, 4096)].buckets] == [
        (16, "k_small", RuntimeKnobs()), (64, "k_mid", RuntimeKnobs("along_n", 4)),
        (4096, "k_large", RuntimeKnobs("along_m", 8))]
    assert by_shape[(4096, 14336)].buckets[0].knobs.split_k_slices == 4
    assert all(b.line > 0 for s in ctable.shapes for b in s.buckets)
    assert table.kernel_names() == {"k_small", "k_mid", "k_large", "k_wide", "k_split"}
    # rendering is deterministic and stable under a round trip
    again = render_table(table.metadata, list(table.classes.values()), ["a header line"])
    assert again == table_file.read_text()


def test_lookup_exact_shape_picks_the_bucket_containing_m(table_file):
    ctable = load_table(table_file).classes[KEY]
    expected = {1: "k_small", 16: "k_small", 17: "k_mid", 64: "k_mid", 65: "k_large",
                4096: "k_large", 100000: "k_large"}
    for m, kernel in expected.items():
        hit = ctable.lookup(m, 4096, 4096)
        assert hit.exact_shape and hit.bucket.kernel == kernel, m


def test_lookup_falls_back_to_the_nearest_shape_in_log_space(table_file):
    ctable = load_table(table_file).classes[KEY]
    hit = ctable.lookup(8, 24576, 4096)  # nearest: (28672, 4096)
    assert not hit.exact_shape and (hit.shape.n, hit.shape.k) == (28672, 4096)
    assert hit.bucket.kernel == "k_wide"
    hit = ctable.lookup(8, 4096, 12288)  # nearest: (4096, 14336)
    assert (hit.shape.n, hit.shape.k) == (4096, 14336) and hit.bucket.kernel == "k_split"


def test_metadata_mismatch_names_the_reason(table_file):
    table = load_table(table_file)
    assert table.mismatch(gpu=("NVIDIA H200", 132), kernel_set="abc123") is None
    assert table.mismatch(gpu=None, kernel_set="abc123") is None  # no GPU to check against
    assert "NVIDIA H100" in table.mismatch(gpu=("NVIDIA H100 80GB HBM3", 132), kernel_set="abc123")
    assert "114 SMs" in table.mismatch(gpu=("NVIDIA H200", 114), kernel_set="abc123")
    assert "kernel set" in table.mismatch(gpu=("NVIDIA H200", 132), kernel_set="zzz")


@pytest.mark.parametrize("cut", range(1, 12))
def test_a_table_cut_short_at_a_line_boundary_is_an_error(table_file, cut):
    """A table truncated between lines may still parse as YAML: the metadata's bucket count
    catches what the schema does not (file, line and key named)."""
    lines = table_file.read_text().splitlines(keepends=True)
    table_file.write_text("".join(lines[:-cut]))
    with pytest.raises(ManifestError) as info:
        load_table(table_file)
    if cut == 4:  # the last shape gone whole: valid YAML, valid schema, one bucket short
        assert "the table lists 5 buckets but its metadata says 6: it was cut short or edited" in str(info.value)
        assert info.value.key == "buckets" and info.value.line == _line_of(lines, "  buckets: 6")


def _line_of(lines, text: str) -> int:
    return next(i for i, line in enumerate(lines, 1) if line.rstrip("\n") == text)


def test_shipped_table_counts_its_buckets():
    from pathlib import Path
    shipped = Path(__file__).resolve().parent.parent / "gemmgen" / "manifests" / "w8a8_sm90.tuned.h200.yaml"
    table = load_table(shipped)
    assert table.metadata["buckets"] == sum(len(s.buckets) for t in table.classes.values() for s in t.shapes)


def test_kernel_set_hash_ignores_order_and_sees_changes():
    assert kernel_set_hash(["a", "b"]) == kernel_set_hash(["b", "a"])
    assert kernel_set_hash(["a", "b"]) != kernel_set_hash(["a", "c"])


def test_table_path_sits_next_to_the_manifest(tmp_path):
    assert table_path_for(tmp_path / "w8a8_sm90.yaml") == tmp_path / "w8a8_sm90.tuned.yaml"


@pytest.mark.parametrize("old, new, key", [
    ("raster: along_n", "raster: diagonal", "raster"),
    ("swizzle: 4", "swizzle: 3", "swizzle"),
    ("{m_max: 64,", "{m_max: 8,", "m_max"),             # buckets must grow
    ("sm_count: 132", "sm_count: many", "sm_count"),
    ("format: 2", "format: 7", "format"),
    ("  gpu: NVIDIA H200\n", "", "gpu"),                   # required metadata
    ("split_k: 4", "split_k: 0", "split_k"),
    ("{m_max: 16, kernel: k_small,", "{m_max: 16, kernel: k_small, tile: 3,", "tile"),
])
def test_schema_errors_name_file_line_and_key(table_file, old, new, key):
    text = table_file.read_text()
    assert old in text
    table_file.write_text(text.replace(old, new, 1))
    with pytest.raises(ManifestError) as info:
        load_table(table_file)
    assert info.value.key == key and str(table_file) in str(info.value)
    if key != "gpu":
        changed_line = table_file.read_text().splitlines().index(
            next(line for line in table_file.read_text().splitlines() if new.strip() in line)) + 1
        assert info.value.line == changed_line


def test_duplicate_shape_and_unknown_kernel_are_errors(table_file):
    text = table_file.read_text()
    with pytest.raises(ManifestError, match="k_small is not a kernel of this library"):
        load_table(table_file, known_kernels={"k_mid", "k_large", "k_wide", "k_split"})
    table_file.write_text(text.replace("n: 28672", "n: 4096", 1))
    with pytest.raises(ManifestError, match=r"shape \(4096, 4096\) already listed at line \d+"):
        load_table(table_file)


def test_split_k_only_on_kernels_built_with_it(table_file):
    names = {"k_small", "k_mid", "k_large", "k_wide", "k_split"}
    load_table(table_file, known_kernels=names, split_k_kernels={"k_split"})
    with pytest.raises(ManifestError, match="k_split was built without split-K") as info:
        load_table(table_file, known_kernels=names)
    assert info.value.key == "split_k"


def test_a_published_table_that_does_not_fit_is_dropped_with_a_warning(table_file, caplog):
    """A bad optional file must not break loading the library: warn, use the rules."""
    from types import SimpleNamespace

    from gemmgen.bindings.library import _load_tuned_table
    # a table tuned for another kernel set is used bucket by bucket (tests/test_dispatch_partial_tables.py);
    # it is dropped only when none of its buckets names a kernel of the library
    specs = [SimpleNamespace(name=n, split_k=False) for n in ("k_other", "k_another")]
    with caplog.at_level("WARNING", logger="gemmgen.dispatch"):
        assert _load_tuned_table(table_file, specs) is None
    assert "ignoring the tuned table" in caplog.text and "is not a kernel of this library" in caplog.text
    assert _load_tuned_table(table_file.with_name("absent.yaml"), specs) is None


@pytest.mark.parametrize("text", [
    "format: 2\nmetadata: !!int four\n",
    "format: 2\nmetadata: {arch: sm\x0090a}\n",
    "format: 2\ntables: [\n",
    "format: 2\nformat: 3\n",
    "format: 2\ntables:\n  - " + "[" * 100000 + "]" * 100000 + "\n",  # libyaml's composer would crash
], ids=["bad-tag", "nul-character", "end-of-file", "duplicate-key", "deep-nesting"])
def test_a_tuned_tables_yaml_errors_read_as_pyyaml_reports_them(tmp_path, monkeypatch, text):
    """Tuned tables are read with libyaml's parser where it can (3x faster on the H200's table);
    every YAML error is still reported by PyYAML's own loader, the same file:line: message."""
    from gemmgen.generator import yaml_lines
    path = tmp_path / "t.tuned.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as fast:
        load_table(path)
    monkeypatch.setattr(yaml_lines, "_FastLineLoader", None)
    with pytest.raises(ManifestError) as plain:
        load_table(path)
    assert str(fast.value) == str(plain.value) and fast.value.key == "yaml" and fast.value.line >= 2


@pytest.mark.parametrize("name", ["w8a8_sm90.tuned.h200.yaml", "mixed_sm90.tuned.h100-80gb-hbm3.yaml",
                                  "moe_sm90.tuned.h200.yaml"])
def test_libyaml_and_pyyaml_read_a_shipped_table_alike(monkeypatch, name):
    from gemmgen.generator import yaml_lines
    from gemmgen.settings import DEFAULT_MANIFEST_DIR
    if yaml_lines._FastLineLoader is None:
        pytest.skip("PyYAML built without libyaml")
    fast = load_table(f"{DEFAULT_MANIFEST_DIR}/{name}")
    monkeypatch.setattr(yaml_lines, "_FastLineLoader", None)
    assert load_table(f"{DEFAULT_MANIFEST_DIR}/{name}") == fast  # lines of every bucket included
