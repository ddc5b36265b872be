"""Manifest validation: every error is a ManifestError naming file, exact line and key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gemmgen import settings
from gemmgen.errors import ManifestError
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest


def assert_manifest_error(case, *, key: str, needle: str | None, match: str,
                          line: int | None = None) -> ManifestError:
    """Load + expand `case`; assert a ManifestError at the line of `needle` with `key`."""
    path = case.write()
    with pytest.raises(ManifestError, match=match) as info:
        expand(load_manifest(path))
    err = info.value
    expected_line = line if line is not None else case.line(needle)
    assert Path(err.file).resolve() == path.resolve()
    assert err.key == key, str(err)
    assert err.line == expected_line, str(err)
    assert str(err).startswith(f"{err.file}:{expected_line}: {key}: "), str(err)
    assert err.detail and err.detail in str(err)
    assert isinstance(err, ValueError)  # ManifestError is also a ValueError
    return err


# (id, [(old, new), ...], key, needle of the offending line, message regex)
CASES = [
    # ---- unknown keys
    ("unknown-top-level-key", [("arch: sm90a\n", "arch: sm90a\noptimise: 3\n")],
     "optimise", "optimise: 3", r"unknown key in manifest; allowed keys: arch, families, "
                                r"kernels_per_file, library"),
    ("unknown-family-key", [("    op: scaled_mm\n", "    op: scaled_mm\n    opt_level: 3\n")],
     "opt_level", "opt_level: 3", r"unknown key in families\[0\]"),
    ("unknown-config-key", [("        stages: auto\n", "        stages: auto\n        split_k: 2\n")],
     "split_k", "split_k: 2", r"unknown key in configs\[1\]; allowed keys: .*swap_ab"),
    ("unknown-dtype-key", [("        acc: int32\n", "        acc: int32\n        c: int8\n")],
     "c", "c: int8", r"unknown key in dtypes\[0\]"),
    ("unknown-rule-key", [('      - when: "true"\n', '      - when: "true"\n        if: 1\n')],
     "if", "if: 1", r"unknown key in dispatch\[1\]"),
    # ---- unknown values
    ("unknown-dtype", [("      - a: int8\n", "      - a: int4\n")],
     "a", "a: int4", r"unknown value 'int4'; expected one of int8, e4m3"),
    ("unknown-out-dtype", [("d: [bf16, fp16]", "d: [bf16, fp32]")],
     "d", "d: [bf16, fp32]", r"unknown output dtype 'fp32'; expected one of bf16, fp16"),
    ("unknown-epilogue", [("[ScaledEpilogue, ScaledEpilogueBias]", "[ScaledEpilogue, ScaledEpilogueGelu]")],
     "epilogues", "ScaledEpilogueGelu", r"unknown epilogue 'ScaledEpilogueGelu'; expected one of "
                                        r"ScaledEpilogue, ScaledEpilogueBias"),
    ("unknown-epilogue-block-list",
     [("    epilogues: [ScaledEpilogue, ScaledEpilogueBias]\n",
       "    epilogues:\n      - ScaledEpilogue\n      - ScaledEpilogueGelu\n")],
     "epilogues", "- ScaledEpilogueGelu", r"unknown epilogue 'ScaledEpilogueGelu'"),
    ("unknown-schedule", [("schedule: pingpong", "schedule: pingpang")],
     "schedule", "schedule: pingpang", r"unknown value 'pingpang'; expected one of "
                                       r"warpspecialized, pingpong, cooperative"),
    ("unknown-tile-scheduler", [("        stages: auto\n", "        stages: auto\n        tile_scheduler: splitk\n")],
     "tile_scheduler", "tile_scheduler: splitk", r"unknown value 'splitk'; expected one of persistent, streamk"),
    ("unknown-raster", [("        stages: auto\n", "        stages: auto\n        raster: diagonal\n")],
     "raster", "raster: diagonal", r"unknown value 'diagonal'"),
    ("unknown-swizzle", [("        stages: auto\n", "        stages: auto\n        swizzle: 3\n")],
     "swizzle", "swizzle: 3", r"unknown value 3; expected one of 1, 2, 4, 8"),
    ("unknown-arch", [("arch: sm90a", "arch: sm75")], "arch", "arch: sm75", r"unknown value 'sm75'"),
    ("unknown-op", [("op: scaled_mm", "op: gemm")], "op", "op: gemm", r"unknown value 'gemm'"),
    ("bad-library-name", [("library: demo", "library: Demo-1")],
     "library", "library: Demo-1", r"expected a lowercase identifier, got 'Demo-1'"),
    ("bad-kernels-per-file", [("kernels_per_file: 4", "kernels_per_file: 0")],
     "kernels_per_file", "kernels_per_file: 0", r"expected an integer in \[1, 16\], got 0"),
    ("bad-swap-ab", [("swap_ab: true", "swap_ab: yes please")],
     "swap_ab", "swap_ab: yes please", r"expected true or false, got 'yes please'"),
    ("bad-stages-value", [("stages: auto", "stages: 1")],
     "stages", "stages: 1", r"expected 'auto' or an integer in \[2, 16\], got 1"),
    ("tile-not-a-triple", [("tile: [128, 128, 128]", "tile: [128, 128]")],
     "tile", "tile: [128, 128]", r"expected three integers \[M, N, K\], got \[128, 128\]"),
    # ---- tile legality
    ("tile-m-not-multiple-of-64", [("tile: [128, 128, 128]", "tile: [96, 128, 128]")],
     "tile", "tile: [96,", r"tile M must be 64, 128, 192 or 256 .*got 96"),
    ("tile-m-over-256", [("tile: [128, 128, 128]", "tile: [320, 128, 128]")],
     "tile", "tile: [320,", r"tile M must be 64, 128, 192 or 256 .*got 320"),
    ("tile-n-not-multiple-of-16", [("tile: [128, 128, 128]", "tile: [128, 24, 128]")],
     "tile", "tile: [128, 24,", r"tile N must be a multiple of 16 in \[16, 256\]; got 24"),
    ("tile-n-over-256", [("tile: [128, 128, 128]", "tile: [128, 272, 128]")],
     "tile", "tile: [128, 272,", r"tile N must be a multiple of 16 in \[16, 256\]; got 272"),
    ("tile-k-not-multiple-of-64", [("tile: [128, 128, 128]", "tile: [128, 128, 96]")],
     "tile", "tile: [128, 128, 96]", r"tile K must be 64, 128, 192 or 256 .*got 96"),
    ("tile-k-over-256", [("tile: [128, 128, 128]", "tile: [128, 128, 512]")],
     "tile", "tile: [128, 128, 512]", r"tile K must be .*got 512"),
    # ---- cluster legality
    ("cluster-not-power-of-two", [("cluster: [2, 1, 1]", "cluster: [3, 1, 1]")],
     "cluster", "cluster: [3, 1, 1]", r"cluster M must be a power of two >= 1; got 3"),
    ("cluster-zero", [("cluster: [2, 1, 1]", "cluster: [2, 0, 1]")],
     "cluster", "cluster: [2, 0, 1]", r"cluster N must be a power of two >= 1; got 0"),
    ("cluster-over-16-ctas", [("cluster: [2, 1, 1]", "cluster: [8, 4, 1]")],
     "cluster", "cluster: [8, 4, 1]", r"a cluster holds at most 16 CTAs; got 8x4x1 = 32"),
    ("cluster-k-not-1", [("cluster: [2, 1, 1]", "cluster: [1, 1, 2]")],
     "cluster", "cluster: [1, 1, 2]", r"cluster K must be 1 on sm90; got 2"),
    # ---- schedule pairings
    ("cooperative-tile-m-64", [("schedule: warpspecialized", "schedule: cooperative")],
     "schedule", "schedule: cooperative", r"cooperative .* tile M must be a multiple of 128; got 64"),
    ("streamk-without-cooperative",
     [("        stages: auto\n", "        stages: auto\n        tile_scheduler: streamk\n")],
     "tile_scheduler", "tile_scheduler: streamk", r"stream-K needs the cooperative schedule; "
                                                  r"got schedule 'pingpong'"),
    ("epilogue-schedule-mispaired",
     [("        stages: auto\n",
       "        stages: auto\n        epilogue_schedule: tma_warpspecialized_cooperative\n")],
     "epilogue_schedule", "epilogue_schedule:", r"schedule 'pingpong' pairs with epilogue schedule "
                                                r"'tma_warpspecialized'; got "
                                                r"'tma_warpspecialized_cooperative'"),
    # ---- shared memory
    ("stages-over-smem-limit", [("tile: [128, 128, 128]", "tile: [256, 256, 256]"),
                                ("stages: auto", "stages: 8")],
     "stages", "stages: 8", r"8 stages of tile 256x256x256 need about 8 x 131088 \+ \d+ "
                            r"\(epilogue\) = \d+ bytes of shared memory, over the sm90 limit of "
                            r"232448; use fewer stages or a smaller tile"),
    ("stages-one-over-limit", [("stages: auto", "stages: 7")],
     "stages", "stages: 7", r"7 stages of tile 128x128x128 need about 7 x 32784 .* = 240752 bytes"),
    ("auto-stages-tile-too-big", [("tile: [128, 128, 128]", "tile: [256, 256, 256]")],
     "stages", "stages: auto", r"the minimum of 2 stages \(stages: auto\) of tile 256x256x256"),
    # ---- dtypes
    ("b-differs-from-a", [("        b: int8\n", "        b: e4m3\n")],
     "b", "b: e4m3", r"W8A8 takes the same 8-bit type for a and b; got a='int8', b='e4m3'"),
    ("wrong-acc", [("acc: int32", "acc: fp32")],
     "acc", "acc: fp32", r"int8 accumulates in int32; got 'fp32'"),
    # ---- exclusions
    ("exclude-matches-nothing",
     [("    configs:\n", "    exclude:\n      - {a: e4m3, epilogue: ScaledEpilogueAzp}\n    configs:\n")],
     "exclude", "- {a: e4m3", r"this exclusion matches no dtype/epilogue combination"),
    ("second-exclude-matches-nothing",
     [("    configs:\n", "    exclude:\n      - {d: fp16, epilogue: ScaledEpilogueBias}\n"
                          "      - {d: fp8}\n    configs:\n")],
     "exclude", "- {d: fp8}", r"this exclusion matches no dtype/epilogue combination"),
    ("azp-with-e4m3-without-exclude",
     [("        d: [bf16, fp16]\n", "        d: [bf16, fp16]\n      - {a: e4m3, d: bf16}\n"),
      ("[ScaledEpilogue, ScaledEpilogueBias]", "[ScaledEpilogue, ScaledEpilogueAzp]")],
     "epilogues", "epilogues:", r"ScaledEpilogueAzp needs int8 activations .* dtypes include "
                                r"a=e4m3; drop the pair with `exclude: \[\{a: e4m3, epilogue: "
                                r"ScaledEpilogueAzp\}\]`"),
    # ---- dispatch `use`
    ("use-missing-name", [("use: large", "use: huge")],
     "use", "use: huge", r"no config named 'huge' in this family; names: small, large"),
    ("use-missing-keys", [("use: large", "use: {tile: [256, 128, 128]}")],
     "use", "use: {tile: [256", r"names a config that is not built in this family: "
                                r"\{'tile': \[256, 128, 128\]\}"),
    ("use-ambiguous", [("use: large", "use: {stages: auto}")],
     "use", "use: {stages: auto}", r"matches 2 configs \(lines 14, 19\); add keys or use a config name"),
    ("use-unknown-key", [("use: large", "use: {tiles: [128, 128, 128]}")],
     "tiles", "use: {tiles:", r"unknown config key in dispatch `use`"),
    ("use-not-a-name-or-mapping", [("use: large", "use: [128, 128, 128]")],
     "use", "use: [128, 128, 128]", r"expected a config name or a mapping of config keys"),
    # ---- dispatch conditions
    ("condition-unknown-variable", [('when: "m <= 64"', 'when: "batch <= 64"')],
     "when", 'when: "batch <= 64"', r"unknown variable 'batch' in dispatch condition "
                                    r"'batch <= 64'; allowed: m, n, k"),
    ("condition-arithmetic", [('when: "m <= 64"', 'when: "m * 2 <= 128"')],
     "when", 'when: "m * 2 <= 128"', r"arithmetic 'm \* 2' is not allowed"),
    ("condition-syntax", [('when: "m <= 64"', 'when: "m <= "')],
     "when", 'when: "m <= "', r"syntax error"),
    ("condition-not-a-string", [('when: "m <= 64"', "when: 64")],
     "when", "when: 64", r"expected a condition string such as 'm <= 16', got 64"),
    ("dispatch-gap", [('when: "m <= 64"', 'when: "m <= 16"'),
                      ('      - when: "true"\n        use: large\n', "")],
     "dispatch", "    dispatch:", r"no dispatch rule matches m=17, n=1, k=1 \(rules cover only: "
                                  r"'m <= 16'\); add a rule or end the table with 'true'"),
    ("dispatch-unreachable-after-true", [("        use: large\n",
                                          '        use: large\n      - when: "m <= 8"\n'
                                          "        use: small\n")],
     "when", 'when: "m <= 8"', r"rule 2 \('m <= 8'\) can never be chosen: earlier rules cover "
                               r"every problem it matches"),
    ("dispatch-unreachable-shadowed", [('      - when: "true"\n',
                                        '      - when: "m <= 32 and n <= 64"\n        use: large\n'
                                        '      - when: "true"\n')],
     "when", 'when: "m <= 32 and n <= 64"', r"rule 1 \('m <= 32 and n <= 64'\) can never be chosen"),
    ("dispatch-empty", [('      - when: "m <= 64"\n        use: small\n      - when: "true"\n'
                         "        use: large\n", ""), ("    dispatch:\n", "    dispatch: []\n")],
     "dispatch", "dispatch: []", r"expected a non-empty list, got \[\]"),
    # ---- duplicates
    ("duplicate-config-raster-swizzle", [("        stages: auto\n",
                                          "        stages: auto\n"
                                          "      - name: large_n\n"
                                          "        tile: [128, 128, 128]\n"
                                          "        cluster: [2, 1, 1]\n"
                                          "        schedule: pingpong\n"
                                          "        raster: along_n\n"
                                          "        swizzle: 4\n")],
     "configs", "- name: large_n", r"duplicate kernel: same compile-time config as line 19 "
                                   r"\(raster and swizzle are run-time knobs"),
    ("duplicate-config-name", [("        stages: auto\n",
                                "        stages: auto\n"
                                "      - name: small  # again\n"
                                "        tile: [256, 128, 128]\n"
                                "        cluster: [2, 1, 1]\n"
                                "        schedule: cooperative\n")],
     "name", "# again", r"config name 'small' already used at line 14"),
    # ---- missing keys
    ("missing-top-level-key", [("arch: sm90a\n", "")],
     "arch", "library: demo", r"missing required key in manifest"),
    ("missing-family-key", [("    op: scaled_mm\n", "")],
     "op", "- name: int8", r"missing required key in families\[0\]"),
    ("missing-config-key", [("        cluster: [2, 1, 1]\n", "")],
     "cluster", "- name: large", r"missing required key in configs\[1\]"),
    ("missing-dtype-key", [("        d: [bf16, fp16]\n", "")],
     "d", "- a: int8", r"missing required key in dtypes\[0\]"),
    ("missing-rule-key", [("        use: small\n", "")],
     "use", 'when: "m <= 64"', r"missing required key in dispatch\[0\]"),
    ("family-not-a-mapping", [("families:\n", "families:\n  - just a string\n")],
     "families[0]", "- just a string", r"expected a mapping \(key: value lines\) with keys op, "
                                       r"got a string 'just a string'"),
]


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("name, edits, key, needle, match", CASES, ids=_ids(CASES))
def test_manifest_error(case, name, edits, key, needle, match):
    for old, new in edits:
        case.replace(old, new)
    if needle is None:  # a bare scalar carries no line
        path = case.write()
        with pytest.raises(ManifestError, match=match) as info:
            load_manifest(path)
        assert (info.value.file, info.value.line, info.value.key) == (str(path), None, key)
        return
    assert_manifest_error(case, key=key, needle=needle, match=match)


def test_base_manifest_is_valid(case):
    manifest = case.load()
    assert manifest.library == "demo" and manifest.arch == "sm90a" and manifest.kernels_per_file == 4
    (family,) = manifest.families
    assert family.name == "int8" and family.line == case.line("- name: int8")
    assert family.combos == (("int8", "bf16", "ScaledEpilogue"), ("int8", "bf16", "ScaledEpilogueBias"),
                             ("int8", "fp16", "ScaledEpilogue"), ("int8", "fp16", "ScaledEpilogueBias"))
    assert [c.line for c in family.configs] == [case.line("- name: small"), case.line("- name: large")]
    assert [r.config_index for r in family.dispatch] == [0, 1]
    assert [r.line for r in family.dispatch] == [case.line('when: "m <= 64"'), case.line('when: "true"')]
    assert len(expand(manifest)) == 8


def test_line_numbers_are_literal(case):
    """The helper's line arithmetic, pinned once against hand-counted lines of BASE_MANIFEST."""
    case.replace("tile: [128, 128, 128]", "tile: [100, 128, 128]")
    err = assert_manifest_error(case, key="tile", needle="tile: [100", match="tile M")
    assert err.line == 20
    assert str(err) == (f"{case.path}:20: tile: tile M must be 64, 128, 192 or 256 "
                        "(a wgmma is 64 rows); got 100")


@pytest.mark.parametrize("stages", [2, 4, 6])
def test_explicit_stages_within_smem_limit(case, stages):
    case.replace("stages: auto", f"stages: {stages}")
    manifest = case.load()
    assert manifest.families[0].configs[1].config.stages == stages
    assert any(f"_s{stages}" in k.name for k in expand(manifest))


def test_azp_with_e4m3_excluded_is_accepted(case):
    case.replace("        d: [bf16, fp16]\n", "        d: [bf16, fp16]\n      - {a: e4m3, d: bf16}\n")
    case.replace("[ScaledEpilogue, ScaledEpilogueBias]", "[ScaledEpilogue, ScaledEpilogueAzp]")
    case.replace("    configs:\n", "    exclude: [{a: e4m3, epilogue: ScaledEpilogueAzp}]\n    configs:\n")
    manifest = case.load()
    combos = manifest.families[0].combos
    assert ("e4m3", "bf16", "ScaledEpilogueAzp") not in combos
    assert ("e4m3", "bf16", "ScaledEpilogue") in combos
    assert ("int8", "bf16", "ScaledEpilogueAzp") in combos
    assert len(combos) == 5  # int8 × {bf16, fp16} × 2 epilogues + e4m3 × bf16 × ScaledEpilogue
    kernels = expand(manifest)
    assert len(kernels) == 10
    assert not any(k.a == "e4m3" and k.epilogue == "ScaledEpilogueAzp" for k in kernels)


def test_exclude_by_output_dtype(case):
    case.replace("    configs:\n", "    exclude: [{d: fp16, epilogue: ScaledEpilogueBias}]\n    configs:\n")
    combos = case.load().families[0].combos
    assert ("int8", "fp16", "ScaledEpilogueBias") not in combos and len(combos) == 3


def test_exclude_dropping_every_combination(case):
    case.replace("    configs:\n", "    exclude: [{a: int8}]\n    configs:\n")
    with pytest.raises(ManifestError, match="exclu") as info:
        case.load()
    assert info.value.key == "exclude"
    assert info.value.line == case.line("exclude: [{a: int8}]")


def test_exclude_dropping_every_combination_is_still_refused(case):
    """Whatever the message, such a manifest must not load (it would build nothing)."""
    case.replace("    configs:\n", "    exclude: [{a: int8}]\n    configs:\n")
    with pytest.raises(ValueError):
        case.load()


def test_streamk_with_cooperative_is_accepted(case):
    case.replace("schedule: pingpong", "schedule: cooperative")
    case.replace("        stages: auto\n", "        stages: auto\n        tile_scheduler: streamk\n")
    config = case.load().families[0].configs[1].config
    assert config.tile_scheduler == "streamk"
    assert config.epilogue_schedule == "tma_warpspecialized_cooperative"  # the default pairing


def test_use_by_keys(case):
    case.replace("use: large", "use: {tile: [128, 128, 128], cluster: [2, 1, 1]}")
    case.replace("use: small", "use: {swap_ab: true}")
    rules = case.load().families[0].dispatch
    assert [r.config_index for r in rules] == [0, 1]


def test_yaml_true_condition(case):
    case.replace('when: "true"', "when: true")
    rules = case.load().families[0].dispatch
    assert rules[-1].condition.source == "true" and rules[-1].condition.matches(10**9, 1, 1)


def test_duplicate_family_names(case, fp8_family):
    case.append(fp8_family.replace("- name: fp8", "- name: int8"))
    path = case.write()
    with pytest.raises(ManifestError, match=r"duplicate family name 'int8'") as info:
        load_manifest(path)
    assert (info.value.file, info.value.key) == (str(path), "name")
    assert info.value.line == 29  # the second `- name: int8` (BASE_MANIFEST has 28 lines)
    assert case.text.splitlines()[28] == "  - name: int8"


def test_default_family_names(case):
    case.replace("  - name: int8\n    op: scaled_mm\n", "  - op: scaled_mm\n")
    assert case.load().families[0].name == "family0"


def _overlapping_family(case, fp8_family):
    case.append(fp8_family.replace("- name: fp8", "- name: int8_again")
                .replace("      - a: e4m3\n", "      - a: int8\n"))
    return case


def test_two_families_provide_the_same_combination(case, fp8_family):
    _overlapping_family(case, fp8_family)
    manifest = case.load()  # each family is valid on its own; the overlap shows at expansion
    with pytest.raises(ManifestError, match=r"families 'int8' and 'int8_again' both provide "
                                            r"scaled_mm int8->bf16 with ScaledEpilogue: dispatch "
                                            r"would be ambiguous") as info:
        expand(manifest)
    err = info.value
    assert Path(err.file) == case.path.resolve() and err.key == "dtypes"
    second = case.line("- name: int8_again")
    assert second <= err.line <= second + 3  # within the second family's head


def test_two_families_overlap_reported_at_dtypes_line(case, fp8_family):
    _overlapping_family(case, fp8_family)
    with pytest.raises(ManifestError) as info:
        expand(case.load())
    dtypes_lines = [i for i, line in enumerate(case.text.splitlines(), 1) if line == "    dtypes:"]
    assert info.value.line == dtypes_lines[1]


@pytest.mark.parametrize("text, line, match", [
    ("library: demo\narch: sm90a\nfamilies:\n  - name: f\n    dtypes: [{a: int8, d: bf16\n"
     "    epilogues: [ScaledEpilogue]\n", 6, r"not valid YAML: expected ',' or '\}', but got ':'"),
    ("library: demo\narch: sm90a\nlibrary: again\n", 3, r"not valid YAML: duplicate key 'library'"),
    ("library: demo\n  arch: sm90a\n", 2, r"not valid YAML: mapping values are not allowed here"),
    ("library: demo\n\tarch: sm90a\n", 2, r"not valid YAML: .*'\\t'"),
], ids=["unclosed-flow-mapping", "duplicate-key", "bad-indent", "tab"])
def test_invalid_yaml(write_manifest, text, line, match):
    path = write_manifest(text)
    with pytest.raises(ManifestError, match=match) as info:
        load_manifest(path)
    assert (info.value.file, info.value.line, info.value.key) == (str(path), line, "yaml")
    assert str(info.value).startswith(f"{path}:{line}: yaml: ")


def test_yaml_merge_keys_read_as_yaml_does(tmp_path):
    """`<<: *base` then keys of the mapping's own: they override the merged ones (as
    yaml.safe_load reads them), with their own lines; a key the mapping spells twice itself is
    still a duplicate."""
    import yaml

    from gemmgen.generator.yaml_lines import load_yaml
    text = ("base: &base {name: small, tile: [64, 16, 256], stages: 4}\n"
            "more: &more {stages: 6, swizzle: 2}\n"
            "one:\n  <<: *base\n  name: big\n  tile: [64, 32, 256]\n"
            "two:\n  <<: [*more, *base]\n  name: other\n")
    path = tmp_path / "merge.yaml"
    path.write_text(text)
    document, _ = load_yaml(path)
    assert document == yaml.safe_load(text)
    assert document["one"] == {"name": "big", "tile": [64, 32, 256], "stages": 4}
    # (which of two merged mappings wins changed between PyYAML 6.0.3 and 6.0.4: as safe_load)
    assert document["two"]["name"] == "other" and document["two"]["swizzle"] == 2
    assert document["one"].key_lines["name"] == 5 and document["one"].key_lines["tile"] == 6
    path.write_text(text + "three:\n  <<: *base\n  name: a\n  name: b\n")
    with pytest.raises(yaml.YAMLError, match="duplicate key 'name'"):
        load_yaml(path)


@pytest.mark.parametrize("text, key, match", [
    ("", "manifest", r"the file is empty; expected a mapping with keys library, arch, families$"),
    ("- 1\n- 2\n", "manifest", r"expected a mapping .*, got a list \[1, 2\]$"),
])
def test_document_not_a_mapping(write_manifest, text, key, match):
    path = write_manifest(text)
    with pytest.raises(ManifestError, match=match) as info:
        load_manifest(path)
    assert info.value.key == key and info.value.file == str(path)
    assert info.value.line == 1


def test_missing_manifest_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ManifestError, match=r"cannot read manifest") as info:
        load_manifest(path)
    assert (info.value.file, info.value.line, info.value.key) == (str(path), None, "file")
    assert str(info.value).startswith(f"{path}: file: ")


def test_default_manifest_is_found(default_manifest):
    assert default_manifest in settings.default_manifests()
    assert default_manifest.parent == settings.DEFAULT_MANIFEST_DIR


def test_default_manifest_validates_and_expands(default_manifest):
    manifest = load_manifest(default_manifest)
    assert manifest.library == "w8a8" and manifest.arch == "sm90a"
    assert [f.name for f in manifest.families] == ["int8", "fp8"]
    kernels = expand(manifest)
    names = [k.name for k in kernels]
    int8, fp8 = manifest.families
    expected_int8 = len(int8.configs) * 2 * 4  # out dtypes x epilogues
    expected_fp8 = len(fp8.configs) * 2 * 2    # no azp epilogues for fp8
    assert len(kernels) == len(set(names)) == expected_int8 + expected_fp8
    assert sum(k.a == "int8" for k in kernels) == expected_int8
    assert sum(k.a == "e4m3" for k in kernels) == expected_fp8
    assert not any(k.a == "e4m3" and k.epilogue.startswith("ScaledEpilogueAzp") for k in kernels)
    for kernel in kernels:
        assert kernel.origin is not None and kernel.origin.file == manifest.path
        assert kernel.origin.line > 0


def test_every_default_manifest_validates():
    for path in settings.default_manifests():
        assert expand(load_manifest(path))


def test_swizzle_and_raster_knobs(case):
    case.replace("        stages: auto\n", "        stages: auto\n        raster: along_m\n        swizzle: 8\n")
    knobs = case.load().families[0].configs[1].knobs
    assert (knobs.raster, knobs.swizzle) == ("along_m", 8) and type(knobs.swizzle) is int


@pytest.mark.parametrize("value", ["2.0", "true"])
def test_swizzle_must_be_an_integer(case, value):
    case.replace("        stages: auto\n", f"        stages: auto\n        swizzle: {value}\n")
    with pytest.raises(ManifestError, match=r"unknown value"):
        case.load()


def test_epilogue_listed_twice(case):
    case.replace("[ScaledEpilogue, ScaledEpilogueBias]", "[ScaledEpilogue, ScaledEpilogue]")
    with pytest.raises(ManifestError, match=r"the same \(a, d, epilogue\) combination is listed twice"):
        case.load()


def test_output_dtype_listed_twice(case):
    case.replace("d: [bf16, fp16]", "d: [bf16, bf16]")
    with pytest.raises(ManifestError, match=r"listed twice") as info:
        case.load()
    assert (info.value.key, info.value.line) == ("dtypes", case.line("    dtypes:"))


def test_scalar_output_dtype(case):
    case.replace("d: [bf16, fp16]", "d: fp16")
    assert {d for _, d, _ in case.load().families[0].combos} == {"fp16"}


def test_family_without_dispatch_is_kernels_only(case, fp8_family):
    """A family with no `dispatch` builds kernels callable by name and never joins dispatch."""
    from gemmgen.generator.render import render_bindings
    case.append(fp8_family.replace("name: fp8", "name: fp8_candidates")
                .replace('    dispatch:\n      - when: "true"\n        use: large\n', "")
                .replace("schedule: pingpong", "schedule: cooperative")
                .replace("tile: [128, 128, 128]", "tile: [128, 256, 128]"))
    case.append(fp8_family)  # the same combination again, with dispatch: no ambiguity
    manifest = case.load()
    candidates = [f for f in manifest.families if f.name == "fp8_candidates"][0]
    assert candidates.dispatch == ()
    kernels = expand(manifest)
    namespace: dict = {}
    exec(render_bindings(manifest, kernels, "0" * 16, "libx.so"), namespace)
    assert list(namespace["DISPATCH"]) == sorted(namespace["DISPATCH"])
    assert ("scaled_mm", "e4m3", "bf16", "ScaledEpilogue") in namespace["DISPATCH"]


# ---- a scalar, a list or nothing where a mapping belongs: reported at the parent's line of it
_SM80_SPLIT = """\
library: demo80
arch: sm80
families:
  - name: int8
    op: scaled_mm
    dtypes: [{a: int8, d: bf16}]
    epilogues: [ScaledEpilogue]
    configs:
      - name: only
        tile: [128, 128, 64]
        warp: [64, 64, 64]
        stages: 5
        split_k: 4
"""

NOT_A_MAPPING = [
    ("config-entry-scalar", [("      - name: large\n        tile: [128, 128, 128]\n        cluster: [2, 1, 1]\n"
                              "        schedule: pingpong\n        stages: auto\n", "      - large\n")],
     "configs[1]", "      - large", r"expected a mapping .*with keys tile, cluster, schedule, got a "
                                   r"string 'large'$"),
    ("config-entry-empty", [("      - name: large\n        tile: [128, 128, 128]\n        cluster: [2, 1, 1]\n"
                             "        schedule: pingpong\n        stages: auto\n", "      -  # nothing\n")],
     "configs[1]", "# nothing", r"got nothing \(an empty value\)$"),
    ("config-entry-list", [("      - name: large\n        tile: [128, 128, 128]\n        cluster: [2, 1, 1]\n"
                            "        schedule: pingpong\n        stages: auto\n", "      - [128, 128]\n")],
     "configs[1]", "- [128, 128]", r"got a list \[128, 128\]$"),
    ("dtypes-entry-scalar", [("      - a: int8\n        b: int8\n        acc: int32\n        d: [bf16, fp16]\n",
                              "      - int8\n")],
     "dtypes[0]", "      - int8", r"expected a mapping .*with keys a, d, got a string 'int8'$"),
    ("dispatch-entry-scalar", [('      - when: "true"\n        use: large\n', "      - 42\n")],
     "dispatch[1]", "      - 42", r"with keys when, use, got an integer 42$"),
    ("family-entry-integer", [("families:\n", "families:\n  - 7\n")],
     "families[0]", "  - 7", r"got an integer 7$"),
    ("exclude-entry-scalar", [("    configs:\n", "    exclude: [e4m3]\n    configs:\n")],
     "exclude[0]", "exclude: [e4m3]", r"expected a mapping \(key: value lines\), got a string 'e4m3'$"),
    ("exclude-scalar", [("    configs:\n", "    exclude: 3\n    configs:\n")],
     "exclude", "exclude: 3", r"expected a non-empty list, got 3$"),
    ("use-mapping-empty", [("use: large", "use: {}")],
     "use", "use: {}", r"expected a config name or a mapping of config keys, got \{\}"),
    ("library-empty", [("library: demo", "library:")],
     "library", "library:", r"expected a lowercase identifier, got nothing \(an empty value\)$"),
    ("library-date", [("library: demo", "library: 2024-01-01")],
     "library", "library: 2024", r"expected a lowercase identifier, got 2024-01-01$"),
    ("unknown-empty-key", [("arch: sm90a\n", "arch: sm90a\n'': 1\n")],
     "''", "'': 1", r"unknown key in manifest"),
]


@pytest.mark.parametrize("name, edits, key, needle, match", NOT_A_MAPPING, ids=_ids(NOT_A_MAPPING))
def test_wrong_kind_has_a_line(case, name, edits, key, needle, match):
    for old, new in edits:
        case.replace(old, new)
    err = assert_manifest_error(case, key=key, needle=needle, match=match)
    assert not re.search(r"NoneType|Located|datetime|got (str|int|list|dict)\b", str(err))


def test_split_k_scalar_has_a_line(write_manifest):
    path = write_manifest(_SM80_SPLIT)
    with pytest.raises(ManifestError, match=r"expected a mapping .*with keys mode, slices, got an "
                                            r"integer 4$") as info:
        load_manifest(path)
    assert (info.value.file, info.value.line, info.value.key) == (str(path), 13, "split_k")


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing but a comment\n", "---\n...\n"])
def test_empty_file_is_reported_at_line_1(write_manifest, text):
    path = write_manifest(text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert str(info.value) == (f"{path}:1: manifest: the file is empty; expected a mapping with "
                               "keys library, arch, families")


@pytest.mark.parametrize("text, line, match", [
    ("library: demo\nkernels_per_file: !!int four\n", 2, r"cannot read 'four' as a value of tag !!int"),
    ("library: demo\narch: !!timestamp never\n", 2, r"cannot read 'never' as a value of tag "
                                                    r"!!timestamp$"),
    ("library: demo\n[1, 2]: x\n", 2, r"a mapping key must be a plain value"),
    ("library: demo\narch: sm\x0090a\n", 2, r"character U\+0000 is not allowed in YAML text"),
    ("library: demo\narch: sm90a\nfamilies: [\n", 3, r"expected the node content, but found "
                                                      r"'<stream end>'"),  # EOF: the last line
    ("library: demo\nfamilies:\n  - " + "[" * 1000 + "\n", 3, r"nested too deeply"),
], ids=["bad-int-tag", "bad-timestamp-tag", "list-as-key", "nul-character", "end-of-file",
        "deep-nesting"])
def test_yaml_errors_never_escape_and_have_a_line(write_manifest, text, line, match):
    path = write_manifest(text)
    with pytest.raises(ManifestError, match=match) as info:
        load_manifest(path)
    assert (info.value.file, info.value.line, info.value.key) == (str(path), line, "yaml")
    assert "NoneType" not in str(info.value) and "unicode string" not in str(info.value)


def test_non_utf8_file(tmp_path):
    path = tmp_path / "manifest.yaml"
    path.write_bytes(b"library: demo\narch: sm90\xff\n")
    with pytest.raises(ManifestError, match=r"not UTF-8 text \(byte 0xff on this line\)") as info:
        load_manifest(path)
    assert (info.value.line, info.value.key) == (2, "yaml")


def test_tuned_table_scalar_bucket_and_empty_file(tmp_path):
    from gemmgen.tuning.table import load_table
    path = tmp_path / "t.tuned.yaml"
    path.write_text("")
    with pytest.raises(ManifestError, match=r"the file is empty; expected a mapping with keys "
                                            r"format, metadata, tables") as info:
        load_table(path)
    assert info.value.line == 1
    path.write_text("format: 1\nmetadata: {library: w, arch: sm90a, kernel_set: x, gpu: g, "
                    "sm_count: 1}\ntables:\n  - op: scaled_mm\n    a: int8\n    d: bf16\n"
                    "    epilogue: ScaledEpilogue\n    shapes:\n      - n: 16\n        k: 16\n"
                    "        buckets:\n          - 16\n")
    with pytest.raises(ManifestError, match=r"expected a mapping .*got an integer 16") as info:
        load_table(path)
    assert (info.value.line, info.value.key) == (12, "bucket")


def doc_message_matches(documented: str, actual: str) -> bool:
    """The rule docs/manifest-errors.md states at its top: a documented message is the code's
    message (the text after `file:line: key: `) verbatim and in full, except that each `...`
    stands for any text."""
    pattern = ".*?".join(re.escape(part) for part in documented.split("..."))
    return re.fullmatch(pattern, actual, re.S) is not None


def test_doc_message_rule():
    real = "unknown value 'gemm'; expected one of mixed_mm, grouped_matmul_swiglu_quant, scaled_mm"
    assert doc_message_matches(real, real)
    assert doc_message_matches("unknown value 'gemm'; expected one of ...", real)
    assert doc_message_matches("unknown value ...; expected one of mixed_mm, ..., scaled_mm", real)
    assert not doc_message_matches("unknown value 'gemm'; expected one of mixed_mm, scaled_mm", real)
    assert not doc_message_matches("unknown value 'gemm'", real)          # no silent prefix
    assert not doc_message_matches("value 'gemm'; expected one of ...", real)  # nor suffix
    assert not doc_message_matches("unknown value 'gemm'.*", real)        # no regex in the doc


def test_manifest_errors_doc(tmp_path):
    """Every case of docs/manifest-errors.md still fails with the key, the line and the message
    it documents (the message by `doc_message_matches`), for every op family."""
    import json
    doc = (Path(__file__).resolve().parents[1] / "docs" / "manifest-errors.md").read_text()
    bases = dict(re.findall(r"<!-- base: (\w+) -->\n```yaml\n(.*?)```", doc, re.S))
    assert set(bases) == {"base", "sm80", "mixed", "moe"}, sorted(bases)
    for name, text in bases.items():  # the example manifests themselves are valid
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        assert expand(load_manifest(path)), name
    # each case comment is followed by its entry's first line: **`key`**: message
    entries = re.findall(r"<!-- case: (.*) -->\n\*\*`([^`]+)`\*\*: (.+)\n", doc)
    assert len(entries) == doc.count("<!-- case: {"), "a case without its **`key`**: message line"
    cases = [(json.loads(c), key, message) for c, key, message in entries]
    assert len(cases) >= 75
    for family in ("mixed", "moe"):
        assert sum(c["base"] == family for c, _, _ in cases) >= 5, family
    for i, (c, key, message) in enumerate(cases):
        assert key == c["key"], c
        if c["base"] == "text":
            text = c["edits"]
        else:
            text = bases[c["base"]]
            for old, new in c["edits"]:
                assert text.count(old) == 1, (old, c)
                text = text.replace(old, new)
        path = tmp_path / f"case{i}.yaml"
        path.write_text(text)
        with pytest.raises(ManifestError) as info:
            expand(load_manifest(path))
        err = info.value
        assert (err.key, err.line) == (c["key"], c["line"]), (c, str(err))
        assert doc_message_matches(message, err.detail), (
            f"docs/manifest-errors.md is stale for {c}:\n  documented: {message}\n"
            f"  real:       {err.detail}")

BENCHMARK_MANIFESTS = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "manifests").glob("*.yaml"))


@pytest.mark.parametrize("path", BENCHMARK_MANIFESTS, ids=lambda p: p.name)
def test_benchmark_manifests_still_validate(path):
    """The candidate sets the RESULTS were measured with (benchmarks/manifests/) stay loadable as
    the schemas change: each expands to uniquely named kernels."""
    kernels = expand(load_manifest(path))
    names = [k.name for k in kernels]
    assert names and len(set(names)) == len(names)
