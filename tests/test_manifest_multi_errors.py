"""A manifest's independent errors are reported together (ManifestErrors), each at its file:line
and key, without the errors that only follow from another one (cascades).

Units (see gemmgen/generator/manifest.py): the top-level keys, `library`, `arch`,
`kernels_per_file`; per family its header (keys, op, arch), its name, each dtypes entry /
epilogues item / exclude entry / schemes (the variants), each config entry, each dispatch rule.
Inside a unit the first error still ends it.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from gemmgen import families as registry
from gemmgen.cli import main as cli_main
from gemmgen.errors import ManifestError, ManifestErrors
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest

SM90 = """\
library: demo
arch: sm90a
kernels_per_file: 4
families:
  - name: int8
    op: scaled_mm
    dtypes:
      - a: int8
        d: [bf16, fp16]
    epilogues: [ScaledEpilogue, ScaledEpilogueBias]
    configs:
      - name: small
        tile: [64, 64, 128]
        cluster: [1, 1, 1]
        schedule: warpspecialized
      - name: large
        tile: [128, 128, 128]
        cluster: [2, 1, 1]
        schedule: pingpong
    dispatch:
      - when: "m <= 64"
        use: small
      - when: "true"
        use: large
  - name: fp8
    op: scaled_mm
    dtypes:
      - a: e4m3
        d: bf16
    epilogues: [ScaledEpilogue]
    configs:
      - name: mid
        tile: [128, 64, 128]
        cluster: [1, 1, 1]
        schedule: pingpong
      - name: big
        tile: [128, 256, 128]
        cluster: [2, 1, 1]
        schedule: cooperative
    dispatch:
      - when: "n <= 64"
        use: mid
      - when: "true"
        use: big
"""

SM80 = """\
library: demo80
arch: sm80
families:
  - name: int8
    op: scaled_mm
    dtypes:
      - a: int8
        d: [bf16, fp16]
    epilogues: [ScaledEpilogue, ScaledEpilogueBias]
    configs:
      - name: small
        tile: [64, 64, 64]
        warp: [32, 32, 64]
        stages: 4
      - name: large
        tile: [128, 128, 64]
        warp: [64, 64, 64]
        stages: 5
    dispatch:
      - when: "m <= 64"
        use: small
      - when: "true"
        use: large
"""

MIXED = """\
library: mixed
arch: sm90a
families:
  - name: mixed
    op: mixed_mm
    dtypes:
      - a: bf16
        w: int4
    schemes: [scale, scale_zero]
    configs:
      - name: decode
        tile: [128, 16, 64]
        cluster: [1, 1, 1]
        schedule: warpspecialized
      - name: prefill
        tile: [128, 128, 64]
        cluster: [2, 1, 1]
        schedule: cooperative
    dispatch:
      - when: "m <= 16"
        use: decode
      - when: "true"
        use: prefill
"""


def _edit(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _line(text: str, needle: str) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def _errors(tmp_path: Path, text: str) -> tuple[Path, ManifestErrors]:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    with pytest.raises(ManifestErrors) as info:
        load_manifest(path)
    return path, info.value


def _where(text: str, err: ManifestErrors) -> list[tuple[int, str]]:
    return [(e.line, e.key) for e in err.errors]


# three independent mistakes in the sm90a manifest: a dtype of family int8, a rule of family
# int8, a tile of config `mid` of family fp8 (that family's rule `use: mid` must not cascade)
THREE = [("      - a: int8\n", "      - a: int4\n"),
         ("tile: [128, 64, 128]", "tile: [96, 64, 128]"),
         ('when: "m <= 64"', 'when: "batch <= 64"')]


def test_three_independent_mistakes_are_all_reported(tmp_path):
    text = _edit(SM90, *THREE)
    path, err = _errors(tmp_path, text)
    # sorted by line: family int8's dtype and rule, then family fp8's config
    assert _where(text, err) == [(_line(text, "a: int4"), "a"),
                                 (_line(text, 'when: "batch <= 64"'), "when"),
                                 (_line(text, "tile: [96,"), "tile")], str(err)
    a, when, tile = err.errors
    assert a.detail == "unknown value 'int4'; expected one of int8, e4m3"
    assert tile.detail.startswith("tile M must be 64, 128, 192 or 256")
    assert when.detail.startswith("unknown variable 'batch' in dispatch condition 'batch <= 64'")
    # the exception itself is the first error, and a ManifestError / ValueError as before
    assert isinstance(err, ManifestError) and isinstance(err, ValueError)
    assert (err.file, err.line, err.key, err.detail) == (str(path), a.line, "a", a.detail)
    lines = str(err).splitlines()
    assert lines == [f"{path}:{e.line}: {e.key}: {e.detail}" for e in err.errors]
    assert lines[0] == f"{path}:{err.line}: {err.key}: {err.detail}"


@pytest.mark.parametrize("match", [r"unknown value 'int4'", r"tile M must be 64",
                                   r"unknown variable 'batch'"])
def test_pytest_raises_match_finds_every_error(tmp_path, match):
    path = tmp_path / "manifest.yaml"
    path.write_text(_edit(SM90, *THREE))
    with pytest.raises(ManifestError, match=match):
        expand(load_manifest(path))


def test_cli_validate_prints_every_error(tmp_path, capsys):
    text = _edit(SM90, *THREE)
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    assert cli_main(["validate", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert lines == [
        f"gemmgen: error: {path}:{_line(text, 'a: int4')}: a: unknown value 'int4'; expected one "
        f"of int8, e4m3",
        f"{path}:{_line(text, 'batch <= 64')}: when: unknown variable 'batch' in dispatch "
        f"condition 'batch <= 64'; allowed: m, n, k (at column 1)",
        f"{path}:{_line(text, 'tile: [96,')}: tile: tile M must be 64, 128, 192 or 256 (a wgmma "
        f"is 64 rows); got 96",
    ]


@pytest.mark.parametrize("base, old, new, key", [
    (SM90, "tile: [128, 64, 128]", "tile: [96, 64, 128]", "tile"),
    (SM90, "      - a: int8\n", "      - a: int4\n", "a"),
    (SM90, 'when: "m <= 64"', 'when: "batch <= 64"', "when"),
    (SM90, "library: demo", "library: Demo", "library"),
    (SM80, "stages: 4", "stages: 1", "stages"),
    (MIXED, "w: int4", "w: int2", "w"),
], ids=["sm90-tile", "sm90-dtype", "sm90-rule", "library", "sm80-stages", "mixed-weight"])
def test_one_mistake_is_one_error(tmp_path, base, old, new, key):
    text = _edit(base, (old, new))
    path, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, new.strip().split("\n")[-1]), key)], str(err)
    assert len(str(err).splitlines()) == 1
    assert str(err) == str(err.errors[0])


def test_fatal_errors_are_one_error_too(tmp_path):
    path, err = _errors(tmp_path, "library: demo\narch: [\n")
    assert [(e.line, e.key) for e in err.errors] == [(2, "yaml")]
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ManifestErrors) as info:
        load_manifest(missing)
    assert [(e.line, e.key) for e in info.value.errors] == [(None, "file")]
    assert str(info.value) == str(info.value.errors[0]) == f"{missing}: file: " + \
        info.value.detail


def test_sm80_family_reports_every_error(tmp_path):
    text = _edit(SM80, ("d: [bf16, fp16]", "d: [bf16, fp32]"), ("stages: 5", "stages: 12"),
                 ('when: "m <= 64"', 'when: "m <= "'))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "d: [bf16, fp32]"), "d"),
                                 (_line(text, "stages: 12"), "stages"),
                                 (_line(text, 'when: "m <= "'), "when")], str(err)
    assert "unknown output dtype 'fp32'" in err.errors[0].detail
    assert "expected an integer in [2, 10]" in err.errors[1].detail
    assert "syntax error" in err.errors[2].detail


def test_mixed_family_reports_every_error(tmp_path):
    text = _edit(MIXED, ("w: int4", "w: int2"), ("tile: [128, 16, 64]", "tile: [128, 12, 64]"),
                 ('when: "m <= 16"', 'when: "batch <= 16"'))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "w: int2"), "w"),
                                 (_line(text, "tile: [128, 12,"), "tile"),
                                 (_line(text, "batch <= 16"), "when")], str(err)
    assert "unknown value 'int2'" in err.errors[0].detail
    assert "multiple of 8" in err.errors[1].detail


def test_mixed_configs_without_variants_skip_the_smem_estimate(tmp_path):
    # a shared-memory estimate needs the variants: with a broken `schemes` it is not made (it
    # could be wrong), but a config's other rules are checked
    big = _edit(MIXED, ("schemes: [scale, scale_zero]", "schemes: [zero]"),
                ("        schedule: cooperative\n", "        schedule: cooperative\n        stages: 16\n"))
    _, err = _errors(tmp_path, big)
    assert _where(big, err) == [(_line(big, "schemes:"), "schemes")], str(err)
    fixed = _edit(big, ("schemes: [zero]", "schemes: [scale]"))
    _, err = _errors(tmp_path, fixed)
    assert _where(fixed, err) == [(_line(fixed, "stages: 16"), "stages")], str(err)


def test_variant_mistakes_of_one_family_are_independent(tmp_path):
    # an unknown dtype and an unknown epilogue: two errors; how they combine is not checked
    text = _edit(SM90, ("      - a: int8\n", "      - a: int4\n"),
                 ("[ScaledEpilogue, ScaledEpilogueBias]", "[ScaledEpilogue, ScaledEpilogueGelu]"))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "a: int4"), "a"),
                                 (_line(text, "ScaledEpilogueGelu"), "epilogues")], str(err)


def test_first_error_of_a_unit_ends_it(tmp_path):
    # two mistakes in one config entry, two in one rule: one error each
    text = _edit(SM90, ("tile: [128, 64, 128]", "tile: [96, 64, 128]"),
                 ("schedule: pingpong\n      - name: big", "schedule: pingpang\n      - name: big"),
                 ('when: "m <= 64"\n        use: small', 'when: "x <= 64"\n        use: nothing'))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "x <= 64"), "when"),
                                 (_line(text, "schedule: pingpang"), "schedule")], str(err)


def test_no_cascades(tmp_path):
    # a config that fails: rules that `use` it (by name or keys) are not looked up
    text = _edit(SM90, ("tile: [64, 64, 128]", "tile: [64, 64, 100]"),
                 ("use: large", "use: {tile: [128, 128, 128]}"))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "tile: [64, 64, 100]"), "tile")], str(err)
    # a rule whose condition fails: the table (gaps, unreachable rules) is not checked
    text = _edit(SM90, ('when: "true"\n        use: large', 'when: "m <= "\n        use: large'))
    _, err = _errors(tmp_path, text)
    assert [e.key for e in err.errors] == ["when"] and "syntax error" in err.detail, str(err)
    # an unknown arch: no family is read (each depends on it)
    text = _edit(SM90, ("arch: sm90a", "arch: sm75"), ("tile: [64, 64, 128]", "tile: [64, 64, 100]"))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(2, "arch")], str(err)
    # a misspelt family key: the missing one it stands for is not reported, nor the family read
    text = _edit(SM90, ("    epilogues: [ScaledEpilogue]\n", "    epilogue: [ScaledEpilogue]\n"))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "epilogue: [ScaledEpilogue]"), "epilogue")], str(err)
    # an op this arch does not build: nothing else of that family
    text = _edit(SM80, ("op: scaled_mm", "op: grouped_matmul_swiglu_quant"))
    _, err = _errors(tmp_path, text)
    assert [e.key for e in err.errors] == ["op"], str(err)


def test_an_unknown_key_does_not_stop_the_rest(tmp_path):
    text = _edit(SM90, ("kernels_per_file: 4\n", "kernels_per_file: 4\noptimise: 3\n"),
                 ("    op: scaled_mm\n    dtypes:\n      - a: e4m3",
                  "    op: scaled_mm\n    opt_level: 2\n    dtypes:\n      - a: e4m3"),
                 ("tile: [128, 256, 128]", "tile: [128, 256, 100]"))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "optimise: 3"), "optimise"),
                                 (_line(text, "opt_level: 2"), "opt_level"),
                                 (_line(text, "tile: [128, 256, 100]"), "tile")], str(err)


def test_errors_are_sorted_by_line(tmp_path):
    # kernels_per_file at the end of the file is checked before the families, yet listed last;
    # a duplicate family name lies between
    text = _edit(SM90, ("kernels_per_file: 4\n", ""), ("library: demo", "library: Demo"),
                 ("name: fp8", "name: int8")) + "kernels_per_file: 0\n"
    second = [i for i, line in enumerate(text.splitlines(), 1) if line == "  - name: int8"][1]
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(1, "library"), (second, "name"),
                                 (_line(text, "kernels_per_file: 0"), "kernels_per_file")], str(err)
    assert "duplicate family name 'int8'" in err.errors[1].detail


def test_duplicates_among_configs_are_each_reported(tmp_path):
    text = _edit(SM90, ("        schedule: cooperative\n",
                        "        schedule: cooperative\n"
                        "      - name: big2\n        tile: [128, 256, 128]\n        cluster: [2, 1, 1]\n"
                        "        schedule: cooperative\n        raster: along_n\n"
                        "      - name: mid\n        tile: [256, 128, 128]\n        cluster: [2, 1, 1]\n"
                        "        schedule: cooperative\n"))
    _, err = _errors(tmp_path, text)
    assert _where(text, err) == [(_line(text, "- name: big2"), "configs"),
                                 (_line(text, "tile: [256, 128, 128]") - 1, "name")], str(err)


def test_demo_family_skips_configs_when_its_variants_fail(tmp_path):
    # a family that declares no `configs_need_variants = False`: its configs are not checked
    # without variants (they may depend on them), its rules' conditions still are
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # as tests/test_family_plugin.py
    import family_demo
    registry.register(family_demo.FAMILY)
    try:
        text = ("library: demo\narch: sm90a\nfamilies:\n  - name: axpy\n    op: axpby\n"
                "    dtypes: [{x: fp64, out: fp32}]\n    configs:\n"
                "      - {name: narrow, block: 100, vector: 2}\n    dispatch:\n"
                "      - {when: \"m <= 8\", use: narrow}\n      - {when: \"true\", use: narrow}\n")
        _, err = _errors(tmp_path, text)
        assert _where(text, err) == [(6, "x"), (10, "when")], str(err)
    finally:
        registry.unregister("demo_axpby")


def test_manifest_errors_pickle(tmp_path):
    _, err = _errors(tmp_path, _edit(SM90, *THREE))
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ManifestErrors and str(again) == str(err)
    assert [(e.line, e.key) for e in again.errors] == [(e.line, e.key) for e in err.errors]


def test_expand_errors_stay_single(tmp_path):
    # expand()'s duplicate-kernel / dispatch-ownership checks run on a valid manifest: fail-fast
    text = SM90 + _edit(SM90.split("families:\n", 1)[1], ("name: int8", "name: again"),
                        ("name: fp8", "name: fp8b"))
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    manifest = load_manifest(path)
    with pytest.raises(ManifestError) as info:
        expand(manifest)
    assert not isinstance(info.value, ManifestErrors)
