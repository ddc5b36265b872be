"""Expansion (kernel list, names, file grouping) and rendering (sources, bindings, write_tree)."""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest

from gemmgen.generator.expand import expand, group_into_files
from gemmgen.families.w8a8.configs import ScaledMmSpec as KernelSpec
from gemmgen.families.w8a8.configs import Origin, RuntimeKnobs, TileConfig, kernel_name
from gemmgen.generator.dispatch_rules import parse_condition
from gemmgen.generator.manifest import load_manifest
from gemmgen.generator.render import (render_bindings, render_kernel_sources,
                                      render_library_source, write_tree)

FINGERPRINT = "0123456789abcdef"


def spec(a="int8", d="bf16", epilogue="ScaledEpilogueBias", tile=(128, 128, 128), cluster=(2, 1, 1),
         schedule="pingpong", epilogue_schedule="tma_warpspecialized", stages=0,
         tile_scheduler="persistent", swap_ab=False) -> KernelSpec:
    return KernelSpec(library="demo", arch="sm90a", op="scaled_mm", a=a, d=d, epilogue=epilogue,
                      config=TileConfig(tile, cluster, schedule, epilogue_schedule, stages,
                                        tile_scheduler, swap_ab))


@pytest.fixture(scope="module")
def default():
    from gemmgen import settings
    path = next(p for p in settings.default_manifests() if p.name == "w8a8_sm90.yaml")
    manifest = load_manifest(path)
    return manifest, expand(manifest)


# ------------------------------------------------------------------- naming

@pytest.mark.parametrize("kwargs, name", [
    ({}, "sm90a_scaled_mm_i8_bf16_scaled_bias_t128x128x128_c2x1x1_pp_sauto"),
    (dict(a="e4m3", d="fp16", epilogue="ScaledEpilogue", tile=(64, 16, 256), cluster=(1, 1, 1),
          schedule="warpspecialized", swap_ab=True),
     "sm90a_scaled_mm_e4m3_f16_scaled_t64x16x256_c1x1x1_ws_sauto_swapab"),
    (dict(epilogue="ScaledEpilogueAzp", tile=(256, 128, 128), schedule="cooperative",
          epilogue_schedule="tma_warpspecialized_cooperative", stages=4, tile_scheduler="streamk"),
     "sm90a_scaled_mm_i8_bf16_azp_t256x128x128_c2x1x1_coop_s4_streamk"),
    (dict(epilogue="ScaledEpilogueAzpPerToken", d="fp16", schedule="cooperative",
          epilogue_schedule="tma_warpspecialized_cooperative", tile_scheduler="streamk", swap_ab=True),
     "sm90a_scaled_mm_i8_f16_azp_pertoken_t128x128x128_c2x1x1_coop_sauto_streamk_swapab"),
])
def test_kernel_name_examples(kwargs, name):
    kernel = spec(**kwargs)
    assert kernel_name(kernel) == name == kernel.name
    assert re.fullmatch(r"[a-z0-9_]+", name)  # a valid C identifier fragment and file name


def test_name_ignores_runtime_knobs_and_origin():
    plain = spec()
    other = KernelSpec(**{**plain.__dict__, "knobs": RuntimeKnobs("along_n", 8),
                          "origin": Origin("x.yaml", 3, "f", "c")})
    assert other.name == plain.name and other == plain and hash(other) == hash(plain)


def test_terse_fragments():
    assert spec().config.terse == "t128x128x128_c2x1x1_pp_sauto"
    assert spec(stages=5).config.terse.endswith("_pp_s5")
    assert "_swapab" not in spec().config.terse and "_streamk" not in spec().config.terse
    assert spec(swap_ab=True).config.terse.endswith("_swapab")
    assert spec().acc == "int32" and spec(a="e4m3").acc == "fp32"


def test_default_swap_ab_and_streamk_fragments(default):
    _, kernels = default
    swapped = [k for k in kernels if k.config.swap_ab]
    assert swapped and all(k.name.endswith("_swapab") for k in swapped)
    assert all(not k.name.endswith("_swapab") for k in kernels if not k.config.swap_ab)
    assert "sm90a_scaled_mm_i8_bf16_scaled_t64x16x256_c1x1x1_ws_sauto_swapab" in {k.name for k in kernels}
    streamk = [k for k in kernels if "_streamk" in k.name]
    assert streamk and all(k.config.tile_scheduler == "streamk" for k in streamk)
    assert all(k.config.tile_scheduler == "persistent" for k in kernels if k not in streamk)
    assert "sm90a_scaled_mm_e4m3_bf16_scaled_bias_t128x128x128_c1x1x1_coop_sauto_streamk" in {
        k.name for k in streamk}


def test_streamk_name_from_manifest(case):
    case.replace("schedule: pingpong", "schedule: cooperative")
    case.replace("tile: [128, 128, 128]", "tile: [256, 128, 128]")
    case.replace("        stages: auto\n", "        stages: auto\n        tile_scheduler: streamk\n")
    names = [k.name for k in case.expand()]
    assert "sm90a_scaled_mm_i8_bf16_scaled_t256x128x128_c2x1x1_coop_sauto_streamk" in names
    assert "sm90a_scaled_mm_i8_f16_scaled_bias_t64x64x128_c1x1x1_ws_sauto_swapab" in names
    # stream-K translation units are built without programmatic dependent launch (CUTLASS 4.2's
    # stream-K scheduler does not compile with GDC); the others keep it
    manifest = case.load()
    units = render_kernel_sources(manifest, expand(manifest))
    define = "#define GEMMGEN_SM90_WITHOUT_GDC 1\n"
    streamk = [u for u in units if u.name.endswith("_streamk.cu")]
    include = '#include "gemmgen/w8a8/sm90_scaled_mm.hpp"'
    assert streamk and all(define in u.source and u.source.index(define) < u.source.index(include)
                           for u in streamk)
    assert all(define not in u.source for u in units if u not in streamk)


# ---------------------------------------------------------------- expansion

def test_expansion_is_sorted_and_deterministic(default, case):
    manifest, kernels = default
    names = [k.name for k in kernels]
    assert names == sorted(names)
    assert expand(manifest) == kernels
    assert [k.name for k in expand(load_manifest(manifest.path))] == names
    # Declaration order does not matter: swap the two configs (and what dispatch uses stays named).
    before = [k.name for k in case.expand()]
    case.replace("      - name: small\n        tile: [64, 64, 128]\n        cluster: [1, 1, 1]\n"
                 "        schedule: warpspecialized\n        swap_ab: true\n", "")
    case.replace("        stages: auto\n", "        stages: auto\n      - name: small\n"
                 "        tile: [64, 64, 128]\n        cluster: [1, 1, 1]\n"
                 "        schedule: warpspecialized\n        swap_ab: true\n")
    assert [k.name for k in case.expand()] == before


def test_expansion_carries_origin_and_knobs(case):
    case.replace("        stages: auto\n", "        stages: auto\n        raster: along_n\n        swizzle: 8\n")
    kernels = case.expand()
    large = [k for k in kernels if k.config.tile == (128, 128, 128)]
    small = [k for k in kernels if k.config.tile == (64, 64, 128)]
    assert len(large) == len(small) == 4
    assert all(k.knobs == RuntimeKnobs("along_n", 8) for k in large)
    assert all(k.knobs == RuntimeKnobs() for k in small)
    assert {k.origin.line for k in large} == {case.line("- name: large")}
    assert {(k.origin.family, k.origin.config) for k in small} == {("int8", "small")}
    assert all(k.origin.file == str(case.path.resolve()) for k in kernels)
    assert str(large[0].origin) == f"{case.path.resolve()}:19 (family 'int8', config 'large')"


def test_unnamed_config_origin_uses_terse(case):
    case.replace("      - name: large\n", "      - \n").replace("      - \n        tile:", "      - tile:")
    case.replace("use: large", "use: {tile: [128, 128, 128]}")
    kernels = case.expand()
    assert {k.origin.config for k in kernels if k.config.tile == (128, 128, 128)} == {
        "t128x128x128_c2x1x1_pp_sauto"}


def test_group_into_files(default):
    manifest, kernels = default
    groups = group_into_files(kernels, manifest.kernels_per_file)
    assert manifest.kernels_per_file == 4
    # int8: 8 kernels per config → 2 files each; fp8: 4 per config → 1 file each.
    configs = len(manifest.families[0].configs)
    assert configs == len(manifest.families[1].configs)
    assert len(groups) == configs * 2 + configs
    assert sorted(k.name for g in groups for k in g) == [k.name for k in kernels]
    for group in groups:
        assert 1 <= len(group) <= 4
        assert len({(k.a, k.config) for k in group}) == 1
        assert [k.name for k in group] == sorted(k.name for k in group)
    assert group_into_files(kernels, manifest.kernels_per_file) == groups
    assert len(group_into_files(kernels, 1)) == len(kernels)
    assert len(group_into_files(kernels, 16)) == 2 * configs  # one per (a, config)
    three = group_into_files(kernels, 3)
    assert Counter(len(g) for g in three) == Counter(
        {3: 2 * configs + configs, 2: configs, 1: configs})  # 8=3+3+2, 4=3+1


def test_adding_a_config_does_not_reshuffle_files(case):
    before = {tuple(k.name for k in g) for g in group_into_files(case.expand(), 2)}
    case.replace("        stages: auto\n", "        stages: auto\n      - name: huge\n"
                 "        tile: [256, 128, 128]\n        cluster: [2, 1, 1]\n"
                 "        schedule: cooperative\n")
    after = {tuple(k.name for k in g) for g in group_into_files(case.expand(), 2)}
    assert before < after and len(after - before) == 2


def test_kernels_per_file_from_manifest(case):
    case.replace("kernels_per_file: 4", "kernels_per_file: 1")
    manifest = case.load()
    units = render_kernel_sources(manifest, expand(manifest))
    assert len(units) == 8 and all(len(u.kernels) == 1 for u in units)
    assert [u.name for u in units if "t64x64x128" in u.name] == [
        f"sm90a_scaled_mm_int8_t64x64x128_c1x1x1_ws_sauto_swapab_part{i}.cu" for i in range(4)]


# ---------------------------------------------------------------- rendering

def test_render_is_deterministic(default):
    manifest, kernels = default
    first = render_kernel_sources(manifest, kernels)
    second = render_kernel_sources(load_manifest(manifest.path), expand(load_manifest(manifest.path)))
    assert [(u.name, u.source) for u in first] == [(u.name, u.source) for u in second]
    assert render_bindings(manifest, kernels, FINGERPRINT, "libgemmgen_w8a8.so") == \
        render_bindings(manifest, kernels, FINGERPRINT, "libgemmgen_w8a8.so")
    assert render_library_source(manifest, 60, FINGERPRINT) == render_library_source(manifest, 60, FINGERPRINT)


def test_translation_unit_names(default):
    manifest, kernels = default
    names = [u.name for u in render_kernel_sources(manifest, kernels)]
    assert len(names) == len(set(names)) == 3 * len(manifest.families[0].configs)
    assert "sm90a_scaled_mm_int8_t128x128x128_c2x1x1_pp_sauto_part0.cu" in names
    assert "sm90a_scaled_mm_int8_t128x128x128_c2x1x1_pp_sauto_part1.cu" in names
    assert "sm90a_scaled_mm_e4m3_t128x128x128_c2x1x1_pp_sauto.cu" in names
    assert all(re.fullmatch(r"[a-z0-9_]+\.cu", n) for n in names)


def test_kernel_source_contents(default):
    manifest, kernels = default
    units = render_kernel_sources(manifest, kernels)
    assert sorted(k.name for u in units for k in u.kernels) == [k.name for k in kernels]
    for unit in units:
        src = unit.source
        head = src.split("#include", 1)[0]
        assert src.startswith(f"// Generated by gemmgen from {manifest.path}")
        assert "do not edit" in head
        assert f"Library {manifest.library}, arch sm90a" in head
        assert '#include "gemmgen/w8a8/sm90_scaled_mm.hpp"' in src
        assert "#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)" in src
        assert '#error "gemmgen: sm90a kernels need -gencode=arch=compute_90a,code=sm_90a' in src
        assert src.count("gemmgen_run_") == len(unit.kernels)
        assert src.count("GEMMGEN_EXPORT") == 2 * len(unit.kernels)
        for index, kernel in enumerate(unit.kernels):
            assert f"//   {kernel.name}\n" in head
            assert f"from {manifest.path}, family {kernel.origin.family!r}, config " \
                   f"{kernel.origin.config!r}" in head
            assert f"GEMMGEN_EXPORT int gemmgen_run_{kernel.name}(" in src
            assert f"GEMMGEN_EXPORT size_t gemmgen_workspace_{kernel.name}(" in src
            assert f'"{kernel.name}");' in src  # the name last_error() reports
            assert f"struct Config{index} : gemmgen::sm90::ScaledMmConfig<" in src
            assert f"gemmgen::{kernel.epilogue}," in src
        assert "{{" not in src and "{%" not in src


def test_kernel_source_cpp_spellings(case):
    case.replace("d: [bf16, fp16]", "d: [fp16]")
    case.replace("[ScaledEpilogue, ScaledEpilogueBias]", "[ScaledEpilogue]")
    case.replace("        d: [fp16]\n", "        d: [fp16]\n      - {a: e4m3, d: bf16}\n")
    manifest = case.load()
    units = {u.name: u.source for u in render_kernel_sources(manifest, expand(manifest))}
    int8_large = units["sm90a_scaled_mm_int8_t128x128x128_c2x1x1_pp_sauto.cu"]
    assert "int8_t, cutlass::half_t, gemmgen::ScaledEpilogue," in int8_large
    assert "Shape<_128, _128, _128>, Shape<_2, _1, _1>," in int8_large
    assert "cutlass::gemm::KernelTmaWarpSpecializedPingpong,\n" in int8_large
    assert "cutlass::epilogue::TmaWarpSpecialized,\n" in int8_large
    assert "/*stages (0 = auto)=*/0, cutlass::gemm::PersistentScheduler," in int8_large
    assert "/*swap_ab=*/false> {};" in int8_large
    fp8_small = units["sm90a_scaled_mm_e4m3_t64x64x128_c1x1x1_ws_sauto_swapab.cu"]
    assert "cutlass::float_e4m3_t, cutlass::bfloat16_t," in fp8_small
    assert "cutlass::gemm::KernelTmaWarpSpecializedFP8FastAccum,\n" in fp8_small
    assert "/*swap_ab=*/true> {};" in fp8_small


def test_library_source(default):
    manifest, _ = default
    text = render_library_source(manifest, 60, FINGERPRINT)
    assert text.startswith(f"// Generated by gemmgen from {manifest.path}")
    assert "(60 kernels)" in text and f'return "{FINGERPRINT}";' in text
    for symbol in ("gemmgen_last_error", "gemmgen_library_fingerprint", "gemmgen_scaled_mm_args_size"):
        assert re.search(rf"^GEMMGEN_EXPORT [a-z_ *]+ {symbol}\(void\) {{$", text, re.M), symbol


def _exec_bindings(text: str) -> dict:
    namespace: dict = {"__name__": "gemmgen_test_bindings"}
    exec(compile(text, "bindings.py", "exec"), namespace)
    return namespace


def test_bindings_match_expansion(default, tmp_path):
    manifest, kernels = default
    text = render_bindings(manifest, kernels, FINGERPRINT, "libgemmgen_w8a8.so")
    ns = _exec_bindings(text)
    assert (ns["LIBRARY"], ns["ARCH"], ns["FINGERPRINT"], ns["SHARED_OBJECT"]) == (
        "w8a8", "sm90a", FINGERPRINT, "libgemmgen_w8a8.so")
    assert ns["KERNELS"] == tuple(kernels)
    for bound, kernel in zip(ns["KERNELS"], kernels):  # fields that equality ignores
        assert bound.knobs == kernel.knobs and bound.origin == kernel.origin
        assert bound.name == kernel.name
    names = {k.name for k in kernels}
    dispatch = ns["DISPATCH"]
    expected_keys = {(f.op, a, d, e) for f in manifest.families for a, d, e in f.combos}
    assert set(dispatch) == expected_keys and len(dispatch) == 12
    for family in manifest.families:
        for a, d, epilogue in family.combos:
            rules = dispatch[(family.op, a, d, epilogue)]
            assert [(when, line) for when, _, line in rules] == [
                (r.condition.source, r.line) for r in family.dispatch]
            for (when, name, _), rule in zip(rules, family.dispatch):
                assert name in names
                picked = next(k for k in kernels if k.name == name)
                assert (picked.a, picked.d, picked.epilogue) == (a, d, epilogue)
                assert picked.config == family.configs[rule.config_index].config
                parse_condition(when)
    assert dispatch[("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")][0][:2] == (
        "m <= 16", "sm90a_scaled_mm_i8_bf16_scaled_bias_t64x16x256_c1x1x1_ws_sauto_swapab")
    # The library loader imports the same text from a file.
    from gemmgen.bindings.library import _import_bindings
    path = tmp_path / "bindings.py"
    path.write_text(text)
    module = _import_bindings(path)
    assert module.KERNELS == tuple(kernels) and module.DISPATCH == dispatch


# --------------------------------------------------------------- write_tree

def _age(paths, seconds=1000):
    for path in paths:
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns - seconds * 10**9, stat.st_mtime_ns - seconds * 10**9))


def test_write_tree_writes_only_changes(tmp_path):
    out = tmp_path / "src"
    files = {"b.cu": "// b\n", "a.cu": "// a\n", "library.cu": "// lib\n"}
    assert write_tree(out, files, (".cu",)) == (["a.cu", "b.cu", "library.cu"], [])
    assert {p.name: p.read_text() for p in out.iterdir()} == files
    _age(out.iterdir())
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert write_tree(out, dict(files), (".cu",)) == ([], [])
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    changed = dict(files, **{"b.cu": "// b, changed\n"})
    assert write_tree(out, changed, (".cu",)) == (["b.cu"], [])
    now = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert now["a.cu"] == mtimes["a.cu"] and now["library.cu"] == mtimes["library.cu"]
    assert now["b.cu"] > mtimes["b.cu"]
    assert (out / "b.cu").read_text() == "// b, changed\n"
    assert not list(out.glob("*.tmp"))


def test_write_tree_removes_stale_owned_files_only(tmp_path):
    out = tmp_path / "src"
    write_tree(out, {"a.cu": "a", "b.cu": "b", "c.cu": "c"}, (".cu",))
    (out / "notes.txt").write_text("mine")
    (out / "a.o").write_text("obj")
    (out / "old.cu").write_text("stale, from a previous manifest")
    written, removed = write_tree(out, {"a.cu": "a"}, (".cu",))
    assert written == [] and removed == ["b.cu", "c.cu", "old.cu"]
    assert sorted(p.name for p in out.iterdir()) == ["a.cu", "a.o", "notes.txt"]
    # No owned suffixes: nothing is ever removed (build.ninja beside the library's folders).
    assert write_tree(out, {"build.ninja": "x"}, ()) == (["build.ninja"], [])
    assert (out / "a.cu").exists()


def test_moving_a_config_keeps_sources_identical(case):
    before = case.load()
    before_units = render_kernel_sources(before, expand(before))
    before_bindings = render_bindings(before, expand(before), FINGERPRINT, "lib.so")
    # Move `large` above `small` and add comment lines: only line numbers change.
    block = ("      - name: large\n        tile: [128, 128, 128]\n        cluster: [2, 1, 1]\n"
             "        schedule: pingpong\n        stages: auto\n")
    case.replace(block, "")
    case.replace("    configs:\n", "    # a comment\n    # another\n    configs:\n" + block)
    after = case.load()
    assert [c.name for c in after.families[0].configs] == ["large", "small"]
    assert {c.name: c.line for c in after.families[0].configs} != {
        c.name: c.line for c in before.families[0].configs}
    after_units = render_kernel_sources(after, expand(after))
    assert [(u.name, u.source) for u in after_units] == [(u.name, u.source) for u in before_units]
    # The bindings record lines (for dispatch.explain), so they do change.
    assert render_bindings(after, expand(after), FINGERPRINT, "lib.so") != before_bindings
