"""The mixed-input family on the CPU: manifest keys and rules (file:line errors), expansion and
names, rendering, dispatch of a weight type to its kernel class, and one real nvcc build of a
mixed-input kernel and of a direct kernel (the CI compiles of this family's templates)."""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import pytest

from gemmgen import families as registry
from gemmgen.bindings.library import load_library
from gemmgen.build import builder, toolchain
from gemmgen.errors import ManifestError
from gemmgen.families.mixed.abi import MixedMmArgs
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest
from gemmgen.generator.render import render_bindings, render_kernel_sources, render_library_source
from gemmgen.settings import DEFAULT_MANIFEST_DIR

MANIFEST = """\
library: onemixed
arch: sm90a
kernels_per_file: 2
families:
  - name: mixed
    op: mixed_mm
    dtypes:
      - a: bf16
        w: int4
    schemes: [scale_zero]
    configs:
      - name: decode_sk
        tile: [128, 16, 64]
        cluster: [1, 1, 1]
        schedule: cooperative
        tile_scheduler: streamk
    dispatch:
      - when: "true"
        use: decode_sk
"""
KERNEL = "sm90a_mixed_mm_bf16_i4_sz_t128x16x64_c1x1x1_coop_sauto_streamk"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mixed.yaml"
    path.write_text(text)
    return path


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_shipped_manifest_expands_to_every_variant():
    manifest = load_manifest(DEFAULT_MANIFEST_DIR / "mixed_sm90.yaml")
    kernels = expand(manifest)
    classes = {k.dispatch_class for k in kernels}
    assert classes == {("mixed_mm", a, w, s + g) for a in ("bf16", "fp16") for g in ("", "_g32")
                       for w, s in (("int4", "scale"), ("int4", "scale_zero"), ("int8", "scale"))}
    # group 32's classes take the family's own kernels only (CUTLASS's mainloop cannot serve them)
    assert all(k.config.is_own for k in kernels if k.scheme.endswith("_g32"))
    # one entry per scheme (GPTQ, AWQ, int8; each also for group 32), over both activation dtypes
    assert len(kernels) == 2 * sum(len(f.configs) for f in manifest.families)
    names = [k.name for k in kernels]
    assert len(set(names)) == len(names) and all(n.startswith("sm90a_mixed_mm_") for n in names)


@pytest.mark.parametrize("old,new,key,message", [
    ("w: int4", "w: int2", "w", "unknown value 'int2'"),
    ("a: bf16", "a: e4m3", "a", "unknown value 'e4m3'"),
    ("schemes: [scale_zero]", "schemes: [zero]", "schemes", "unknown value 'zero'"),
    ("tile: [128, 16, 64]", "tile: [128, 16, 128]", "tile", "tile K must be 64"),
    ("tile: [128, 16, 64]", "tile: [128, 12, 64]", "tile", "multiple of 8"),
    ("tile: [128, 16, 64]", "tile: [64, 16, 64]", "schedule", "multiple of 128"),
    ("schedule: cooperative", "schedule: pingpong", "tile_scheduler", "stream-K needs the cooperative"),
])
def test_manifest_errors_name_file_line_key(tmp_path, old, new, key, message):
    text, error = _edit_and_expand(tmp_path, MANIFEST, old, new, key, message)
    assert error.line == _line(text, new.split(":")[0] + ":") or key in ("schedule", "tile_scheduler")


def _edit_and_expand(tmp_path, base: str, old: str, new: str, key: str, message: str):
    """Apply one edit to `base`, expand it, and check the ManifestError's file, key and message."""
    text = base.replace(old, new)
    assert text != base
    path = _write(tmp_path, text)
    with pytest.raises(ManifestError, match=message) as info:
        expand(load_manifest(path))
    assert (info.value.file, info.value.key) == (str(path), key)
    return text, info.value


def test_scale_zero_needs_int4(tmp_path):
    text = MANIFEST.replace("w: int4", "w: int8")
    with pytest.raises(ManifestError, match="scale_zero .* int4 weights only") as info:
        load_manifest(_write(tmp_path, text))
    assert info.value.key == "schemes" and info.value.line == _line(text, "schemes:")


def test_render_names_the_manifest_entry_and_checks_the_arch(tmp_path):
    manifest = load_manifest(_write(tmp_path, MANIFEST))
    kernels = expand(manifest)
    assert [k.name for k in kernels] == [KERNEL]
    (unit,) = render_kernel_sources(manifest, kernels)
    assert '#include "gemmgen/mixed/sm90_mixed_mm.hpp"' in unit.source
    assert "gemmgen::device_supports(9, 0, 9, 0)" in unit.source
    assert "cutlass::int4b_t, /*with_zero=*/true" in unit.source
    assert "family 'mixed', config 'decode_sk'" in unit.source
    library = render_library_source(manifest, 1, "f" * 16, kernels)
    assert "gemmgen_mixed_mm_args_size" in library and '"gemmgen/mixed/mixed_mm_args.h"' in library
    namespace: dict = {}
    exec(compile(render_bindings(manifest, kernels, "f" * 16, "lib.so"), "bindings.py", "exec"), namespace)
    assert namespace["KERNELS"] == tuple(kernels)
    assert list(namespace["DISPATCH"]) == [("mixed_mm", "bf16", "int4", "scale_zero")]


@pytest.mark.parametrize("weight_type,cls", [("uint4b8", ("int4", "scale")), ("int4", ("int4", "scale")),
                                             ("uint4", ("int4", "scale_zero")),
                                             ("int8", ("int8", "scale")), ("uint8b128", ("int8", "scale"))])
def test_weight_types_map_to_kernel_classes(weight_type, cls):
    family = registry.for_api_op("mixed_mm")
    key, values = family.dispatch_request("mixed_mm", a_dtype="bf16", weight_type=weight_type,
                                          m=3, n=4096, k=4096)
    assert key == ("mixed_mm", "bf16", *cls) and values == (3, 4096, 4096)


@pytest.mark.parametrize("weight_type,cls", [("uint4b8", ("int4", "scale_g32")),
                                             ("uint4", ("int4", "scale_zero_g32")),
                                             ("uint8b128", ("int8", "scale_g32"))])
def test_group_32_is_a_dispatch_class_of_its_own(weight_type, cls):
    """Group 32 maps to the `_g32` schemes; group 64, 128 and per-channel (None: K) do not."""
    family = registry.for_api_op("mixed_mm")
    key, _ = family.dispatch_request("mixed_mm", a_dtype="bf16", weight_type=weight_type,
                                     m=3, n=4096, k=4096, group_size=32)
    assert key == ("mixed_mm", "bf16", *cls)
    for group in (64, 128, 4096, None):
        key, _ = family.dispatch_request("mixed_mm", a_dtype="bf16", weight_type=weight_type,
                                         m=3, n=4096, k=4096, group_size=group)
        assert not key[-1].endswith("_g32")
    for bad in (0, 16, 96, 8192, 64.0, True):
        with pytest.raises(ValueError, match=r"group_size must be None, 32, a multiple of 64 "
                                             rf"dividing k=4096, or k \(per-channel\); got {bad!r}"):
            family.dispatch_request("mixed_mm", a_dtype="bf16", weight_type="uint4b8", m=1, n=8,
                                    k=4096, group_size=bad)


@pytest.mark.parametrize("m", [1, 16, 32, 64, 256, 4096])
@pytest.mark.parametrize("weight_type", ["uint4b8", "uint4", "int8"])
def test_shipped_group_32_rules_pick_own_kernels_at_every_m(m, weight_type):
    """The shipped manifests serve group 32 at every M, with kernels of its own class."""
    from gemmgen import dispatch
    kernel = dispatch.lookup("mixed_mm", source="manifests", arch="sm90a", a_dtype="bf16",
                             weight_type=weight_type, m=m, n=4096, k=4096, group_size=32)
    assert kernel.spec.scheme.endswith("_g32") and kernel.spec.config.is_own
    sm80 = dispatch.lookup("mixed_mm", source="manifests", arch="sm80", a_dtype="fp16",
                           weight_type=weight_type, m=m, n=4096, k=4096, group_size=32)
    assert sm80.spec.scheme.endswith("_g32") and sm80.spec.arch == "sm80"


def test_group_32_schemes_refuse_cutlass_schedules(tmp_path):
    """CUTLASS's mixed-input mainloop applies a group's factors per tile K (64): a `_g32` scheme
    on a CUTLASS config is refused at the config's `schedule`, file and line."""
    text, error = _edit_and_expand(tmp_path, MANIFEST, "schemes: [scale_zero]",
                                   "schemes: [scale_zero_g32]", "schedule",
                                   r"scheme scale_zero_g32 \(group 32\) needs schedule direct or "
                                   r"wgmma: CUTLASS's mixed-input collective applies one group's "
                                   r"factors to a whole tile K of 64; got schedule 'cooperative'")
    assert error.line == _line(text, "schedule: cooperative")


def test_scale_zero_g32_needs_int4(tmp_path):
    text = MANIFEST.replace("w: int4", "w: int8").replace("[scale_zero]", "[scale_zero_g32]")
    with pytest.raises(ManifestError, match="scale_zero_g32 .* int4 weights only") as info:
        load_manifest(_write(tmp_path, text))
    assert info.value.key == "schemes"


def test_dispatch_request_errors():
    family = registry.for_api_op("mixed_mm")
    with pytest.raises(ValueError, match="weight_type"):
        family.dispatch_request("mixed_mm", a_dtype="bf16", weight_type="int3", m=1, n=8, k=64)
    with pytest.raises(ValueError, match="a_dtype"):
        family.dispatch_request("mixed_mm", a_dtype="int8", weight_type="int4", m=1, n=8, k=64)
    with pytest.raises(ValueError, match=r"m must be an int in \[1, 2\*\*31 - 1\]"):
        family.dispatch_request("mixed_mm", a_dtype="bf16", weight_type="int4", m=2**31, n=8, k=64)


DIRECT_MANIFEST = """\
library: onedirect
arch: sm80
families:
  - name: mixed
    op: mixed_mm
    dtypes:
      - {a: fp16, w: int8}
    schemes: [scale]
    configs:
      - {name: stream, tile: [32, 16, 64], schedule: direct, warps_k: 4, stages: 3}
    dispatch:
      - {when: "true", use: stream}
"""
DIRECT_KERNEL = "sm80_mixed_mm_f16_i8_s_t32x16x64_direct_wk4_s3"


def test_direct_config_renders_for_sm80_and_sm90a(tmp_path):
    """The direct kernel's config reaches the template: warps over N, warps over K, token tiles,
    ring depth; an sm80 library includes only the direct header."""
    manifest = load_manifest(_write(tmp_path, DIRECT_MANIFEST))
    kernels = expand(manifest)
    assert [k.name for k in kernels] == [DIRECT_KERNEL]
    (unit,) = render_kernel_sources(manifest, kernels)
    assert '#include "gemmgen/mixed/direct_mixed_mm.cuh"' in unit.source
    assert "sm90_mixed_mm.hpp" not in unit.source
    assert ("DirectConfig<cutlass::half_t, int8_t, /*with_zero=*/false, /*warps_n=*/2, "
            "/*warps_k=*/4, /*tokens=*/16, /*chunk_k=*/64, /*stages=*/3, /*ctas_per_sm=*/0, "
            "/*row_tiles=*/1, /*group_k=*/64>") in unit.source
    assert "gemmgen::device_supports(8, 0," in unit.source
    sm90 = load_manifest(_write(tmp_path, DIRECT_MANIFEST.replace("arch: sm80", "arch: sm90a")))
    (unit,) = render_kernel_sources(sm90, expand(sm90))
    assert "direct_mixed_mm.cuh" in unit.source and "sm90_mixed_mm.hpp" not in unit.source


@pytest.mark.parametrize("old,new,key,message", [
    ("warps_k: 4, stages: 3", "stages: 3", "warps_k", "needs warps_k"),
    ("warps_k: 4", "warps_k: 3", "warps_k", "one of 1, 2, 4, 8, 16; got 3"),
    ("tile: [32, 16, 64], schedule: direct, warps_k: 4", "tile: [64, 16, 64], schedule: direct, warps_k: 16",
     "warps_k", "2048 threads a CTA; at most 512"),
    ("stages: 3", "stages: 9", "stages", "2 to 8 chunks"),
    ("stages: 3", "stages: 8, cluster: [2, 1, 1]", "cluster", "no clusters"),
    ("stages: 3", "stages: 3, raster: along_m", "raster", "no tile scheduler, so no raster"),
    ("tile: [32, 16, 64], schedule: direct, warps_k: 4, stages: 3",
     "tile: [32, 64, 64], schedule: direct, warps_k: 8, stages: 8", "stages", "over the sm80 limit"),
    ("tile: [32, 16, 64]", "tile: [32, 3, 64]", "tile", r"tokens \(1, 2, 4, 8, 16, 32, 64\), 64 or 128\]"),
    ("tile: [32, 16, 64]", "tile: [32, 16, 256]", "tile", r"64 or 128\]; got \[32, 16, 256\]"),
    ("stages: 3", "stages: 3, ctas_per_sm: 0.5", "ctas_per_sm", "expected a positive integer"),
    ("stages: 3", "stages: 3, rows_per_warp: 24", "rows_per_warp", "expected 16 or 32"),
    ("tile: [32, 16, 64], schedule: direct, warps_k: 4, stages: 3",
     "tile: [16, 16, 64], schedule: direct, warps_k: 4, rows_per_warp: 32", "rows_per_warp",
     "tile M 16 is not a whole number of warps of 32 features"),
    ("stages: 3", "stages: 3, ctas_per_sm: 7", "ctas_per_sm",
     r"7 CTAs of 256 threads an SM leave 36 registers a thread \(at least 40"),
])
def test_direct_config_errors(tmp_path, old, new, key, message):
    _edit_and_expand(tmp_path, DIRECT_MANIFEST, old, new, key, message)


def test_direct_decode_tile_chunk_and_occupancy_reach_the_template(tmp_path):
    """Tile N 1, 2 or 4 (tokens a CTA at decode), tile K 128 (two 64-K steps a ring slot),
    ctas_per_sm and rows_per_warp reach the config type and the kernel name."""
    text = DIRECT_MANIFEST.replace("tile: [32, 16, 64], schedule: direct, warps_k: 4, stages: 3",
                                   "tile: [64, 1, 128], schedule: direct, warps_k: 2, "
                                   "ctas_per_sm: 2, rows_per_warp: 32")
    manifest = load_manifest(_write(tmp_path, text))
    kernels = expand(manifest)
    assert [k.name for k in kernels] == ["sm80_mixed_mm_f16_i8_s_t64x1x128_direct_wk2_sauto_r32_o2"]
    (unit,) = render_kernel_sources(manifest, kernels)
    assert ("/*warps_n=*/2, /*warps_k=*/2, /*tokens=*/1, /*chunk_k=*/128, /*stages=*/4, "
            "/*ctas_per_sm=*/2, /*row_tiles=*/2, /*group_k=*/64>") in unit.source


WGMMA_MANIFEST = """\
library: onewgmma
arch: sm90a
families:
  - name: mixed
    op: mixed_mm
    dtypes:
      - {a: bf16, w: int4}
    schemes: [scale, scale_zero]
    configs:
      - {name: mid, tile: [128, 64, 64], schedule: wgmma, stages: 5}
    dispatch:
      - {when: "true", use: mid}
"""
WGMMA_KERNELS = ["sm90a_mixed_mm_bf16_i4_s_t128x64x64_wgmma_s5",
                 "sm90a_mixed_mm_bf16_i4_sz_t128x64x64_wgmma_s5"]


def test_wgmma_config_renders(tmp_path):
    """The wgmma kernel's config reaches the template (warpgroups, tokens, ring depth, zero
    points) and the unit includes only its header."""
    manifest = load_manifest(_write(tmp_path, WGMMA_MANIFEST))
    kernels = expand(manifest)
    assert sorted(k.name for k in kernels) == WGMMA_KERNELS
    sources = "\n".join(unit.source for unit in render_kernel_sources(manifest, kernels))
    assert '#include "gemmgen/mixed/wgmma_mixed_mm.cuh"' in sources
    assert "sm90_mixed_mm.hpp" not in sources and "direct_mixed_mm.cuh\"" not in sources
    for zero in ("false", "true"):
        assert ("WgmmaConfig<cutlass::bfloat16_t, cutlass::int4b_t, /*with_zero=*/" + zero +
                ", /*warpgroups=*/2, /*tokens=*/64, /*stages=*/5, /*group_k=*/64, "
                "/*ctas_per_sm=*/1>") in sources
    assert "gemmgen::mixed::wgmma::run<" in sources


def test_wgmma_two_ctas_an_sm_reach_the_template_and_the_name(tmp_path):
    """`ctas_per_sm: 2` on the wgmma kernel: its launch bounds' minimum (registers capped at
    128 for two warpgroups) and an `_o2` name; 3 CTAs, or shared memory two CTAs cannot share,
    are refused at the key."""
    text = WGMMA_MANIFEST.replace("stages: 5}", "stages: 5, ctas_per_sm: 2}")
    manifest = load_manifest(_write(tmp_path, text))
    kernels = expand(manifest)
    assert sorted(k.name for k in kernels) == [n + "_o2" for n in WGMMA_KERNELS]
    sources = "\n".join(unit.source for unit in render_kernel_sources(manifest, kernels))
    assert "/*stages=*/5, /*group_k=*/64, /*ctas_per_sm=*/2>" in sources
    _edit_and_expand(tmp_path, WGMMA_MANIFEST, "stages: 5}", "stages: 5, ctas_per_sm: 3}",
                     "ctas_per_sm", r"the wgmma kernel holds 1 or 2 CTAs an SM .*; got 3")
    _edit_and_expand(tmp_path, WGMMA_MANIFEST, "tile: [128, 64, 64], schedule: wgmma, stages: 5}",
                     "tile: [128, 256, 64], schedule: wgmma, stages: 4, ctas_per_sm: 2}", "stages",
                     r"4 stages of the wgmma tile 128x256x64 \(scale\) need \d+ bytes of shared "
                     r"memory, over the limit of 115712 \(2 CTAs an SM\)")


@pytest.mark.parametrize("old,new,key,message", [
    ("tile: [128, 64, 64]", "tile: [256, 64, 64]", "tile", r"64 or 128 features .*got \[256, 64, 64\]"),
    ("tile: [128, 64, 64]", "tile: [128, 48, 64]", "tile", r"tokens \(16, 32, 64, 96, 128, 192, 256"),
    ("tile: [128, 64, 64]", "tile: [128, 64, 128]", "tile", r"64\]; got \[128, 64, 128\]"),
    ("stages: 5", "stages: 2", "stages", "3 to 8 chunks"),
    ("stages: 5", "stages: 5, cluster: [1, 1, 2]", "cluster", "chooses its K split's cluster at launch"),
    ("stages: 5", "stages: 5, warps_k: 4", "warps_k", "belongs to schedule direct"),
    ("stages: 5", "stages: 5, tile_scheduler: streamk", "tile_scheduler", "no tile scheduler"),
    ("stages: 5", "stages: 5, raster: along_m", "raster", "no tile scheduler, so no raster"),
    ("tile: [128, 64, 64], schedule: wgmma, stages: 5", "tile: [128, 256, 64], schedule: wgmma, stages: 8",
     "stages", "over the limit of"),
    ("arch: sm90a", "arch: sm80", "schedule", "needs sm90a; this library is sm80"),
    # the factors' ring counts: 8 stages of [128, 192] fit with scales alone, not with zero points
    ("tile: [128, 64, 64], schedule: wgmma, stages: 5", "tile: [128, 192, 64], schedule: wgmma, stages: 8",
     "stages", r"\(scale_zero\) need 234496 bytes"),
])
def test_wgmma_config_errors(tmp_path, old, new, key, message):
    _edit_and_expand(tmp_path, WGMMA_MANIFEST, old, new, key, message)


def test_wgmma_refuses_int8_weights(tmp_path):
    text = WGMMA_MANIFEST.replace("schemes: [scale, scale_zero]", "schemes: [scale]").replace(
        "{a: bf16, w: int4}", "{a: bf16, w: int8}")
    path = _write(tmp_path, text)
    with pytest.raises(ManifestError, match="reads int4 weights only") as info:
        expand(load_manifest(path))
    assert info.value.key == "schedule"


@pytest.mark.compile
@pytest.mark.parametrize("text,library_name,kernel,arch", [
    (MANIFEST, "onemixed", KERNEL, "sm90a"),            # a CUTLASS 3.x mixed-input kernel
    (DIRECT_MANIFEST, "onedirect", DIRECT_KERNEL, "sm80"),  # the direct kernel: seconds to build
    (DIRECT_MANIFEST.replace("w: int8", "w: int4"), "onedirect", DIRECT_KERNEL.replace("_i8_", "_i4_"),
     "sm80"),  # its int4 path (the fragment-order weights) is another instantiation
    (DIRECT_MANIFEST.replace("w: int8", "w: int4").replace("[scale]", "[scale_zero_g32]"), "onedirect",
     DIRECT_KERNEL.replace("_i8_s_", "_i4_szg32_"), "sm80"),  # group 32: factors through the ring
    (WGMMA_MANIFEST.replace("scale, scale_zero", "scale"), "onewgmma", WGMMA_KERNELS[0], "sm90a"),
    # up to 32 tokens a tile the wgmma loop is unrolled over whole rings (constant slots and
    # descriptors) and an 8-chunk ring waits once every two chunks: another instantiation
    (WGMMA_MANIFEST.replace("scale, scale_zero", "scale").replace("[128, 64, 64], schedule: wgmma, stages: 5",
                                                                  "[64, 32, 64], schedule: wgmma, stages: 8"),
     "onewgmma", "sm90a_mixed_mm_bf16_i4_s_t64x32x64_wgmma_s8", "sm90a"),
], ids=["cutlass_sm90a", "direct_sm80", "direct_int4_sm80", "direct_int4_g32_sm80", "wgmma_sm90a",
        "wgmma_unrolled_sm90a"])
def test_mixed_kernel_compiles_and_loads(tmp_path, text, library_name, kernel, arch):
    """One real kernel of each template: builds, loads (ABI size check), refuses to run without a
    GPU of its arch."""
    if not (os.environ.get("CUDACXX") or shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        pytest.skip("nvcc not found")
    toolchain.find_toolchain.cache_clear()
    report = builder.build_manifest(_write(tmp_path, text), tmp_path / "build", jobs=2,
                                    log=lambda line: None)
    assert report.kernel_count == 1
    library = load_library(tmp_path / "build" / library_name / "current")
    assert library.arch == arch and list(library.kernels) == [kernel]
    assert library.cdll.gemmgen_mixed_mm_args_size() == ctypes.sizeof(MixedMmArgs)
    args = MixedMmArgs()
    assert library.kernels[kernel].run(ctypes.byref(args), None, 0, None) == 5  # GEMMGEN_WRONG_ARCH
    assert kernel in library.last_error()


def test_tuner_hooks_pick_classes_and_knobs():
    """The mixed family's tuner hooks: every built class (filtered by --dtypes), raster × swizzle
    for every CUTLASS kernel, plus split counts for stream-K kernels; none for direct kernels."""
    from types import SimpleNamespace

    from gemmgen.families.mixed import tuning as hooks
    from gemmgen.tuning.measure import Candidate

    built = {("mixed_mm", "bf16", "int4", "scale"), ("mixed_mm", "fp16", "int8", "scale")}
    assert hooks.classes(built, SimpleNamespace(dtypes=())) == sorted(built)
    assert hooks.classes(built, SimpleNamespace(dtypes=("bf16",))) == [("mixed_mm", "bf16", "int4", "scale")]
    kernels = {k.name: k for k in expand(load_manifest(DEFAULT_MANIFEST_DIR / "mixed_sm90.yaml"))}
    streamk = next(SimpleNamespace(name=n, spec=s, config=s.config) for n, s in kernels.items()
                   if s.config.tile_scheduler == "streamk")
    plain = next(SimpleNamespace(name=n, spec=s, config=s.config) for n, s in kernels.items()
                 if s.config.tile_scheduler == "persistent" and not s.config.is_direct)
    direct = next(SimpleNamespace(name=n, spec=s, config=s.config) for n, s in kernels.items()
                  if s.config.is_direct)
    # the direct kernel has no raster, swizzle or split knobs: its default only, never retried
    assert hooks.knob_variants(direct) == [Candidate(direct.name)]
    assert not hooks.knobs_worth_trying(direct, 4096, 57344, 132)
    # the wgmma kernel: its launch-time K split, then each cluster size forced
    wgmma = next(SimpleNamespace(name=n, spec=s, config=s.config) for n, s in kernels.items()
                 if s.config.is_wgmma)
    assert hooks.knob_variants(wgmma) == [Candidate(wgmma.name)] + [
        Candidate(wgmma.name, split_k=s) for s in (2, 3, 4, 5, 6, 7, 8)]
    assert hooks.knobs_worth_trying(wgmma, 64, 4096, 132)
    # its splits are timed whatever its first-pass rank, up to four token tiles
    tokens = wgmma.config.tile[1]
    assert hooks.knobs_always_tried(wgmma, 4 * tokens, 4096, 132)
    assert not hooks.knobs_always_tried(wgmma, 4 * tokens + 1, 4096, 132)
    assert not hooks.knobs_always_tried(direct, 1, 4096, 132)
    assert not hooks.knobs_always_tried(streamk, 1, 4096, 132)
    variants = hooks.knob_variants(streamk)
    assert variants[0] == Candidate(streamk.name) and len(variants) == len(set(variants))
    assert {c.split_k for c in variants} == {1, 2, 4, 8}
    assert {c.split_k for c in hooks.knob_variants(plain)} == {1}
    assert hooks.knobs_worth_trying(streamk, 1, 4096, 132)           # split counts at small M
    assert not hooks.knobs_worth_trying(plain, 1, 4096, 132)         # one wave: no raster/swizzle
    assert hooks.output_tiles(plain, 1, 4096) == 4096 // plain.config.tile[0]


def test_a_tuned_table_may_set_the_wgmma_kernels_k_split(tmp_path):
    """The wgmma kernel's K split (its cluster size) is a run-time knob the tuner measures, so a
    table naming it with split_k loads (session 18 found such tables dropped at load with a
    warning); the direct kernel takes none."""
    from gemmgen.tuning.table import Bucket, ClassTable, ShapeEntry, load_table, render_table
    from gemmgen.generator.kernel_config import RuntimeKnobs
    specs = expand(load_manifest(DEFAULT_MANIFEST_DIR / "mixed_sm90.yaml"))
    wgmma = next(s for s in specs if s.config.is_wgmma)
    direct = next(s for s in specs if s.config.is_direct)
    assert wgmma.split_k and not direct.split_k
    key = wgmma.dispatch_class

    def table(kernel) -> str:
        buckets = (Bucket(64, kernel.name, RuntimeKnobs("heuristic", 1, 3)),)
        meta = {"library": "mixed", "arch": "sm90a", "kernel_set": "abc", "gpu": "NVIDIA H200",
                "sm_count": 132}
        return render_table(meta, [ClassTable(key, (ShapeEntry(10240, 8192, buckets),))])

    names = {s.name for s in specs}
    splittable = {s.name for s in specs if s.split_k}
    path = tmp_path / "t.yaml"
    path.write_text(table(wgmma))
    hit = load_table(path, known_kernels=names, split_k_kernels=splittable).classes[key].lookup(32, 10240, 8192)
    assert hit.bucket.kernel == wgmma.name and hit.bucket.knobs.split_k_slices == 3
    path.write_text(table(direct))
    with pytest.raises(ManifestError, match="was built without split-K"):
        load_table(path, known_kernels=names, split_k_kernels=splittable)


def test_dispatch_use_may_spell_default_keys(tmp_path):
    """A dispatch `use` mapping may spell a direct config's keys at their defaults
    (rows_per_warp 16, ctas_per_sm 0), as the config itself may."""
    text = """\
library: usedefaults
arch: sm90a
families:
  - name: mixed
    op: mixed_mm
    dtypes:
      - {a: bf16, w: int4}
    schemes: [scale]
    configs:
      - {name: wide, tile: [32, 16, 64], schedule: direct, warps_k: 4, rows_per_warp: 32}
      - {name: plain, tile: [32, 16, 64], schedule: direct, warps_k: 4}
      - {name: big, tile: [128, 256, 64], schedule: cooperative}
    dispatch:
      - {when: "m <= 8", use: {tile: [32, 16, 64], warps_k: 4, rows_per_warp: 16, ctas_per_sm: 0}}
      - {when: "m <= 16", use: {tile: [32, 16, 64], rows_per_warp: 32}}
      - {when: "true", use: big}
"""
    (family,) = load_manifest(_write(tmp_path, text)).families
    assert [family.configs[r.config_index].name for r in family.dispatch] == ["plain", "wide", "big"]


def test_group_32_classes_the_tables_never_saw_are_news_not_a_warning(caplog):
    """The shipped tuned tables were measured before the `_g32` kernels existed: a group-32
    lookup says (at INFO) that the rules serve it and why, instead of warning."""
    import logging

    from gemmgen import dispatch
    dispatch.cache_clear()
    with caplog.at_level(logging.INFO, logger="gemmgen.dispatch"):
        choice = dispatch.choose("mixed_mm", source="manifests", arch="sm90a", a_dtype="bf16",
                                 weight_type="uint4b8", m=16, n=4096, k=4096, group_size=32)
    assert choice.source == "rule" and choice.kernel.spec.scheme == "scale_g32"
    notes = [r for r in caplog.records if "has no entries for mixed_mm bf16 int4 scale_g32" in r.getMessage()]
    assert notes and all(r.levelno == logging.INFO for r in notes)
    assert "its kernels came after the tune" in notes[0].getMessage()
    dispatch.cache_clear()
