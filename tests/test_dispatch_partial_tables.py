"""A tuned table used after its manifest changed (no compile, no GPU): kept bucket by bucket.

A table tuned for kernel set A, used with A + one new config, keeps every entry and every exact
choice (the new kernels are simply not in it); with a config removed, the buckets naming its
kernels become holes whose M ranges the manifest's rules serve, the rest stays; a split_k bucket
on a kernel without split-K is a hole likewise. The GPU check still applies. `gemmgen build`
publishes such a table with a one-line note, `gemmgen validate` says the same, `gemmgen list
--dispatch` names the dropped buckets and `dispatch.explain` says the table is partial.
"""

from __future__ import annotations

import functools
import logging
from types import SimpleNamespace

import pytest

from gemmgen import dispatch
from gemmgen.bindings.library import _load_tuned_table, manifest_library
from gemmgen.build.builder import tuned_tables_text
from gemmgen.cli import main as cli_main
from gemmgen.errors import ManifestError
from gemmgen.generator.expand import expand
from gemmgen.generator.kernel_config import RuntimeKnobs
from gemmgen.generator.manifest import load_manifest
from gemmgen.tuning.table import (Bucket, ClassTable, ShapeEntry, fit_table, kernel_set_hash,
                                  load_table, render_table, table_path_for)

GPU = ("NVIDIA H200", 132)
KEY = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")
NEW_CONFIG = """\
      - name: mid
        tile: [64, 128, 128]
        cluster: [1, 1, 1]
        schedule: pingpong
"""
M_GRID = (1, 4, 8, 9, 16, 33, 64, 65, 200, 4096, 5000, 100000)


def _kernel(specs, config: str) -> str:
    return next(s.name for s in specs if s.origin.config == config
                and (s.a, s.d, s.epilogue) == KEY[1:])


def _write_table(case, specs) -> None:
    """The table `gemmgen tune` could have written for `specs` (kernel set A)."""
    small, large = _kernel(specs, "small"), _kernel(specs, "large")
    shapes = (ShapeEntry(4096, 4096, (Bucket(8, large, RuntimeKnobs("along_n", 4)),
                                      Bucket(64, small, RuntimeKnobs()),
                                      Bucket(4096, large, RuntimeKnobs("along_m", 2)))),
              ShapeEntry(8192, 4096, (Bucket(4096, small, RuntimeKnobs()),)),
              ShapeEntry(4096, 14336, (Bucket(4096, large, RuntimeKnobs()),)))
    meta = {"library": "demo", "arch": "sm90a", "gpu": GPU[0], "sm_count": GPU[1],
            "kernel_set": kernel_set_hash(s.name for s in specs)}
    table_path_for(case.path).write_text(render_table(meta, [ClassTable(KEY, shapes)]))


@pytest.fixture
def tuned_case(case):
    """The test manifest (kernel set A) with its tuned table; returns A's specs."""
    specs = expand(load_manifest(case.write()))
    _write_table(case, specs)
    return specs


def _add_config(case):
    case.replace("    dispatch:\n", NEW_CONFIG + "    dispatch:\n")
    return expand(load_manifest(case.write()))


def _remove_small(case):
    case.replace("      - name: small\n        tile: [64, 64, 128]\n        cluster: [1, 1, 1]\n"
                 "        schedule: warpspecialized\n        swap_ab: true\n", "")
    case.replace('      - when: "m <= 64"\n        use: small\n', "")
    return expand(load_manifest(case.write()))


@pytest.fixture
def use(monkeypatch):
    def install(library, gpu=GPU):
        monkeypatch.setattr(dispatch, "libraries", lambda: (library,))
        monkeypatch.setattr(dispatch, "all_kernels", lambda: dict(library.kernels))
        monkeypatch.setattr(dispatch, "gpu_identity", functools.lru_cache(lambda device=None: gpu))
        dispatch.cache_clear()
        return library
    yield install
    dispatch.cache_clear()


def _choose(m, n=4096, k=4096, **kw):
    return dispatch.choose("scaled_mm", a_dtype="int8", out_dtype="bf16",
                           epilogue="ScaledEpilogueBias", m=m, n=n, k=k, **kw)


def _decisions(shapes=((4096, 4096), (8192, 4096), (4096, 14336), (5000, 4096), (7000, 4096))):
    out = {}
    for n, k in shapes:
        for m in M_GRID:
            c = _choose(m, n, k)
            out[(m, n, k)] = (c.source, c.kernel.name, c.knobs)
    return out


# ------------------------------------------------------------------ the fit itself

def test_a_new_config_keeps_every_entry_and_every_exact_choice(case, tuned_case, use):
    before = _decisions_of(case, use)
    specs = _add_config(case)
    library = use(manifest_library(case.path))
    (table,) = library.tables
    assert table is not None and table.partial
    new = {s.name for s in specs} - {s.name for s in tuned_case}
    assert len(new) == 4 and table.fit.new_kernels == new  # told from the kernel-set hash
    assert (table.fit.shapes, table.fit.shapes_whole, table.fit.buckets_kept) == (3, 3, 5)
    assert table.fit.note() == ("tuned table partial: 3 of 3 shape entries kept; 4 new kernels are "
                                "not in it: re-run `gemmgen tune` to measure them")
    after = _decisions()
    assert after == before
    assert all(source == "table" for source, *_ in after.values())
    assert not any(name in new for _, name, _ in after.values())  # the table never picks them


def _decisions_of(case, use):
    use(manifest_library(case.path))
    assert not dispatch.libraries()[0].tables[0].partial  # kernel set A: the table as tuned
    return _decisions()


def test_a_removed_config_drops_its_buckets_only_and_the_rules_serve_them(case, tuned_case, use, caplog):
    before = _decisions_of(case, use)
    specs = _remove_small(case)
    library = use(manifest_library(case.path))
    fit = library.tables[0].fit
    small = _kernel(tuned_case, "small")
    # what was added cannot be told (the table keeps its kernel set as a hash): said so
    assert fit.vanished == {small} and fit.new_kernels is None
    assert "kernels added since the tune, if any, are not in it" in fit.note()
    assert (fit.shapes, fit.shapes_whole, fit.shapes_gone, fit.buckets, fit.buckets_kept) == (3, 1, 1, 5, 3)
    assert [(key, (s.n, s.k), b.m_max) for key, s, b in fit.dropped] == [
        (KEY, (4096, 4096), 64), (KEY, (8192, 4096), 4096)]
    large = _kernel(specs, "large")
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        after = _decisions()
    for (m, n, k), decision in after.items():
        # (5000, 4096)'s nearest measured shape is (4096, 4096); (7000, 4096)'s is (8192, 4096)
        hole = (n, k) in ((4096, 4096), (5000, 4096)) and 8 < m <= 64 or (n, k) in ((8192, 4096), (7000, 4096))
        if hole:  # the rules (now: `true` -> large) serve the dropped bucket's M range
            assert decision == ("rule", large, RuntimeKnobs()), (m, n, k)
        else:     # every other bucket: exactly what the table said before
            assert decision == before[(m, n, k)], (m, n, k)
    choice = _choose(20)
    assert choice.source == "rule" and choice.rule_index == 0
    assert (f"measured shape (n=4096, k=4096): bucket m <= 64 (line {fit.dropped[0][2].line}) "
            f"names {small}, which is not a kernel of this library, so the rules serve this M range; "
            f"rule 1 of 1 ({case.path}:") in choice.reason
    # (7000, 4096)'s nearest measured shape is (8192, 4096), whose only bucket is gone
    assert "nearest measured shape (n=8192, k=4096)" in _choose(3, 7000).reason
    warnings = [r.getMessage() for r in caplog.records if "so the rules serve" in r.getMessage()]
    assert warnings and all("re-run `gemmgen tune`" in w for w in warnings)
    assert len(warnings) == len(set(warnings))  # each once


def test_split_k_on_a_kernel_that_lost_split_k_is_a_hole(tmp_path):
    names = ("k_small", "k_split")
    shape = ShapeEntry(4096, 14336, (Bucket(8, "k_split", RuntimeKnobs(split_k_slices=4)),
                                     Bucket(4096, "k_small", RuntimeKnobs())))
    path = tmp_path / "t.tuned.yaml"
    meta = {"library": "demo", "arch": "sm80", "gpu": GPU[0], "sm_count": GPU[1]}
    tuned_specs = [SimpleNamespace(name=n, split_k=n == "k_split") for n in names]
    lost = [SimpleNamespace(name=n, split_k=False) for n in names]
    # another kernel set (the manifest changed): the split_k bucket becomes a hole
    path.write_text(render_table({**meta, "kernel_set": "0" * 16}, [ClassTable(KEY, (shape,))]))
    fitted = fit_table(load_table(path), lost)
    (bucket,) = [b for _, _, b in fitted.fit.dropped]
    assert bucket.m_max == 8 and "asks split_k 4 of k_split, which is built without split-K" in bucket.dropped
    assert fitted.classes[KEY].lookup(4, 4096, 14336).dropped == bucket.dropped
    assert fitted.classes[KEY].lookup(100, 4096, 14336).bucket.kernel == "k_small"
    # with split-K the bucket fits
    assert not fit_table(load_table(path), tuned_specs).fit.dropped
    # the kernel set it was tuned for: an inconsistent table is an error (file:line), as before
    path.write_text(render_table({**meta, "kernel_set": kernel_set_hash(names)}, [ClassTable(KEY, (shape,))]))
    with pytest.raises(ManifestError, match="k_split was built without split-K"):
        load_table(path, known_kernels=names, split_k_kernels=())
    assert _load_tuned_table(path, lost) is None          # warned, the rules serve
    assert _load_tuned_table(path, tuned_specs).fit is None  # the table as tuned


def test_a_partial_table_measured_on_another_gpu_is_not_used(case, tuned_case, use, caplog):
    """A GPU with another SM count gets the rules; one with the same SM count (same arch: the
    H100 and the H200) the table measured on the other, said once."""
    _add_config(case)
    library = use(manifest_library(case.path), gpu=("NVIDIA H100 PCIe", 114))
    assert library.tables[0].partial
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        choice = _choose(4)
    assert choice.source == "rule" and "tuned table not used: the tuned tables were measured on NVIDIA H200" in choice.reason
    assert any("are not used" in r.getMessage() for r in caplog.records)


def test_a_table_of_a_gpu_of_the_same_sm_count_serves_another(case, tuned_case, use, caplog):
    library = use(manifest_library(case.path), gpu=("NVIDIA H100 80GB HBM3", 132))
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        choice = _choose(4)
        _choose(5)
    assert choice.source == "table" and "measured on NVIDIA H200, a GPU of the same arch and SM count" in choice.reason
    notes = [r.getMessage() for r in caplog.records if "no table was measured on" in r.getMessage()]
    assert len(notes) == 1 and "NVIDIA H100 80GB HBM3" in notes[0] and library.tables[0].path in notes[0]


def test_explain_says_the_table_is_partial(case, tuned_case, use):
    _remove_small(case)
    use(manifest_library(case.path))
    text = dispatch.explain("scaled_mm", a_dtype="int8", out_dtype="bf16",
                            epilogue="ScaledEpilogueBias", m=4, n=4096, k=4096)
    assert "tuned table (" in text and "partial: 1 of 3 shape entries kept whole, 1 in part, 1 not at all" in text


# ------------------------------------------------------------------ build, validate, list

def test_build_publishes_a_partial_table_with_a_one_line_note(case, tuned_case):
    specs = _add_config(case)
    logged = []
    published = tuned_tables_text(case.path, specs, logged.append)
    assert published == {"tuned.yaml": table_path_for(case.path).read_text()}  # as measured
    assert logged == ["gemmgen: note: manifest.tuned.yaml: tuned table partial: 3 of 3 shape entries "
                      "kept; 4 new kernels are not in it: re-run `gemmgen tune` to measure them"]


def test_build_does_not_publish_a_table_with_nothing_left(case, tuned_case):
    renamed = case.text.replace("tile: [64, 64, 128]", "tile: [64, 32, 128]").replace(
        "tile: [128, 128, 128]", "tile: [128, 64, 128]")
    case.text = renamed
    specs = expand(load_manifest(case.write()))
    logged = []
    assert tuned_tables_text(case.path, specs, logged.append) == {}
    assert len(logged) == 1 and "none of its 5 buckets fits" in logged[0] and "not published" in logged[0]


def test_validate_reports_a_partial_table(case, tuned_case, capsys):
    _add_config(case)
    assert cli_main(["validate", str(case.path)]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(
        "tuned table manifest.tuned.yaml: partial: 3 of 3 shape entries kept; 4 new kernels are not "
        "in it: re-run `gemmgen tune` to measure them")


def test_list_dispatch_names_the_dropped_buckets(case, tuned_case, capsys):
    small = _kernel(tuned_case, "small")
    _remove_small(case)
    assert cli_main(["list", "--dispatch", "--manifests", str(case.path)]) == 0
    out = capsys.readouterr().out
    assert "partial: 1 of 3 shape entries kept whole, 1 in part, 1 not at all" in out
    dropped = [line for line in out.splitlines() if line.startswith("    dropped: ")]
    assert len(dropped) == 2 and all(small in line and "the rules serve that M range" in line
                                     for line in dropped)
    assert "scaled_mm int8 bf16 ScaledEpilogueBias (n=4096, k=4096): bucket m <= 64" in dropped[0]


def test_a_table_listing_its_kernel_set_counts_new_kernels_exactly(case):
    """Tables `gemmgen tune` writes now list the kernel set they were tuned for: the kernels a
    later manifest adds are counted exactly, also when a config was removed at the same time
    (where the hash alone cannot confirm a guess)."""
    specs = expand(load_manifest(case.write()))
    small, large = _kernel(specs, "small"), _kernel(specs, "large")
    meta = {"library": "demo", "arch": "sm90a", "gpu": GPU[0], "sm_count": GPU[1],
            "kernel_set": kernel_set_hash(s.name for s in specs),
            "kernels": sorted(s.name for s in specs)}
    shapes = (ShapeEntry(4096, 4096, (Bucket(64, small, RuntimeKnobs()),
                                      Bucket(4096, large, RuntimeKnobs()))),)
    path = table_path_for(case.path)
    path.write_text(render_table(meta, [ClassTable(KEY, shapes)]))
    assert load_table(path).metadata["kernels"] == meta["kernels"]  # round trip
    before = {s.name for s in specs}
    _add_config(case)
    after = _remove_small(case)
    added = {s.name for s in after} - before
    fit = fit_table(load_table(path), after).fit
    assert added and fit.new_kernels == added
