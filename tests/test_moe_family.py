"""The MoE family (grouped_matmul_swiglu_quant) on the CPU: manifest keys and rules (file:line
errors; the `dtypes` entries, scalar or {x, w, scales} mapping, A8W4's swap-AB rule and the
direct configs), expansion and
names, rendering, the dispatch request and the shipped rules of the four classes (op, x, w, scales)
(from the manifest, nothing built), the packed weight layouts (`pack_moe_weights` / `MoeWeight`,
8-bit and int4 nibbles), every argument check of the op and its A8W4 keywords on fake CUDA
tensors or before any CUDA work, and one real nvcc build of a MoE kernel of each kind (CUTLASS
and direct: the CI compile of this family's templates).

The group lists and the torch reference are tested in test_moe_reference.py."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode

import gemmgen
from gemmgen import dispatch
from gemmgen import families as registry
from gemmgen.bindings.library import load_library
from gemmgen.build import builder, toolchain
from gemmgen.errors import GemmgenError, ManifestError
from gemmgen.families.moe import FAMILY, ops, packing
from gemmgen.families.moe.abi import ARGS_LAYOUT, MoeArgs
from gemmgen.families.moe.configs import ELEMENTS, INTERMEDIATES
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest
from gemmgen.generator.render import render_bindings, render_kernel_sources, render_library_source
from gemmgen.settings import DEFAULT_MANIFEST_DIR

OP = "grouped_matmul_swiglu_quant"
INT8, FP8, BF16, UINT8 = torch.int8, torch.float8_e4m3fn, torch.bfloat16, torch.uint8
SHIPPED = DEFAULT_MANIFEST_DIR / "moe_sm90.yaml"
# the dispatch classes (op, x, w, scales) the family serves: A8W8 int8, fp8, A8W4 per channel and
# A8W4 per group (direct kernels)
I8, E4M3, A8W4 = (OP, "int8", "int8", "channel"), (OP, "e4m3", "e4m3", "channel"), (OP, "int8", "int4", "channel")
A8W4G = (OP, "int8", "int4", "group")

MANIFEST = """\
library: onemoe
arch: sm90a
kernels_per_file: 1
families:
  - name: moe
    op: grouped_matmul_swiglu_quant
    dtypes: [e4m3]
    configs:
      - name: mid
        tile: [128, 128, 128]
        cluster: [1, 1, 1]
        schedule: cooperative
        intermediate: bf16
    dispatch:
      - when: "true"
        use: mid
"""
KERNEL = "sm90a_grouped_matmul_swiglu_quant_e4m3_bf16_t128x128x128_c1x1x1_coop_sauto"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "moe.yaml"
    path.write_text(text)
    return path


def _line(text: str, needle: str) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


# ------------------------------------------------------------------------------- manifest

def test_shipped_manifest_expands_to_every_variant():
    manifest = load_manifest(SHIPPED)
    kernels = expand(manifest)
    classes = {k.dispatch_class for k in kernels}
    assert classes == {I8, E4M3, A8W4, A8W4G}
    assert [f.name for f in manifest.families] == ["moe_int8", "moe_e4m3", "moe_a8w4", "moe_a8w4_group"]
    assert len(kernels) == sum(len(f.configs) for f in manifest.families) == 60
    names = [k.name for k in kernels]
    assert len(set(names)) == len(names)
    assert all(n.startswith("sm90a_grouped_matmul_swiglu_quant_") for n in names)
    # fp8's accurate configs stop at 128x128 tiles (promoted accumulation spills a 128x256
    # cooperative tile); its fast-accumulation ones go to 128x256
    assert {(k.x, k.w, k.scales, k.origin.config) for k in kernels} == {
        ("int8", "int8", "channel", c) for c in ("decode", "small", "mid", "large", "wide",
                                                 "mid_fused", "large_fused", "wide_fused",
                                                 "mid_pp_fused", "wide_pp_fused",
                                                 "stream", "stream_wide")} | {
        ("e4m3", "e4m3", "channel", c) for c in ("decode", "small", "mid", "small_fused", "mid_fused",
                                                 "small_fa", "large_fa", "large_fa_c2",
                                                 "large_fa_bf16", "large_fa_c2_bf16", "small_fused_fa",
                                                 "mid_fused_fa", "large_fused_fa", "mid_pp_fused_fa",
                                                 "wide_pp_fused_fa", "small_fused_fa_bf16",
                                                 "wide_pp_fused_fa_bf16", "stream")} | {
        ("int8", "int4", "channel", c) for c in ("decode", "small", "mid", "mid_pp", "tall", "large",
                                                 "stream", "stream_wide",
                                                 "small_wgmma", "mid_wgmma", "wgmma16", "wgmma32",
                                                 "wgmma64", "wgmma80", "wgmma80_tma", "wgmma16_fused",
                                                 "wgmma32_fused", "wgmma80_tma_fused")} | {
        ("int8", "int4", "group", c) for c in ("stream", "stream_wide", "stream32", "wgmma16",
                                               "wgmma32", "wgmma32_s8", "wgmma64", "wgmma80",
                                               "wgmma64_tma", "wgmma16_fused", "wgmma32_s8_fused",
                                               "wgmma64_tma_fused")}
    # A8W4's fused kernels are the family's wgmma kernel, each the twin of an unfused one of the
    # same tile, stages and copy (the GPU tests compare the pair), S in fp32
    fused_wgmma = [k for k in kernels if k.config.fused and k.config.is_wgmma]
    assert len(fused_wgmma) == 6 and all(k.w == "int4" and k.c == "fp32" for k in fused_wgmma)
    assert all(any(not t.config.fused and t.config.is_wgmma and (t.scales, t.config.tile,
                                                               t.config.wgmma_stages, t.config.copy)
                   == (k.scales, k.config.tile, k.config.wgmma_stages, k.config.copy)
                   for t in kernels) for k in fused_wgmma)
    # CUTLASS's fused kernels: A8W8 only, never swap-AB; S in fp32 but fp8's two bf16-S tiles,
    # each the twin of an fp32-S one (the GPU tests compare the pair)
    fused = [k for k in kernels if k.config.fused and not k.config.is_wgmma]
    assert {k.origin.config for k in fused} == {"mid_fused", "large_fused", "wide_fused", "small_fused",
                                                "mid_pp_fused", "wide_pp_fused", "small_fused_fa",
                                                "mid_fused_fa", "large_fused_fa", "mid_pp_fused_fa",
                                                "wide_pp_fused_fa", "small_fused_fa_bf16",
                                                "wide_pp_fused_fa_bf16"}
    assert len(fused) == 14 and all(k.name.endswith(("_fused", "_fused_fa")) for k in fused)
    assert all(k.w != "int4" and not k.config.swap_ab for k in fused)
    bf16_s = [k for k in fused if k.c != "fp32"]
    assert {k.origin.config for k in bf16_s} == {"small_fused_fa_bf16", "wide_pp_fused_fa_bf16"}
    assert all(k.c == "bf16" and k.x == "e4m3" and k.config.fast_accum for k in bf16_s)
    assert all(any(t.c == "fp32" and (t.config.tile, t.config.schedule, t.config.fast_accum)
                   == (k.config.tile, k.config.schedule, k.config.fast_accum) for t in fused)
               for k in bf16_s)
    # A8W4 kernels, and only they, are named `_i8w4_` (per group `_i8w4g_`); every one is swap-AB
    # or the family's own (direct, wgmma); per-group kernels are the family's own
    assert {k.name for k in kernels if "_i8w4_" in k.name} == {
        k.name for k in kernels if k.w == "int4" and k.scales == "channel"}
    assert {k.name for k in kernels if "_i8w4g_" in k.name} == {k.name for k in kernels if k.scales == "group"}
    assert all(k.config.swap_ab != k.config.is_own for k in kernels if k.w == "int4")
    assert all(k.config.is_own for k in kernels if k.scales == "group")
    assert all(k.x == "int8" for k in kernels if k.config.is_wgmma)
    assert {k.origin.config for k in kernels if k.config.is_direct and k.x == "e4m3"} == {"stream"}
    assert all(k.w == "int4" for k in kernels if k.config.is_wgmma)
    assert all(k.d == k.x for k in kernels)  # q is always x's type, int8 for A8W4
    # the defaults the shipped manifest relies on: fp32 intermediate (but fp8's two unfused
    # 128x256 bf16-C tiles and two bf16-S fused tiles, the rules' picks past decode: int8 and
    # A8W4 q stay exact to the float32 pipeline), stages auto (CUTLASS)
    assert {k.origin.config for k in kernels if k.c != "fp32"} == {
        "large_fa_bf16", "large_fa_c2_bf16", "small_fused_fa_bf16", "wide_pp_fused_fa_bf16"}
    assert all(k.c == "bf16" and k.x == "e4m3" for k in kernels if k.c != "fp32")
    assert all(k.config.stages == 0 for k in kernels if not k.config.is_own)
    assert "sm90a_grouped_matmul_swiglu_quant_i8w4g_f32_t64x8x128_direct_wk2_s4" in names
    assert "sm90a_grouped_matmul_swiglu_quant_i8_f32_t128x16x128_c1x1x1_pp_sauto_swap" in names
    assert "sm90a_grouped_matmul_swiglu_quant_i8w4_f32_t128x16x128_c1x1x1_pp_sauto_swap" in names
    assert "sm90a_grouped_matmul_swiglu_quant_i8w4_f32_t128x128x128_c1x1x1_coop_sauto_swap" in names


def test_kernel_name_and_fields(tmp_path):
    (kernel,) = expand(load_manifest(_write(tmp_path, MANIFEST)))
    assert kernel.name == KERNEL
    assert (kernel.x, kernel.w, kernel.d, kernel.c) == ("e4m3", "e4m3", "e4m3", "bf16")
    assert kernel.dispatch_class == E4M3 and not kernel.split_k
    assert kernel.origin.family == "moe" and kernel.origin.config == "mid"


_AFTER = "        schedule: cooperative\n"


def _add(*lines: str) -> tuple[str, str]:
    """(old, new) that add config keys, each on a line of its own, after `schedule`."""
    return _AFTER, _AFTER + "".join(f"        {line}\n" for line in lines)


@pytest.mark.parametrize("edits,key,needle,message", [
    ([("dtypes: [e4m3]", "dtypes: [int4]")], "dtypes", "dtypes:", "unknown value 'int4'"),
    ([("dtypes: [e4m3]", "dtypes: [e4m3, e4m3]")], "dtypes", "dtypes:", "listed twice"),
    ([("dtypes: [e4m3]", "dtypes: [int8, {x: int8}]")], "dtypes", "dtypes:", "listed twice"),
    ([("dtypes: [e4m3]", "dtypes: [{x: e4m3, w: int4}]")], "w", "dtypes:",
     r"the kernels serve \(x, w\) = \(int8, int8\), \(e4m3, e4m3\), \(int8, int4\); got \(e4m3, int4\)"),
    ([("dtypes: [e4m3]", "dtypes: [{x: int8, w: e4m3}]")], "w", "dtypes:", r"got \(int8, e4m3\)$"),
    ([("dtypes: [e4m3]", "dtypes: [{x: int4, w: int4}]")], "x", "dtypes:",
     f"unknown value 'int4'; expected one of {', '.join(ELEMENTS)}$"),
    ([("dtypes: [e4m3]", "dtypes: [{x: int8, w: int2}]")], "w", "dtypes:",
     "unknown value 'int2'; expected one of int8, e4m3, int4$"),
    ([("dtypes: [e4m3]", "dtypes: [{w: int4}]")], "x", "dtypes:", r"missing required key in dtypes\[0\]"),
    ([("dtypes: [e4m3]", "dtypes: [int8, {x: int8, bits: 4}]")], "bits", "dtypes:",
     r"unknown key in dtypes\[1\]; allowed keys: scales, w, x"),
    # int4 weights: every config of the family swap-AB (the error at swap_ab, else at tile)
    ([("dtypes: [e4m3]", "dtypes: [{x: int8, w: int4}]")], "tile", "tile:",
     r"int4 weights \(A8W4\) need swap_ab: true"),
    ([("dtypes: [e4m3]", "dtypes: [int8, {x: int8, w: int4}]")], "tile", "tile:",
     r"int4 weights \(A8W4\) need swap_ab: true"),
    ([("dtypes: [e4m3]", "dtypes: {x: int8, w: int4}"), _add("swap_ab: false")], "swap_ab",
     "swap_ab:", r"int4 weights \(A8W4\) need swap_ab: true \(or schedule: direct\): CUTLASS's mixed-input mainloop"),
    ([("tile: [128, 128, 128]", "tile: [128, 128, 64]")], "tile", "tile:",
     "tile K must be 128 or 256"),
    ([("tile: [128, 128, 128]", "tile: [128, 12, 128]")], "tile", "tile:",
     r"tile N must be a multiple of 8 in \[8, 256\]; got 12"),
    ([("tile: [128, 128, 128]", "tile: [96, 128, 128]")], "tile", "tile:",
     "tile M must be 64, 128, 192 or 256"),
    ([("tile: [128, 128, 128]", "tile: [64, 128, 128]")], "schedule", "schedule:",
     "tile M must be a multiple of 128; got 64"),
    ([("cluster: [1, 1, 1]", "cluster: [3, 1, 1]")], "cluster", "cluster:",
     "cluster M must be a power of two"),
    ([_add('swap_ab: "yes"')], "swap_ab", "swap_ab:", "expected true or false, got 'yes'"),
    ([("intermediate: bf16", "intermediate: fp16")], "intermediate", "intermediate:",
     f"unknown value 'fp16'; expected one of {', '.join(INTERMEDIATES)}"),
    ([_add("stages: 1")], "stages", "stages:", r"expected 'auto' or an integer in \[2, 16\]"),
    ([("tile: [128, 128, 128]", "tile: [256, 256, 256]"), _add("stages: 8")], "stages", "stages:",
     "8 stages of tile 256x256x256 need .* shared memory, over the sm90 limit"),
    ([("tile: [128, 128, 128]", "tile: [256, 256, 256]")], "stages", "name: mid",
     r"the minimum of 2 stages \(stages: auto\) of tile 256x256x256 need .* over the sm90 limit"),
    ([_add("split_k: 2")], "split_k", "split_k:", r"unknown key in configs\[0\]"),
    # fused: not swap-AB, not A8W4, a boolean
    ([_add("fused: 1")], "fused", "fused:", "expected true or false, got 1"),
    ([("intermediate: bf16", "intermediate: fp32"), _add("swap_ab: true", "fused: true")], "fused",
     "fused:", "a fused config cannot be swap_ab: its epilogue pairs act and gate as adjacent columns"),
    ([("dtypes: [e4m3]", "dtypes: [int8, {x: int8, w: int4}]"), ("intermediate: bf16", "intermediate: fp32"),
      _add("swap_ab: true", "fused: true")], "fused", "fused:",
     "a fused config cannot be swap_ab"),
    ([_add("raster: diagonal")], "raster", "raster:", "unknown value 'diagonal'"),
    ([('when: "true"', 'when: "m <= 16"')], "when", "when:",
     "unknown variable 'm' .* allowed: tokens_per_expert, experts, n, k, rows"),
])
def test_manifest_errors_name_file_line_key(tmp_path, edits, key, needle, message):
    text = MANIFEST
    for old, new in edits:
        assert text.count(old) == 1
        text = text.replace(old, new)
    path = _write(tmp_path, text)
    with pytest.raises(ManifestError, match=message) as info:
        expand(load_manifest(path))
    assert (info.value.file, info.value.key) == (str(path), key)
    assert info.value.line == _line(text, needle)


def test_legal_edges_and_run_time_knobs(tmp_path):
    """Tile M 192 / tile N 8 / tile K 256, a 2x2 cluster, explicit stages; a second config that
    differs only in run-time knobs is a duplicate kernel."""
    edge = ("      - name: edge\n        tile: [192, 8, 256]\n        cluster: [2, 2, 1]\n"
            "        schedule: pingpong\n        stages: 3\n        swap_ab: true\n"
            "        raster: along_m\n        swizzle: 4\n    dispatch:")
    text = MANIFEST.replace("    dispatch:", edge)
    kernels = expand(load_manifest(_write(tmp_path, text)))
    assert [k.name for k in kernels] == [
        KERNEL, "sm90a_grouped_matmul_swiglu_quant_e4m3_f32_t192x8x256_c2x2x1_pp_s3_swap"]
    assert (kernels[1].knobs.raster, kernels[1].knobs.swizzle) == ("along_m", 4)
    twin = ("      - name: twin\n        tile: [128, 128, 128]\n        cluster: [1, 1, 1]\n"
            "        schedule: cooperative\n        intermediate: bf16\n        raster: along_n\n"
            "    dispatch:")
    text = MANIFEST.replace("    dispatch:", twin)
    with pytest.raises(ManifestError, match="duplicate kernel: same compile-time config as line 9 "
                                            r"\(raster and swizzle are run-time knobs") as info:
        expand(load_manifest(_write(tmp_path, text)))
    assert info.value.line == _line(text, "name: twin")


def test_the_tile_order_defaults_to_an_experts_token_tiles_first(tmp_path):
    """A CUTLASS config left without `raster` walks an expert's token tiles first: along M when
    not swap-AB (CUTLASS's heuristic, blind to sizes that live on the device, would walk along N),
    CUTLASS's heuristic (along N: the tokens) when swap-AB; a raster the manifest names stands.
    The tuner times a non-swap config in both orders, a swap-AB or own-kernel config in its own,
    and only past one wave of output tiles."""
    from gemmgen.families.moe import tuning
    from gemmgen.tuning.measure import Candidate
    configs = ("      - name: swapped\n        tile: [128, 64, 128]\n        cluster: [1, 1, 1]\n"
               "        schedule: pingpong\n        swap_ab: true\n"
               "      - name: named\n        tile: [128, 256, 128]\n        cluster: [1, 1, 1]\n"
               "        schedule: cooperative\n        raster: heuristic\n"
               "      - name: own\n        tile: [64, 8, 128]\n        schedule: direct\n"
               "        warps_k: 2\n    dispatch:")
    path = _write(tmp_path, MANIFEST.replace("    dispatch:", configs))
    kernels = {k.spec.origin.config: k for k in dispatch.kernels(OP, source="manifests", manifests=[path])}
    assert {name: k.spec.knobs.raster for name, k in kernels.items()} == {
        "mid": "along_m", "swapped": "heuristic", "named": "heuristic", "own": "heuristic"}
    mid, named = kernels["mid"], kernels["named"]
    assert tuning.knob_variants(mid) == [Candidate(mid.name, "along_m"), Candidate(mid.name, "heuristic")]
    assert tuning.knob_variants(named) == [Candidate(named.name), Candidate(named.name, "along_m")]
    for name in ("swapped", "own"):
        assert tuning.knob_variants(kernels[name]) == [Candidate.of(kernels[name])]
    # 128x128 tiles: 4 x 32 = 128 output tiles of 512 rows and N 4096 fit 132 SMs; 640 rows do not
    assert not tuning.knobs_worth_trying(mid, 512, 4096, 132)
    assert tuning.knobs_worth_trying(mid, 640, 4096, 132)


_SWAP = _add("swap_ab: true")


@pytest.mark.parametrize("dtypes,classes", [
    ("int8", [I8]),
    ("[e4m3]", [E4M3]),
    ("{x: int8, w: int4}", [A8W4]),
    ("[{x: int8, w: int4}]", [A8W4]),
    ("[{x: int8, w: int8}, {x: e4m3}]", [I8, E4M3]),
    ("[int8, e4m3, {x: int8, w: int4}]", [I8, E4M3, A8W4]),
    ("\n      - e4m3\n      - x: int8\n        w: int4", [E4M3, A8W4]),
])
def test_dtypes_entries_scalar_or_mapping(tmp_path, dtypes, classes):
    """A `dtypes` entry is an x (w = x) or a mapping {x, w} (w defaults to x); one entry or a
    list. Each (x, w) is a dispatch class of its own; A8W4 kernels are named `_i8w4_`."""
    text = MANIFEST.replace("dtypes: [e4m3]", f"dtypes: {dtypes}").replace(*_SWAP)
    kernels = expand(load_manifest(_write(tmp_path, text)))
    assert sorted(k.dispatch_class for k in kernels) == sorted(classes)
    tag, config = {"int8": "i8", "e4m3": "e4m3"}, "bf16_t128x128x128_c1x1x1_coop_sauto_swap"
    for k in kernels:
        element = tag[k.x] + ("w4" if k.w == "int4" else "")
        assert k.name == f"sm90a_grouped_matmul_swiglu_quant_{element}_{config}"
        assert k.d == k.x


_BLOCK = "dtypes:\n      - int8\n      - x: int8\n        w: int4"


@pytest.mark.parametrize("old,new,key,needle,message", [
    ("w: int4", "w: e4m3", "w", "w: e4m3", r"got \(int8, e4m3\)"),
    ("w: int4", "w: int2", "w", "w: int2", "unknown value 'int2'"),
    ("- x: int8", "- x: bf16", "x", "x: bf16", "unknown value 'bf16'"),
    ("w: int4", "w: int4\n        group: 128", "group", "group:", r"unknown key in dtypes\[1\]"),
    ("- x: int8\n        w: int4", "- w: int4", "x", "- w: int4", r"missing required key in dtypes\[1\]"),
    ("- int8", "- int4", "dtypes", "dtypes:",
     f"unknown value 'int4'; expected one of {', '.join(ELEMENTS)} or a mapping"),
])
def test_block_dtypes_mapping_errors_name_their_line(tmp_path, old, new, key, needle, message):
    """In block style each key of a dtypes mapping sits on its own line: the error points there."""
    text = MANIFEST.replace("dtypes: [e4m3]", _BLOCK).replace(*_SWAP)
    expand(load_manifest(_write(tmp_path, text)))  # the unedited block is valid
    assert text.count(old) == 1
    text = text.replace(old, new)
    path = _write(tmp_path, text)
    with pytest.raises(ManifestError, match=message) as info:
        expand(load_manifest(path))
    assert (info.value.file, info.value.key, info.value.line) == (str(path), key, _line(text, needle))


# ------------------------------------------------------------------------------- wgmma configs

_WGMMA_MANIFEST = MANIFEST.replace("dtypes: [e4m3]", "dtypes: [{x: int8, w: int4}]").replace(
    """        tile: [128, 128, 128]
        cluster: [1, 1, 1]
        schedule: cooperative
        intermediate: bf16
""", """        tile: [128, 64, 128]
        schedule: wgmma
""")
_WGMMA_KERNEL = "sm90a_grouped_matmul_swiglu_quant_i8w4_f32_t128x64x128_wgmma_s4"
_WGMMA_GROUP_KERNEL = "sm90a_grouped_matmul_swiglu_quant_i8w4g_f32_t128x64x128_wgmma_s4"


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("copy", ["", "cp_async", "tma"])
@pytest.mark.parametrize("scales,per_group", [("", "false"), (", scales: group", "true")])
def test_wgmma_config_renders(tmp_path, scales, per_group, copy, fused):
    """schedule: wgmma (A8W4, per channel or per group): named `_wgmma_s<stages>` (auto 4), with
    `_tma` when the TMA fills its ring (`copy: tma`; cp_async, the default, adds nothing) and
    `_fused` with SwiGLU in its epilogue (`fused: true`), rendered as a WgmmaConfig run through
    WgmmaSwigluQuant, without the CUTLASS headers."""
    text = _WGMMA_MANIFEST.replace("w: int4}", f"w: int4{scales}}}")
    if copy:
        text = text.replace("schedule: wgmma", f"schedule: wgmma\n        copy: {copy}")
    if fused:
        text = text.replace("schedule: wgmma", "schedule: wgmma\n        fused: true")
    manifest = load_manifest(_write(tmp_path, text))
    (kernel,) = expand(manifest)
    tma = copy == "tma"
    assert kernel.name == ((_WGMMA_GROUP_KERNEL if scales else _WGMMA_KERNEL) + ("_tma" if tma else "")
                           + ("_fused" if fused else ""))
    assert kernel.config.is_wgmma and kernel.config.is_own and not kernel.config.is_direct
    assert kernel.config.fused == fused
    (unit,) = render_kernel_sources(manifest, [kernel])
    assert ("gemmgen::moe::wgmma::WgmmaConfig<cutlass::int4b_t, /*per_group=*/" + per_group +
            ", /*warp_groups=*/2, /*tokens=*/64, /*stages=*/4, /*tma=*/" +
            ("true" if tma else "false") + ", /*fused=*/" + ("true" if fused else "false")
            + "> {};") in unit.source
    assert "gemmgen::moe::wgmma::WgmmaSwigluQuant<Config0>::run(" in unit.source
    assert '#include "gemmgen/moe/wgmma_grouped_gemm.cuh"' in unit.source
    assert "sm90_grouped_swiglu_quant.hpp" not in unit.source
    assert ("wgmma (int4 -> int8 in registers)" + (", fused: " if fused else ": ") + "int8 x int4"
            in unit.source)
    assert ("SwiGLU in the epilogue -> fp32 S + row max" in unit.source) == fused
    assert FAMILY.config_fields(manifest.families[0].configs[0]) == {
        "tile": [128, 64, 128], "schedule": "wgmma", "stages": "auto", "intermediate": "fp32",
        "cluster": [1, 1, 1], "swap_ab": False, "fused": fused,
        "fast_accum": False, "copy": "tma" if tma else "cp_async"}  # defaults a config may spell


@pytest.mark.parametrize("old,new,key,message", [
    ("tile: [128, 64, 128]", "tile: [128, 40, 128]", "tile",
     r"the wgmma kernel's tile is \[64 or 128 features .* tokens \(16, 32, 48, 64, 80, 96, 112, "
     r"128: the int8 wgmma's N\), 128\]; got \[128, 40, 128\]"),
    ("tile: [128, 64, 128]", "tile: [128, 80, 128]", None, None),  # valid: the wgmma has N = 80
    ("tile: [128, 64, 128]", "tile: [128, 48, 128]", None, None),  # and 48
    ("tile: [128, 64, 128]", "tile: [256, 64, 128]", "tile", "got \\[256, 64, 128\\]"),
    ("tile: [128, 64, 128]", "tile: [128, 64, 256]", "tile", "got \\[128, 64, 256\\]"),
    ("w: int4}", "w: int4, scales: group}", None, None),  # valid: per group at 64 tokens
    ("tile: [128, 64, 128]", "tile: [128, 128, 128]", None, None),  # valid per channel
    ("schedule: wgmma", "schedule: wgmma\n        stages: 2", "stages",
     r"the wgmma kernel's ring holds 3 to 8 chunks \(auto: 4\); got 2"),
    ("schedule: wgmma", "schedule: wgmma\n        stages: 9", "stages", "got 9"),
    ("schedule: wgmma", "schedule: wgmma\n        cluster: [1, 2, 1]", "cluster",
     "the wgmma kernel has no clusters"),
    ("schedule: wgmma", "schedule: wgmma\n        swap_ab: true", "swap_ab",
     r"not with schedule wgmma \(the weight is the wgmma's A by design\)"),
    ("schedule: wgmma", "schedule: wgmma\n        fused: true", None, None),  # valid: it fuses
    ("schedule: wgmma", "schedule: direct\n        warps_k: 2\n        fused: true", "fused",
     r"not with schedule direct \(SwiGLU runs in the pass after it; schedule wgmma fuses\)"),
    ("schedule: wgmma", "schedule: wgmma\n        fused: true\n        intermediate: bf16",
     "intermediate", r"fp32 for schedule wgmma \(it writes C, or fused S, in fp32"),
    ("schedule: wgmma", "schedule: wgmma\n        warps_k: 2", "warps_k",
     "warps_k belongs to schedule direct"),
    ("schedule: wgmma", "schedule: wgmma\n        intermediate: bf16", "intermediate",
     "fp32 for schedule wgmma"),
    ("schedule: wgmma", "schedule: wgmma\n        raster: along_m", "raster",
     "the wgmma kernel has no tile scheduler, so no raster"),
    ("dtypes: [{x: int8, w: int4}]", "dtypes: [int8]", "schedule",
     r"the wgmma kernel serves A8W4 \(x: int8, w: int4\) only; this family lists \(int8, int8\)"),
    ("schedule: wgmma", "schedule: wgmma\n        copy: bulk", "copy",
     "unknown value 'bulk'; expected one of cp_async, tma"),
    ("schedule: wgmma", "schedule: direct\n        warps_k: 2\n        copy: tma", "copy",
     "copy belongs to schedule wgmma .*; got schedule 'direct'"),
    ("tile: [128, 64, 128]\n        schedule: wgmma",
     "tile: [128, 64, 128]\n        schedule: pingpong\n        swap_ab: true\n        copy: tma",
     "copy", "copy belongs to schedule wgmma .*; got schedule 'pingpong'"),
])
def test_wgmma_config_errors(tmp_path, old, new, key, message):
    text = _WGMMA_MANIFEST
    assert text.count(old) == 1
    text = text.replace(old, new)
    path = _write(tmp_path, text)
    if key is None:
        assert len(expand(load_manifest(path))) == 1
        return
    with pytest.raises(ManifestError, match=message) as info:
        expand(load_manifest(path))
    assert (info.value.file, info.value.key) == (str(path), key)


@pytest.mark.parametrize("tile,ok", [("[128, 128, 128]", False), ("[128, 80, 128]", False),
                                      ("[128, 64, 128]", True), ("[64, 80, 128]", True),
                                      ("[64, 96, 128]", False)])
def test_wgmma_per_group_tile_n_at_most_64_or_80_with_one_warpgroup(tmp_path, tile, ok):
    """Per group the wgmma kernel holds a float32 sum beside its accumulators: tile N is at most
    64 with two warpgroups, 80 with one (three CTAs an SM); wider tiles are refused there (and
    allowed per channel, above)."""
    text = _WGMMA_MANIFEST.replace("w: int4}", "w: int4, scales: group}").replace(
        "tile: [128, 64, 128]", f"tile: {tile}")
    if ok:
        assert expand(load_manifest(_write(tmp_path, text)))
        return
    with pytest.raises(ManifestError, match="with per-group scales the wgmma kernel's tile N is "
                                            "at most 64 with two warpgroups .* and 80 with one "
                                            f".*; got {re.escape(tile)}") as info:
        expand(load_manifest(_write(tmp_path, text)))
    assert info.value.key == "tile"


# ------------------------------------------------------------------------------- rendering

def test_render_names_the_manifest_entry_and_checks_the_arch(tmp_path):
    manifest = load_manifest(_write(tmp_path, MANIFEST))
    kernels = expand(manifest)
    (unit,) = render_kernel_sources(manifest, kernels)
    assert '#include "gemmgen/moe/sm90_grouped_swiglu_quant.hpp"' in unit.source
    assert "gemmgen::device_supports(9, 0, 9, 0)" in unit.source
    assert ("MoeConfig<\n    cutlass::float_e4m3_t, cutlass::float_e4m3_t, cutlass::bfloat16_t, "
            "/*swap_ab=*/false" in unit.source)
    assert "e4m3 x e4m3 -> bf16 C -> SwiGLU -> e4m3 q" in unit.source
    assert "/*cooperative=*/true" in unit.source and "/*stages (0 = auto)=*/0" in unit.source
    assert "Shape<_128, _128, _128>, Shape<_1, _1, _1>" in unit.source
    assert "family 'moe', config 'mid'" in unit.source
    assert f"gemmgen_run_{KERNEL}(const gemmgen_moe_args* args" in unit.source
    assert f"gemmgen_workspace_{KERNEL}(const gemmgen_moe_args* args)" in unit.source
    library = render_library_source(manifest, 1, "f" * 16, kernels)
    assert "gemmgen_moe_args_size" in library and '"gemmgen/moe/moe_args.h"' in library
    namespace: dict = {}
    exec(compile(render_bindings(manifest, kernels, "f" * 16, "lib.so"), "bindings.py", "exec"), namespace)
    assert namespace["KERNELS"] == tuple(kernels)
    assert list(namespace["DISPATCH"]) == [E4M3]


def test_render_shipped_manifest_spells_every_variant():
    manifest = load_manifest(SHIPPED)
    kernels = expand(manifest)
    units = render_kernel_sources(manifest, kernels)
    assert len(units) == len(kernels)  # kernels_per_file: 1
    element = {"int8": "int8_t", "e4m3": "cutlass::float_e4m3_t", "int4": "cutlass::int4b_t"}
    for unit in units:
        (k,) = unit.kernels
        if k.config.is_wgmma:
            c = k.config
            assert (f"gemmgen::moe::wgmma::WgmmaConfig<{element[k.w]}, /*per_group=*/"
                    f"{'true' if k.scales == 'group' else 'false'}, /*warp_groups=*/{c.tile[0] // 64}, "
                    f"/*tokens=*/{c.tile[1]}, /*stages=*/{c.wgmma_stages}, "
                    f"/*tma=*/{'true' if c.copy == 'tma' else 'false'}, "
                    f"/*fused=*/{'true' if c.fused else 'false'}> {{}};") in unit.source
            assert '#include "gemmgen/moe/wgmma_grouped_gemm.cuh"' in unit.source
            assert "sm90_grouped_swiglu_quant.hpp" not in unit.source
            assert "gemmgen::moe::wgmma::WgmmaSwigluQuant<Config0>::run(" in unit.source
            assert f"family '{k.origin.family}', config '{k.origin.config}'" in unit.source
            continue
        if k.config.is_direct:
            c = k.config
            assert (f"gemmgen::moe::direct::DirectConfig<{element[k.w]}, /*warps_n=*/{c.tile[0] // 16}, "
                    f"/*warps_k=*/{c.warps_k}, /*token_tiles=*/{c.tile[1] // 8}, "
                    f"/*stages=*/{c.ring_stages}> {{}};") in unit.source
            assert (f"direct (mma.sync): {k.x} x {k.w} ({k.scales} scales) -> fp32 C -> SwiGLU -> "
                    f"{k.x} q") in unit.source
            assert '#include "gemmgen/moe/direct_grouped_gemm.cuh"' in unit.source
            assert "sm90_grouped_swiglu_quant.hpp" not in unit.source  # no CUTLASS 3.x kernel here
            assert "gemmgen::moe::direct::DirectSwigluQuant<Config0>::run(" in unit.source
            assert f"family '{k.origin.family}', config '{k.origin.config}'" in unit.source
            continue
        swap = "true" if k.config.swap_ab else "false"
        c_element = {"fp32": "float", "bf16": "cutlass::bfloat16_t"}[k.config.intermediate]
        assert f"MoeConfig<\n    {element[k.x]}, {element[k.w]}, {c_element}, /*swap_ab=*/{swap}" in unit.source
        assert "direct_grouped_gemm.cuh" not in unit.source
        fast = " (fp8 fast accumulation)" if k.config.fast_accum else ""
        assert k.config.fast_accum == k.name.endswith("_fa") and (not fast or k.x == "e4m3")
        assert f"/*fast_accum=*/{'true' if fast else 'false'}> {{}};" in unit.source
        if k.config.fused:
            assert (f"{k.x} x {k.w}{fast} -> SwiGLU in the epilogue -> {k.config.intermediate} S + row max "
                    f"-> {k.x} q") in unit.source
            assert "/*fused=*/true," in unit.source
        else:
            assert f"{k.x} x {k.w}{fast} -> {k.config.intermediate} C -> SwiGLU -> {k.x} q" in unit.source
            assert "/*fused=*/false," in unit.source
        assert f"family '{k.origin.family}', config '{k.origin.config}'" in unit.source
        assert "gemmgen::device_supports(9, 0, 9, 0)" in unit.source
    assert len({unit.name for unit in units}) == len(units)
    assert {(k.w, k.origin.config) for k in kernels if k.config.swap_ab} == {
        (w, c) for w in ("int8", "e4m3") for c in ("decode", "small")} | {
        ("int4", c) for c in ("decode", "small", "mid", "mid_pp", "tall", "large")} | {("e4m3", "small_fa")}
    assert {k.origin.config for k in kernels if k.config.fast_accum} == {
        "small_fa", "large_fa", "large_fa_c2", "large_fa_bf16", "large_fa_c2_bf16", "small_fused_fa",
        "mid_fused_fa", "large_fused_fa", "mid_pp_fused_fa", "wide_pp_fused_fa", "small_fused_fa_bf16",
        "wide_pp_fused_fa_bf16"}
    assert sum("int8_t, cutlass::int4b_t, float, /*swap_ab=*/true" in u.source for u in units) == 6
    namespace: dict = {}
    exec(compile(render_bindings(manifest, kernels, "f" * 16, "lib.so"), "bindings.py", "exec"), namespace)
    assert set(namespace["DISPATCH"]) == {I8, E4M3, A8W4, A8W4G}


def test_bf16_intermediate_spelling(tmp_path):
    text = MANIFEST.replace("dtypes: [e4m3]", "dtypes: [int8]")
    manifest = load_manifest(_write(tmp_path, text))
    (unit,) = render_kernel_sources(manifest, expand(manifest))
    assert "MoeConfig<\n    int8_t, int8_t, cutlass::bfloat16_t, /*swap_ab=*/false" in unit.source


def test_fused_config_name_and_rendering(tmp_path):
    """A fused config: its own name (`_fused`), MoeConfig's Fused flag, the header comment."""
    text = MANIFEST.replace("dtypes: [e4m3]", "dtypes: [int8]").replace("intermediate: bf16", "intermediate: fp32")
    text = text.replace(*_add("fused: true"))
    manifest = load_manifest(_write(tmp_path, text))
    (kernel,) = kernels = expand(manifest)
    assert kernel.config.fused and not kernel.config.swap_ab
    assert kernel.name == "sm90a_grouped_matmul_swiglu_quant_i8_f32_t128x128x128_c1x1x1_coop_sauto_fused"
    (unit,) = render_kernel_sources(manifest, kernels)
    assert "/*stages (0 = auto)=*/0, /*fused=*/true,\n    /*fast_accum=*/false> {};" in unit.source
    assert "int8 x int8 -> SwiGLU in the epilogue -> fp32 S + row max -> int8 q" in unit.source
    assert FAMILY.config_fields(manifest.families[0].configs[0])["fused"] is True
    unfused = load_manifest(_write(tmp_path, text.replace("fused: true", "fused: false")))
    (plain,) = render_kernel_sources(unfused, expand(unfused))
    assert "/*fused=*/false," in plain.source and "-> fp32 C -> SwiGLU" in plain.source


def test_fast_accum_config_name_rendering_and_fields(tmp_path):
    """`fast_accum: true` on an e4m3 config: the `_fa` name, MoeConfig's FastAccum flag (the
    FP8FastAccum schedules), the header comment, the config's fields."""
    text = MANIFEST.replace(*_add("fast_accum: true"))
    manifest = load_manifest(_write(tmp_path, text))
    (kernel,) = kernels = expand(manifest)
    assert kernel.config.fast_accum and kernel.name == KERNEL + "_fa"
    (unit,) = render_kernel_sources(manifest, kernels)
    assert "/*fused=*/false,\n    /*fast_accum=*/true> {};" in unit.source
    assert "e4m3 x e4m3 (fp8 fast accumulation) -> bf16 C -> SwiGLU -> e4m3 q" in unit.source
    assert FAMILY.config_fields(manifest.families[0].configs[0])["fast_accum"] is True
    header = (Path(FAMILY.include_dir) / "gemmgen" / "moe" / "sm90_grouped_swiglu_quant.hpp").read_text()
    assert "KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum" in header
    assert "KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum" in header


@pytest.mark.parametrize("family_dtypes, extra, key, message", [
    ("[int8]", "fast_accum: true", "fast_accum", "e4m3 families only: int8 MMAs accumulate in int32"),
    ("[e4m3]", "fast_accum: yes please", "fast_accum", "expected true or false"),
])
def test_fast_accum_errors_name_the_key_and_line(tmp_path, family_dtypes, extra, key, message):
    text = MANIFEST.replace("dtypes: [e4m3]", f"dtypes: {family_dtypes}").replace(*_add(extra))
    path = _write(tmp_path, text)
    with pytest.raises(ManifestError, match=re.escape(message)) as info:
        expand(load_manifest(path))
    assert info.value.key == key and info.value.line == _line(text, "fast_accum")


def test_fast_accum_on_the_family_s_own_kernels_is_refused(tmp_path):
    """An e4m3 direct config takes no fast_accum (the kernel has one way to sum e4m3); an int8
    family is refused first, for any schedule."""
    text = MANIFEST.replace("""      - name: mid
        tile: [128, 128, 128]
        cluster: [1, 1, 1]
        schedule: cooperative
        intermediate: bf16""", """      - name: mid
        tile: [64, 8, 128]
        schedule: direct
        warps_k: 2
        fast_accum: false""")
    expand(load_manifest(_write(tmp_path, text)))  # false is the default: accepted
    fast = text.replace("fast_accum: false", "fast_accum: true")
    with pytest.raises(ManifestError, match="not with schedule direct .it sums int8 exactly and "
                                            "e4m3 in float32 accumulators") as info:
        expand(load_manifest(_write(tmp_path, fast)))
    assert info.value.key == "fast_accum" and info.value.line == _line(fast, "fast_accum")
    with pytest.raises(ManifestError, match="e4m3 families only") as info:
        expand(load_manifest(_write(tmp_path, fast.replace("dtypes: [e4m3]", "dtypes: [int8]"))))
    assert info.value.key == "fast_accum"


def test_a8w4_with_fused_is_refused(tmp_path):
    text = MANIFEST.replace("dtypes: [e4m3]", "dtypes: [{x: int8, w: int4}]").replace(
        "intermediate: bf16", "intermediate: fp32").replace(*_add("fused: true"))
    with pytest.raises(ManifestError, match="fused config cannot be swap_ab|int4") as info:
        expand(load_manifest(_write(tmp_path, text)))
    assert info.value.key in ("fused", "tile", "swap_ab")


def test_a8w4_renders_int4_weights(tmp_path):
    """An A8W4 kernel: int8 activations, CUTLASS's int4b_t weights, swap-AB, its own class."""
    text = MANIFEST.replace("dtypes: [e4m3]", "dtypes: [{x: int8, w: int4}]").replace(*_SWAP)
    manifest = load_manifest(_write(tmp_path, text))
    (kernel,) = kernels = expand(manifest)
    assert kernel.name == "sm90a_grouped_matmul_swiglu_quant_i8w4_bf16_t128x128x128_c1x1x1_coop_sauto_swap"
    (unit,) = render_kernel_sources(manifest, kernels)
    assert "MoeConfig<\n    int8_t, cutlass::int4b_t, cutlass::bfloat16_t, /*swap_ab=*/true" in unit.source
    assert "int8 x int4 -> bf16 C -> SwiGLU -> int8 q" in unit.source
    assert f"gemmgen_run_{kernel.name}(const gemmgen_moe_args* args" in unit.source
    namespace: dict = {}
    exec(compile(render_bindings(manifest, kernels, "f" * 16, "lib.so"), "bindings.py", "exec"), namespace)
    assert list(namespace["DISPATCH"]) == [A8W4]
    assert FAMILY.describe_class(A8W4) == "grouped_matmul_swiglu_quant int8 x int4 (channel scales) -> int8 q"


def test_args_mirror_matches_the_header():
    """MoeArgs (abi.py) has the fields of gemmgen_moe_args (moe_args.h) in order, and the op's
    struct layout packs into exactly those fields."""
    header = (Path(FAMILY.include_dir) / "gemmgen" / "moe" / "moe_args.h").read_text()
    body = header.split("typedef struct gemmgen_moe_args {")[1].split("} gemmgen_moe_args;")[0]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        first, *rest = [part.strip() for part in decl.split(",")]
        names += [first.split()[-1].lstrip("*"), *rest]
    assert names == [name for name, _ in MoeArgs._fields_]
    assert ARGS_LAYOUT.size == ctypes.sizeof(MoeArgs) == 8 * 8 + 4 * 8 + 6 * 4
    assert "#define GEMMGEN_MOE_LAYOUT_VERSION 3" in header and packing.LAYOUT_VERSION == 3
    values = tuple(range(1, 9)) + (-1, 2**40, 3, 4) + (1, 2, 8, 0, 2, 0)
    buffer = (ctypes.c_char * ARGS_LAYOUT.size)()
    ARGS_LAYOUT.pack_into(buffer, 0, *values)
    args = MoeArgs.from_buffer(buffer)
    assert tuple(getattr(args, name) for name, _ in MoeArgs._fields_) == values


# ------------------------------------------------------------------------------- dispatch

def test_dispatch_request_values():
    family = registry.for_api_op(OP)
    assert family is FAMILY and family.variables == ("tokens_per_expert", "experts", "n", "k", "rows")
    for dtype, bits, cls in ((INT8, 8, I8), (FP8, 8, E4M3), (INT8, 4, A8W4)):
        for m, e, tokens, rows in ((0, 8, 1, 2), (1, 8, 1, 2), (8, 8, 1, 8), (9, 8, 2, 16),
                                   (1000, 3, 334, 1024), (8193, 2, 4097, 16384),
                                   (2**31 - 1, 1, 2**31 - 1, 2**31 - 1)):
            key, values = FAMILY.dispatch_request(OP, x_dtype=dtype, m=m, experts=e, n=4096, k=7168,
                                                  weight_bits=bits)
            assert key == cls and values == (tokens, e, 4096, 7168, rows)
    assert FAMILY.dispatch_request(OP, x_dtype=FP8, m=1, experts=1, n=8, k=16)[0] == E4M3  # 8 bits


@pytest.mark.parametrize("problem,message", [
    (dict(x_dtype=BF16), r"x_dtype must be torch\.int8 or torch\.float8_e4m3fn"),
    (dict(experts=0), r"^experts must be an int in \[1, 2\^31 - 1\], got 0$"),
    (dict(m=-1), r"^m must be an int in \[0, 2\^31 - 1\], got -1$"),
    (dict(m=2**31), r"^m must be an int in \[0, 2\^31 - 1\]"),
    (dict(n=0), r"^n must be an int in \[1, 2\^31 - 1\]"),
    (dict(k=True), r"^k must be an int in \[1, 2\^31 - 1\], got True$"),
    (dict(m=1.0), r"^m must be an int"),
    (dict(x_dtype=FP8, weight_bits=4), r"^weight_bits=4 \(A8W4\) takes int8 activations"),
    (dict(weight_bits=3), r"^weight_bits must be 8 or 4, got 3$"),
    (dict(weight_bits=True), r"^weight_bits must be 8 or 4, got True$"),
    (dict(x_dtype=BF16, weight_bits=4), r"x_dtype must be torch\.int8 or torch\.float8_e4m3fn"),
])
def test_dispatch_request_errors(problem, message):
    full = dict(x_dtype=INT8, m=16, experts=8, n=4096, k=7168) | problem
    with pytest.raises(ValueError, match=message):
        FAMILY.dispatch_request(OP, **full)
    with pytest.raises(ValueError, match=message):
        dispatch.choose(OP, manifests=[SHIPPED], **full)  # before any library is looked for


@pytest.fixture
def fresh_dispatch():
    dispatch.cache_clear()
    yield
    dispatch.cache_clear()


# each shipped family: (its class, x_dtype, weight_bits, its rules' configs in order)
_SHIPPED_FAMILIES = {  # (class, x dtype, weight bits, per group, the rules' configs in order)
    "moe_int8": (I8, INT8, 8, False, ["stream_wide", "stream", "decode", "small", "wide_pp_fused"]),
    "moe_e4m3": (E4M3, FP8, 8, False, ["stream", "decode", "small_fa", "small_fused_fa_bf16",
                                       "wide_pp_fused_fa_bf16"]),
    "moe_a8w4": (A8W4, INT8, 4, False, ["wgmma16", "wgmma16_fused", "wgmma32_fused", "wgmma64",
                                        "wgmma80_tma_fused", "wgmma80_tma", "wgmma80_tma_fused",
                                        "tall", "large", "mid_pp"]),
    "moe_a8w4_group": (A8W4G, INT8, 4, True, ["wgmma16", "wgmma16_fused", "wgmma32_s8_fused",
                                              "wgmma80", "wgmma64_tma_fused", "wgmma64_tma"]),
}
K_DEEP, K_SHALLOW = 7168, 2048  # some int8 rules differ below K 4096


@pytest.mark.parametrize("family,n,tokens,config,k", [
    # int8: one token an expert direct (stream_wide at N >= 8192); <= 16 decode (<= 4 with 128
    # experts or more: the next test; these are 8 experts); at 8192 <= N < 24576 <= 48
    # small; then wide_pp_fused (at N >= 24576 right after decode)
    ("moe_int8", 4096, 1, "stream", K_DEEP), ("moe_int8", 4096, 2, "decode", K_DEEP),
    ("moe_int8", 8192, 1, "stream_wide", K_DEEP), ("moe_int8", 8192, 8, "decode", K_DEEP),
    ("moe_int8", 28672, 1, "stream_wide", K_DEEP), ("moe_int8", 4096, 9, "decode", K_DEEP),
    ("moe_int8", 4096, 16, "decode", K_DEEP), ("moe_int8", 4096, 17, "wide_pp_fused", K_DEEP),
    ("moe_int8", 4096, 33, "wide_pp_fused", K_DEEP), ("moe_int8", 4096, 65, "wide_pp_fused", K_SHALLOW),
    ("moe_int8", 4096, 129, "wide_pp_fused", K_SHALLOW), ("moe_int8", 8192, 17, "small", K_DEEP),
    ("moe_int8", 8192, 48, "small", K_SHALLOW), ("moe_int8", 16384, 48, "small", K_DEEP),
    ("moe_int8", 24576, 17, "wide_pp_fused", K_DEEP), ("moe_int8", 28672, 48, "wide_pp_fused", K_DEEP),
    ("moe_int8", 16384, 49, "wide_pp_fused", K_DEEP), ("moe_int8", 16384, 256, "wide_pp_fused", K_DEEP),
    ("moe_int8", 28672, 49, "wide_pp_fused", K_DEEP), ("moe_int8", 24576, 64, "wide_pp_fused", K_DEEP),
    ("moe_int8", 24576, 16, "decode", K_DEEP),
    ("moe_int8", 24576, 65, "wide_pp_fused", K_DEEP), ("moe_int8", 28672, 256, "wide_pp_fused", K_DEEP),
    ("moe_int8", 28672, 100_000, "wide_pp_fused", K_DEEP),
    ("moe_int8", 1536, 100_000, "wide_pp_fused", K_DEEP),
    # e4m3: the direct kernel up to 16 rows (8 experts: 2 tokens an expert); <= 8 decode (<= 16 at
    # N >= 8192; <= 4 with 128 experts or more); then the fast-accumulation configs: at
    # 8192 <= N < 24576 small_fa to 48; below N 24576 small_fused_fa_bf16 to 32; then
    # wide_pp_fused_fa_bf16 (the fused tiles storing S in bf16)
    ("moe_e4m3", 4096, 1, "stream", K_DEEP), ("moe_e4m3", 28672, 2, "stream", K_DEEP),
    ("moe_e4m3", 4096, 8, "decode", K_DEEP), ("moe_e4m3", 4096, 9, "small_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 4096, 32, "small_fused_fa_bf16", K_SHALLOW),
    ("moe_e4m3", 4096, 33, "wide_pp_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 4096, 65, "wide_pp_fused_fa_bf16", K_SHALLOW), ("moe_e4m3", 16384, 48, "small_fa", K_DEEP),
    ("moe_e4m3", 16384, 49, "wide_pp_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 4096, 100_000, "wide_pp_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 8192, 16, "decode", K_DEEP), ("moe_e4m3", 8192, 17, "small_fa", K_DEEP),
    ("moe_e4m3", 16384, 17, "small_fa", K_DEEP), ("moe_e4m3", 24576, 16, "decode", K_DEEP),
    ("moe_e4m3", 28672, 17, "wide_pp_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 28672, 48, "wide_pp_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 28672, 112, "wide_pp_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 28672, 113, "wide_pp_fused_fa_bf16", K_DEEP),
    ("moe_e4m3", 28672, 100_000, "wide_pp_fused_fa_bf16", K_DEEP), ("moe_e4m3", 28672, 3, "decode", K_DEEP),
    # A8W4: the wgmma kernel's tiles by rows an expert: [64, 16] to 8 (fused from 3), [128, 32]
    # fused to 32, 64 rows to 48, 80 rows (TMA copies) to 80 (fused at N >= 8192, and there to
    # 160); then CUTLASS's tiles: below N 8192 the 128x128 pingpong one; at N >= 8192 the 256x128
    # one to 512 an expert, then the 128x256 one
    ("moe_a8w4", 4096, 1, "wgmma16", K_DEEP), ("moe_a8w4", 4096, 2, "wgmma16", K_DEEP),
    ("moe_a8w4", 4096, 3, "wgmma16_fused", K_DEEP), ("moe_a8w4", 4096, 8, "wgmma16_fused", K_DEEP),
    ("moe_a8w4", 28672, 8, "wgmma16_fused", K_DEEP), ("moe_a8w4", 4096, 9, "wgmma32_fused", K_SHALLOW),
    ("moe_a8w4", 4096, 32, "wgmma32_fused", K_DEEP), ("moe_a8w4", 4096, 33, "wgmma64", K_DEEP),
    ("moe_a8w4", 4096, 48, "wgmma64", K_DEEP), ("moe_a8w4", 4096, 49, "wgmma80_tma", K_DEEP),
    ("moe_a8w4", 4096, 80, "wgmma80_tma", K_SHALLOW), ("moe_a8w4", 4096, 81, "mid_pp", K_DEEP),
    ("moe_a8w4", 8192, 9, "wgmma32_fused", K_DEEP), ("moe_a8w4", 28672, 32, "wgmma32_fused", K_DEEP),
    ("moe_a8w4", 4096, 129, "mid_pp", K_DEEP), ("moe_a8w4", 4096, 100_000, "mid_pp", K_DEEP),
    ("moe_a8w4", 8192, 65, "wgmma80_tma_fused", K_DEEP), ("moe_a8w4", 8192, 33, "wgmma64", K_DEEP),
    ("moe_a8w4", 28672, 48, "wgmma64", K_DEEP), ("moe_a8w4", 28672, 49, "wgmma80_tma_fused", K_DEEP),
    ("moe_a8w4", 28672, 81, "wgmma80_tma_fused", K_DEEP),
    ("moe_a8w4", 28672, 160, "wgmma80_tma_fused", K_DEEP),
    ("moe_a8w4", 28672, 161, "tall", K_DEEP), ("moe_a8w4", 8192, 512, "tall", K_DEEP),
    ("moe_a8w4", 8192, 513, "large", K_DEEP), ("moe_a8w4", 28672, 100_000, "large", K_DEEP),
    ("moe_a8w4", 7168, 513, "mid_pp", K_DEEP),
    # A8W4 per group: the wgmma kernel from one token on, with wider row tiles as tokens grow,
    # fused from 3 rows an expert to 32; at N >= 8192 the one-warpgroup 80-row tile from 49 to 128
    # an expert; past 32 rows otherwise the two-warpgroup 64-row tile with TMA copies (fused at N
    # >= 8192)
    ("moe_a8w4_group", 4096, 1, "wgmma16", K_DEEP), ("moe_a8w4_group", 1536, 2, "wgmma16", K_DEEP),
    ("moe_a8w4_group", 28672, 1, "wgmma16", K_DEEP), ("moe_a8w4_group", 4096, 3, "wgmma16_fused", K_DEEP),
    ("moe_a8w4_group", 4096, 8, "wgmma16_fused", K_DEEP),
    ("moe_a8w4_group", 4096, 9, "wgmma32_s8_fused", K_DEEP),
    ("moe_a8w4_group", 28672, 32, "wgmma32_s8_fused", K_DEEP),
    ("moe_a8w4_group", 4096, 33, "wgmma64_tma", K_DEEP),
    ("moe_a8w4_group", 1536, 100_000, "wgmma64_tma", K_DEEP),
    ("moe_a8w4_group", 8192, 48, "wgmma64_tma_fused", K_DEEP),
    ("moe_a8w4_group", 8192, 49, "wgmma80", K_DEEP), ("moe_a8w4_group", 28672, 128, "wgmma80", K_DEEP),
    ("moe_a8w4_group", 28672, 129, "wgmma64_tma_fused", K_DEEP),
    ("moe_a8w4_group", 4096, 64, "wgmma64_tma", K_DEEP)])
def test_shipped_rules_pick_by_tokens_per_expert(fresh_dispatch, family, n, tokens, config, k):
    experts = 8
    cls, dtype, bits, per_group, order = _SHIPPED_FAMILIES[family]
    for m in (tokens * experts, (tokens - 1) * experts + 1):  # ceil(m / e) == tokens
        choice = dispatch.choose(OP, manifests=[SHIPPED], tuned=False, x_dtype=dtype, m=m,
                                 experts=experts, n=n, k=k, weight_bits=bits, per_group=per_group)
        spec = choice.kernel.spec
        assert choice.source == "rule" and spec.origin.config == config
        assert spec.origin.family == family and spec.dispatch_class == cls
        assert ("_i8w4_" in spec.name) == (bits == 4 and not per_group)
        assert ("_i8w4g_" in spec.name) == per_group
        assert spec.config.is_direct == config.startswith("stream")
        assert spec.config.is_wgmma == ("wgmma" in config)
        assert spec.config.fused == ("_fused" in config)
        assert order[choice.rule_index] == config  # the rule that fired names this config


@pytest.mark.parametrize("family,experts,tokens,config", [
    # with 128 experts or more, decode only to 4 an expert (skewed batches' hot experts)
    ("moe_int8", 256, 4, "decode"), ("moe_int8", 256, 5, "wide_pp_fused"),
    ("moe_int8", 128, 16, "wide_pp_fused"), ("moe_int8", 64, 16, "decode"),
    ("moe_e4m3", 256, 4, "decode"), ("moe_e4m3", 256, 5, "small_fused_fa_bf16"),
    ("moe_e4m3", 128, 8, "small_fused_fa_bf16"), ("moe_e4m3", 64, 8, "decode")])
def test_shipped_rules_take_fewer_decode_tiles_with_many_experts(fresh_dispatch, family, experts,
                                                                  tokens, config):
    _, dtype, bits, per_group, _ = _SHIPPED_FAMILIES[family]
    choice = dispatch.choose(OP, manifests=[SHIPPED], tuned=False, x_dtype=dtype, m=tokens * experts,
                             experts=experts, n=4096, k=K_DEEP, weight_bits=bits, per_group=per_group)
    assert choice.source == "rule" and choice.kernel.spec.origin.config == config


@pytest.mark.parametrize("family", list(_SHIPPED_FAMILIES))
def test_no_tokens_is_served_like_one(fresh_dispatch, family):
    _, dtype, bits, per_group, order = _SHIPPED_FAMILIES[family]
    choice = dispatch.choose(OP, manifests=[SHIPPED], tuned=False, x_dtype=dtype, m=0, experts=64,
                             n=4096, k=7168, weight_bits=bits, per_group=per_group)
    # the few-tokens config at N < 8192
    one = {"moe_a8w4_group": "wgmma16", "moe_a8w4": "wgmma16"}.get(family, "stream")
    assert (choice.kernel.spec.origin.family, choice.kernel.spec.origin.config) == (family, one)


# ------------------------------------------------------------------------------- packing

def _bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes of an 8-bit tensor (e4m3 NaN patterns compare equal)."""
    return t.contiguous().view(torch.int8)


def _random_weight(e, k, n, dtype, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, (e, k, n), generator=gen, dtype=torch.int8).view(dtype)


def _packed_row(j: int, n: int) -> int:
    """The packed row of logical column j: act j -> 2j, gate j -> 2j + 1 (act and gate interleaved)."""
    return 2 * j if j < n // 2 else 2 * (j - n // 2) + 1


@pytest.mark.parametrize("dtype", [INT8, FP8])
def test_pack_stacked_and_list(dtype):
    e, k, n = 3, 32, 16
    w = _random_weight(e, k, n, dtype)
    scale = torch.rand(e, n)
    packed = gemmgen.pack_moe_weights(w, scale)
    assert isinstance(packed, gemmgen.MoeWeight)
    assert packed.weight.shape == (e, n, k) and packed.weight.is_contiguous()
    assert packed.weight.dtype == dtype and (packed.experts, packed.n, packed.k) == (e, n, k)
    for i, j in ((0, 0), (1, 3), (2, n // 2), (2, n - 1), (0, n // 2 + 5)):  # by hand
        assert torch.equal(_bits(packed.weight[i, _packed_row(j, n)]), _bits(w[i, :, j]))
        assert packed.scale[i, _packed_row(j, n)] == scale[i, j]
    assert packed.logical_weight().shape == (e, k, n)
    assert torch.equal(_bits(packed.logical_weight()), _bits(w))
    assert packed.scale.dtype == torch.float32 and torch.equal(packed.logical_scale(), scale)
    assert (packed.layout_version, packed.arch) == (packing.LAYOUT_VERSION, "sm90a") == (3, "sm90a")
    from_lists = gemmgen.pack_moe_weights(list(w.unbind(0)), list(scale.unbind(0)))
    assert torch.equal(_bits(from_lists.weight), _bits(packed.weight))
    assert from_lists.scale.shape == (e, n) and torch.equal(from_lists.scale, packed.scale)
    moved = dataclasses.replace(packed, arch="sm80").to("cpu")
    assert moved.arch == "sm80" and moved.layout_version == 3
    assert torch.equal(_bits(moved.weight), _bits(packed.weight))


@pytest.mark.parametrize("dtype", [INT8, FP8])
def test_k_major_weights_are_packed_alike(dtype):
    """An [E, K, N] view of nn.Linear-style [E, N, K] weights packs like a contiguous copy of it."""
    e, n, k = 2, 24, 48
    w_nk = _random_weight(e, n, k, dtype)
    view = w_nk.transpose(1, 2)
    from_view, from_copy = packing.packed_weight("test", view), packing.packed_weight("test", view.contiguous())
    assert from_view.is_contiguous() and torch.equal(_bits(from_view), _bits(from_copy))
    assert torch.equal(_bits(from_view[:, 1::2]), _bits(w_nk[:, n // 2:]))  # the gate rows


def test_odd_n_is_refused_by_the_packer():
    with pytest.raises(ValueError, match=r"^gemmgen\.pack_moe_weights: argument 'weight': expected an even N"):
        gemmgen.pack_moe_weights(_random_weight(1, 16, 7, INT8), torch.ones(1, 7))
    with pytest.raises(ValueError, match=r"argument 'weight_scale': expected an even N"):
        gemmgen.pack_moe_weights(_random_weight(1, 16, 8, INT8), torch.ones(1, 7))


@st.composite
def _packing_case(draw):
    e, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 9)), 2 * draw(st.integers(1, 5))
    return (e, k, n, draw(st.sampled_from([INT8, FP8])), draw(st.booleans()),
            draw(st.sampled_from(["stacked", "list", "k_major"])), draw(st.integers(0, 2**16)))


@settings(max_examples=100, deadline=None)
@given(_packing_case())
def test_pack_round_trip(case):
    e, k, n, dtype, scales_as_list, form, seed = case
    if form == "k_major":
        w = _random_weight(e, n, k, dtype, seed).transpose(1, 2)
    else:
        w = _random_weight(e, k, n, dtype, seed)
    scale = torch.rand(e, n, generator=torch.Generator().manual_seed(seed))
    packed = gemmgen.pack_moe_weights(list(w.unbind(0)) if form == "list" else w,
                                      list(scale.unbind(0)) if scales_as_list else scale)
    assert packed.weight.shape == (e, n, k) and packed.weight.is_contiguous()
    assert packed.scale.shape == (e, n) and packed.scale.is_contiguous()
    assert torch.equal(_bits(packed.logical_weight()), _bits(w))
    assert torch.equal(packed.logical_scale(), scale)
    j = seed % n  # one column by hand
    assert torch.equal(_bits(packed.weight[:, _packed_row(j, n)]), _bits(w[:, :, j]))
    assert torch.equal(packed.scale[:, _packed_row(j, n)], scale[:, j])
    again = gemmgen.pack_moe_weights(packed.logical_weight(), packed.logical_scale())
    assert torch.equal(_bits(again.weight), _bits(packed.weight)) and torch.equal(again.scale, packed.scale)


def _pack_error(argument: str, expected: str) -> str:
    return (rf"^gemmgen\.pack_moe_weights: argument '{re.escape(argument)}': "
            rf"expected {re.escape(expected)}")


_W = torch.zeros(2, 32, 16, dtype=INT8)
_S = torch.ones(2, 16)


@pytest.mark.parametrize("weight,scale,argument,expected", [
    (_W.to(BF16), _S, "weight", "a torch.int8 or torch.float8_e4m3fn tensor [E, K, N]"),
    (_W[0], _S, "weight", "a torch.int8 or torch.float8_e4m3fn tensor [E, K, N]"),
    ([], _S, "weight", "a stacked tensor [E, ...] or a non-empty list"),
    ([_W[0], _W[1, :16]], _S, "weight[1]", "a torch.int8 tensor of shape (32, 16) on cpu like weight[0]"),
    ([_W[0], _W[1].view(FP8)], _S, "weight[1]", "a torch.int8 tensor"),
    ([_W[0], "w"], _S, "weight[1]", "a torch.int8 tensor"),
    (["w", _W[0]], _S, "weight[0]", "a torch.Tensor"),
    (_W, _S.half(), "weight_scale", "a torch.float32 tensor [E, N]"),
    (_W, _S[0], "weight_scale", "a torch.float32 tensor [E, N]"),
    (_W, torch.ones(2, 32), "weight_scale", r"a torch.float32 tensor [E=2, N=16] on cpu"),
    (_W, torch.ones(3, 16), "weight_scale", r"a torch.float32 tensor [E=2, N=16] on cpu"),
    (_W, [_S[0], _S[1, :8]], "weight_scale[1]", "a torch.float32 tensor of shape (16,)"),
    (_W, torch.ones(2, 4, 16), "weight_scale", "per-channel scales [E, N] with 8-bit weights: "
                                               "per-group [E, K/group, N] scales are A8W4's"),
])
def test_pack_errors(weight, scale, argument, expected):
    with pytest.raises(ValueError, match=_pack_error(argument, expected)):
        gemmgen.pack_moe_weights(weight, scale)


@pytest.mark.parametrize("scale", [torch.ones(2, 1, 16), [torch.ones(1, 16), torch.ones(1, 16)]],
                         ids=["stacked", "list"])
def test_per_group_scales_imply_a8w4_in_the_op_as_in_the_reference(scale):
    """weight_bits=None with per-group scales means A8W4 (the reference's rule): the op goes on to
    its next check (a CUDA x, on this machine) instead of refusing the scales as A8W8's; an
    explicit weight_bits=8 still refuses them."""
    x, x_scale, groups = torch.zeros(4, 32, dtype=INT8), torch.ones(4), torch.tensor([2, 2])
    with pytest.raises(ValueError, match="argument 'x': expected a CUDA tensor"):
        gemmgen.grouped_matmul_swiglu_quant(x, _W, scale, x_scale, groups)
    with pytest.raises(ValueError, match="per-group \\[E, K/group, N\\] scales are A8W4's"):
        gemmgen.grouped_matmul_swiglu_quant(x, _W, scale, x_scale, groups, weight_bits=8)
    q, q_scale = gemmgen.reference.grouped_matmul_swiglu_quant(x, _W, scale, x_scale, groups)
    assert q.shape == (4, 8) and q_scale.shape == (4,)
    # fp8 x: 8 bits stay, and the message says per-group scales are A8W4's (not an int4 check)
    with pytest.raises(ValueError, match="per-group \\[E, K/group, N\\] scales are A8W4's"):
        gemmgen.grouped_matmul_swiglu_quant(x.view(FP8), _W.view(FP8), scale, x_scale, groups)


# ---- A8W4: int4 values, two per byte

def _random_int4(e, k, n, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 8, (e, k, n), generator=gen, dtype=INT8)


def _set(t: torch.Tensor, index: tuple, value) -> torch.Tensor:
    """A copy of `t` with one element changed."""
    t = t.clone()
    t[index] = value
    return t


def _nibble_byte(low: int, high: int) -> int:
    """The byte of two int4 values: two's complement nibbles, the even k in the low one."""
    return (low & 0xF) | ((high & 0xF) << 4)


def test_pack_int4_by_hand():
    """Every int4 value -8..7 in both nibbles, against bytes written out by hand."""
    assert [_nibble_byte(lo, hi) for lo, hi in ((0, 0), (-1, 2), (-8, 7), (7, -8), (1, -1))] == [
        0x00, 0x2F, 0x78, 0x87, 0xF1]
    w = torch.zeros(1, 4, 2, dtype=INT8)  # [E, K, N]
    w[0, :, 0] = torch.tensor([-1, 2, -8, 7])   # column n = 0: bytes 0x2F, 0x78
    w[0, :, 1] = torch.tensor([7, -8, 1, -1])   # column n = 1: bytes 0x87, 0xF1
    packed = gemmgen.pack_moe_weights(w, torch.ones(1, 2), weight_bits=4)
    assert packed.weight.dtype == UINT8 and packed.weight.tolist() == [[[0x2F, 0x78], [0x87, 0xF1]]]
    assert (packed.bits, packed.experts, packed.n, packed.k) == (4, 1, 2, 4)
    values = torch.arange(-8, 8, dtype=INT8)  # every value, each beside every other across bytes
    pairs = torch.stack(torch.meshgrid(values, values, indexing="ij"), -1).reshape(-1)
    expected = [_nibble_byte(lo, hi) for lo, hi in pairs.view(-1, 2).tolist()]
    assert packing.pack_int4(pairs).tolist() == expected and len(set(expected)) == 256
    assert torch.equal(packing.unpack_int4(packing.pack_int4(pairs)), pairs)
    signed = lambda nibble: nibble - 16 if nibble >= 8 else nibble  # noqa: E731
    every_byte = torch.arange(256).to(UINT8)
    assert packing.unpack_int4(every_byte).view(-1, 2).tolist() == [
        [signed(b & 0xF), signed(b >> 4)] for b in range(256)]


@st.composite
def _int4_case(draw):
    e, k, n = draw(st.integers(1, 4)), 2 * draw(st.integers(0, 9)), 2 * draw(st.integers(1, 5))
    return (e, k, n, draw(st.booleans()), draw(st.sampled_from(["stacked", "list", "k_major"])),
            draw(st.integers(0, 2**16)))


@settings(max_examples=100, deadline=None)
@given(_int4_case())
def test_pack_int4_round_trip(case):
    e, k, n, scales_as_list, form, seed = case
    w = _random_int4(e, n, k, seed).transpose(1, 2) if form == "k_major" else _random_int4(e, k, n, seed)
    scale = torch.rand(e, n, generator=torch.Generator().manual_seed(seed))
    packed = gemmgen.pack_moe_weights(list(w.unbind(0)) if form == "list" else w,
                                      list(scale.unbind(0)) if scales_as_list else scale,
                                      weight_bits=4)
    assert packed.bits == 4 and packed.weight.dtype == UINT8 and packed.weight.is_contiguous()
    assert packed.weight.shape == (e, n, k // 2) and (packed.experts, packed.n, packed.k) == (e, n, k)
    assert (packed.layout_version, packed.arch) == (packing.LAYOUT_VERSION, "sm90a")
    logical = packed.logical_weight()
    assert logical.dtype == INT8 and logical.shape == (e, k, n) and torch.equal(logical, w)
    assert torch.equal(packed.logical_scale(), scale) and packed.scale.dtype == torch.float32
    interleaved = packing.interleave_act_gate(w.transpose(1, 2), 1)
    assert torch.equal(packed.weight, packing.pack_int4(interleaved))
    assert torch.equal(packing.unpack_int4(packed.weight), interleaved)
    if k:  # one byte, by hand: expert i, column j, byte b holds k = 2b (low) and 2b + 1 (high)
        i, j, b = seed % e, seed % n, seed % (k // 2)
        assert int(packed.weight[i, _packed_row(j, n), b]) == _nibble_byte(int(w[i, 2 * b, j]),
                                                                           int(w[i, 2 * b + 1, j]))
    again = gemmgen.pack_moe_weights(logical, packed.logical_scale(), weight_bits=4)  # a function
    assert torch.equal(again.weight, packed.weight)
    moved = packed.to("cpu")
    assert moved.bits == 4 and moved.k == k and torch.equal(moved.weight, packed.weight)


@pytest.mark.parametrize("weight,scale,argument,expected", [
    (_W + 8, _S, "weight", "int4 values -8..7 (weight_bits=4); got values in 8..8"),
    (_W - 9, _S, "weight", "int4 values -8..7 (weight_bits=4); got values in -9..-9"),
    (_set(_set(_W, (0, 0, 0), -8), (1, 31, 15), 8), _S, "weight",  # one value out of range
     "int4 values -8..7 (weight_bits=4); got values in -8..8"),
    (_W[:, :31], _S, "weight", "int4 values in a torch.int8 tensor [E, K, N] with K even (weight_bits=4)"),
    (_W.view(FP8), _S, "weight", "int4 values in a torch.int8 tensor [E, K, N] with K even"),
    (_W.to(BF16), _S, "weight", "a torch.int8 or torch.float8_e4m3fn tensor [E, K, N]"),
    (_W, torch.ones(2, 4, 16), "weight_scale", "a torch.float32 tensor [E=2, K/group, N=16] on cpu: "
                                               "group sizes that are multiples of 128"),
    (_W, torch.ones(2, 3, 16), "weight_scale", "a torch.float32 tensor [E=2, K/group, N=16] on cpu: "
                                               "a group count dividing K=32; got 3 groups"),
    (torch.zeros(2, 256, 16, dtype=INT8), torch.ones(2, 2, 8), "weight_scale",
     "a torch.float32 tensor [E=2, K/group, N=16]"),
    (_W, torch.ones(2, 8), "weight_scale", "a torch.float32 tensor [E=2, N=16] on cpu"),
])
def test_pack_int4_errors(weight, scale, argument, expected):
    with pytest.raises(ValueError, match=_pack_error(argument, expected)):
        gemmgen.pack_moe_weights(weight, scale, weight_bits=4)


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_pack_int4_per_group_scales(groups):
    """A8W4 per-group scales [E, K/group, N]: stored N-interleaved like the weight, read back by
    logical_scale, group_size = K / groups (one group: per channel, stored [E, N])."""
    e, k, n = 2, 384, 8
    w = _random_int4(e, k, n, seed=groups)
    scale = torch.rand(e, groups, n, generator=torch.Generator().manual_seed(groups))
    if k // groups % 128:
        with pytest.raises(ValueError, match=_pack_error("weight_scale", "a torch.float32 tensor")):
            gemmgen.pack_moe_weights(w, scale, weight_bits=4)
        return
    packed = gemmgen.pack_moe_weights(w, list(scale.unbind(0)), weight_bits=4)
    if groups == 1:
        assert packed.scale.shape == (e, n) and packed.group_size == 0
        assert torch.equal(packed.logical_scale(), scale[:, 0])
        return
    assert packed.scale.shape == (e, groups, n) and packed.group_size == k // groups
    assert torch.equal(packed.logical_scale(), scale) and packed.scale.is_contiguous()
    j = 3  # one column by hand: its scales sit at the packed row of its act/gate pair
    assert torch.equal(packed.scale[:, :, _packed_row(j, n)], scale[:, :, j])
    assert torch.equal(packed.logical_weight(), w)


@pytest.mark.parametrize("k,groups", [(256, 2), (384, 3), (1024, 4)])
def test_pack_int4_per_group_mma_order(k, groups):
    """Per-group A8W4 weights in the MMA fragment order, every byte by hand: in chunk c of a
    packed row, byte 16q + 4j + i holds k = 128c + 32j + 4q + i (low nibble) and k + 16 (high);
    unpacked back by logical_weight and unpack_int4_mma_order. Per channel (and one group) keeps
    the even-k-low order."""
    e, n = 2, 4
    w = _random_int4(e, k, n, seed=k)
    scale = torch.rand(e, groups, n, generator=torch.Generator().manual_seed(k))
    packed = gemmgen.pack_moe_weights(w, scale, weight_bits=4)
    assert packed.mma_order and packed.group_size == k // groups
    rows = packed.weight.tolist()
    for i in range(e):
        for j_col in range(n):
            row = rows[i][_packed_row(j_col, n)]
            expected = [0] * (k // 2)
            for c, q, j, t in itertools.product(range(k // 128), range(4), range(4), range(4)):
                kk = 128 * c + 32 * j + 4 * q + t
                expected[64 * c + 16 * q + 4 * j + t] = _nibble_byte(int(w[i, kk, j_col]),
                                                                     int(w[i, kk + 16, j_col]))
            assert row == expected, (i, j_col)
    assert torch.equal(packed.logical_weight(), w)
    interleaved = packing.interleave_act_gate(w.transpose(1, 2), 1)
    assert torch.equal(packing.unpack_int4_mma_order(packed.weight), interleaved)
    for channel_scale in (scale[:, 0], scale[:, :1]):  # [E, N] and one group: per channel
        plain = gemmgen.pack_moe_weights(w, channel_scale, weight_bits=4)
        assert not plain.mma_order and torch.equal(plain.weight, packing.pack_int4(interleaved))


@pytest.mark.parametrize("bits", [5, 3, 16, 0, True, "4", None])
def test_pack_weight_bits_is_8_or_4(bits):
    expected = _pack_error("weight_bits", "8 or 4") + f"; got {re.escape(repr(bits))}$"
    with pytest.raises(ValueError, match=expected):
        gemmgen.pack_moe_weights(_W, _S, weight_bits=bits)


# ------------------------------------------------------------------------------- argument checks

@pytest.fixture
def fake():
    with FakeTensorMode():
        yield


def _args(m=10, e=4, n=32, k=64, dtype=INT8, device="cuda", weight_bits=8) -> dict:
    """A valid problem for check_arguments (fake CUDA tensors under FakeTensorMode); with
    weight_bits=4 (A8W4) the packed weight is uint8 [E, N, K/2]."""
    empty = lambda *shape, dtype=torch.float32: torch.empty(shape, dtype=dtype, device=device)  # noqa: E731
    w = empty(e, n, k // 2, dtype=UINT8) if weight_bits == 4 else empty(e, n, k, dtype=dtype)
    return dict(q=empty(m, n // 2, dtype=dtype), q_scale=empty(m), x=empty(m, k, dtype=dtype),
                w=w, w_scale=empty(e, n), x_scale=empty(m),
                group_list=empty(e, dtype=torch.int64), group_list_type="count",
                weight_bits=weight_bits)


def _a8w4(**changes) -> dict:
    """The A8W4 problem of `_args` (m=10, e=4, n=32, k=64), with changes."""
    return _args(weight_bits=4) | changes


def _check(**changes):
    return ops.check_arguments(**(_args() | changes))


def _empty(*shape, dtype=torch.float32, device="cuda"):
    return torch.empty(shape, dtype=dtype, device=device)


# (name, changes() -> dict of replaced arguments, argument, the start of what is expected)
_BAD = [
    ("x 3-D", lambda: dict(x=_empty(10, 64, 1, dtype=INT8)), "x", "a 2-D torch.int8 or torch.float8_e4m3fn"),
    ("x bf16", lambda: dict(x=_empty(10, 64, dtype=BF16)), "x", "a 2-D torch.int8 or torch.float8_e4m3fn"),
    ("x not a tensor", lambda: dict(x=None), "x", "a 2-D torch.int8"),
    ("x on cpu", lambda: dict(x=_empty(10, 64, dtype=INT8, device="cpu")), "x", "a CUDA tensor"),
    ("x strided", lambda: dict(x=_empty(64, 10, dtype=INT8).t()), "x", "a contiguous row-major [M, K]"),
    ("K % 16", lambda: _args(k=40), "x", "K a positive multiple of 16"),
    ("weight dtype", lambda: dict(w=_empty(4, 32, 64, dtype=FP8)), "weight",
     "a packed torch.int8 tensor [E, N, K] (gemmgen.pack_moe_weights)"),
    ("weight 2-D", lambda: dict(w=_empty(32, 64, dtype=INT8)), "weight",
     "a packed torch.int8 tensor [E, N, K]"),
    ("weight uint8 as 8-bit", lambda: dict(w=_empty(4, 32, 32, dtype=UINT8)), "weight",
     "a packed torch.int8 tensor [E, N, K]"),
    ("weight K", lambda: dict(w=_empty(4, 32, 80, dtype=INT8)), "weight", "K = 64 rows per expert"),
    ("weight not packed", lambda: dict(w=_empty(4, 64, 32, dtype=INT8).transpose(1, 2)), "weight",
     "packed [E, N, K] weights"),
    ("N % 8", lambda: _args(n=12), "weight", "N a positive multiple of 8"),
    ("weight_scale shape", lambda: dict(w_scale=_empty(4, 16)), "weight_scale",
     "a contiguous torch.float32 tensor [E=4, N=32]"),
    ("weight_scale dtype", lambda: dict(w_scale=_empty(4, 32, dtype=BF16)), "weight_scale",
     "a contiguous torch.float32 tensor [E=4, N=32]"),
    ("weight_scale None", lambda: dict(w_scale=None), "weight_scale", "a contiguous torch.float32"),
    ("x_scale shape", lambda: dict(x_scale=_empty(10, 1)), "x_scale",
     "a contiguous torch.float32 tensor [M=10]"),
    ("x_scale dtype", lambda: dict(x_scale=_empty(10, dtype=torch.float16)), "x_scale",
     "a contiguous torch.float32 tensor [M=10]"),
    ("group_list int32", lambda: dict(group_list=_empty(4, dtype=torch.int32)), "group_list",
     "a contiguous torch.int64 tensor [E=4]"),
    ("group_list length", lambda: dict(group_list=_empty(5, dtype=torch.int64)), "group_list",
     "a contiguous torch.int64 tensor [E=4]"),
    ("group_list_type", lambda: dict(group_list_type="counts"), "group_list_type", "'count' or 'cumsum'"),
    ("q shape", lambda: dict(q=_empty(10, 32, dtype=INT8)), "q",
     "a contiguous torch.int8 tensor [M=10, N/2=16]"),
    ("q dtype", lambda: dict(q=_empty(10, 16, dtype=FP8)), "q", "a contiguous torch.int8 tensor"),
    ("q_scale shape", lambda: dict(q_scale=_empty(9)), "q_scale", "a contiguous torch.float32 tensor [M=10]"),
    ("q_scale dtype", lambda: dict(q_scale=_empty(10, dtype=torch.float64)), "q_scale",
     "a contiguous torch.float32 tensor [M=10]"),
    ("group_list device", lambda: dict(group_list=_empty(4, dtype=torch.int64, device="cuda:1")),
     "group_list", "a tensor on cuda:0 like x"),
    ("w_scale on cpu", lambda: dict(w_scale=_empty(4, 32, device="cpu")), "weight_scale",
     "a tensor on cuda:0"),
    ("weight_bits 3", lambda: dict(weight_bits=3), "weight_bits", "8 or 4; got 3"),
    ("weight_bits True", lambda: dict(weight_bits=True), "weight_bits", "8 or 4; got True"),
    # A8W4: uint8 [E, N, K/2] weights, int8 x, K a multiple of 32
    ("a8w4 x e4m3", lambda: _a8w4(x=_empty(10, 64, dtype=FP8)), "x",
     "a torch.int8 tensor: A8W4 (int4 weights) takes int8 activations"),
    ("a8w4 weight int8", lambda: _a8w4(w=_empty(4, 32, 64, dtype=INT8)), "weight",
     "a packed torch.uint8 tensor [E, N, K/2] (gemmgen.pack_moe_weights, weight_bits=4)"),
    ("a8w4 weight 2-D", lambda: _a8w4(w=_empty(32, 32, dtype=UINT8)), "weight",
     "a packed torch.uint8 tensor [E, N, K/2]"),
    ("a8w4 weight unpacked K", lambda: _a8w4(w=_empty(4, 32, 64, dtype=UINT8)), "weight",
     "K = 64 rows per expert (x has K = 64 columns); got K = 128"),
    ("a8w4 weight strided", lambda: _a8w4(w=_empty(4, 32, 32, dtype=UINT8).transpose(1, 2)), "weight",
     "packed [E, N, K/2] weights (K contiguous"),  # a square [N, K/2]: only the layout is wrong
    ("a8w4 K % 32", lambda: _args(k=48, weight_bits=4), "x", "K a positive multiple of 32"),
    ("a8w4 N % 8", lambda: _args(n=12, weight_bits=4), "weight", "N a positive multiple of 8"),
    ("a8w4 weight_scale group 32", lambda: _a8w4(w_scale=_empty(4, 2, 32)), "weight_scale",
     "a contiguous torch.float32 tensor [E=4, K/group, N=32]: group sizes that are multiples of 128"),
    ("a8w4 weight_scale groups not dividing K", lambda: _args(k=384, weight_bits=4) | dict(
        w_scale=_empty(4, 5, 32)), "weight_scale",
        "a contiguous torch.float32 tensor [E=4, K/group, N=32]: a group count dividing K=384; got 5 groups"),
    ("a8w4 weight_scale per-group N", lambda: _args(k=256, weight_bits=4) | dict(
        w_scale=_empty(4, 2, 16)), "weight_scale", "a contiguous torch.float32 tensor [E=4, K/group, N=32]"),
    ("int8 weight_scale per-group", lambda: _args(k=256) | dict(w_scale=_empty(4, 2, 32)),
     "weight_scale", "a contiguous torch.float32 tensor [E=4, N=32]"),
    ("a8w4 q dtype", lambda: _a8w4(q=_empty(10, 16, dtype=UINT8)), "q", "a contiguous torch.int8 tensor"),
    ("a8w4 weight device", lambda: _a8w4(w=_empty(4, 32, 32, dtype=UINT8, device="cuda:1")), "weight",
     "a tensor on cuda:0 like x"),
]


@pytest.mark.parametrize("changes,argument,expected", [case[1:] for case in _BAD],
                         ids=[case[0] for case in _BAD])
def test_check_arguments_errors(fake, changes, argument, expected):
    with pytest.raises(ValueError, match=rf"^gemmgen\.grouped_matmul_swiglu_quant: argument "
                                         rf"'{argument}': expected {re.escape(expected)}"):
        _check(**changes())


@pytest.mark.parametrize("dtype", [INT8, FP8])
@pytest.mark.parametrize("m,e,n,k", [(10, 4, 32, 64), (0, 1, 8, 16), (1, 256, 4096, 7168),
                                     (2**31 - 1, 1, 8, 16)])
def test_check_arguments_accepts(fake, dtype, m, e, n, k):
    assert ops.check_arguments(**_args(m, e, n, k, dtype)) is None
    assert ops.check_arguments(**(_args(m, e, n, k, dtype) | dict(group_list_type="cumsum"))) is None


@pytest.mark.parametrize("m,e,n,k", [(10, 4, 32, 64), (0, 1, 8, 32), (1, 256, 4096, 7168),
                                     (2**31 - 1, 1, 8, 32)])
def test_check_arguments_accepts_a8w4(fake, m, e, n, k):
    assert ops.check_arguments(**_args(m, e, n, k, weight_bits=4)) is None
    if k % 128 == 0:  # per-group scales, group 128
        per_group = _args(m, e, n, k, weight_bits=4)
        per_group["w_scale"] = torch.empty(e, k // 128, n, device="cuda")
        assert ops.check_arguments(**per_group) is None
    cumsum = _args(m, e, n, k, weight_bits=4) | dict(group_list_type="cumsum")
    assert ops.check_arguments(**cumsum) is None


def test_custom_op_takes_weight_bits_after_group_list_type(fake):
    """The custom op's schema: weight_bits (default 8) between group_list_type and check."""
    schema = torch.ops.gemmgen.grouped_matmul_swiglu_quant_out.default._schema
    assert [a.name for a in schema.arguments] == [
        "q", "q_scale", "x", "weight", "weight_scale", "x_scale", "group_list", "group_list_type",
        "weight_bits", "check", "kernel_name"]
    assert schema.arguments[8].default_value == 8
    for bits in (8, 4):
        a = _args(weight_bits=bits)
        positional = [a[name] for name in ("q", "q_scale", "x", "w", "w_scale", "x_scale", "group_list",
                                           "group_list_type")]
        assert torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(*positional, bits, False, None) is None
        with pytest.raises(ValueError, match=r"argument 'weight': expected a packed torch\."
                                             + ("int8" if bits == 4 else "uint8")):
            torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(*positional, 12 - bits, False, None)


def test_sizes_beyond_int32(fake):
    with pytest.raises(ValueError, match=r"argument 'x': expected M, N and K below 2\^31"):
        ops.check_arguments(**_args(m=2**31, e=1, n=8, k=16))


@pytest.mark.parametrize("bits,k_max,per_product", [(8, 2**17 - 16, 2**14), (4, 2**21 - 32, 2**10)])
def test_int8_k_limit(fake, bits, k_max, per_product):
    """int32 accumulation: the largest K (a multiple of the K granule) whose sum of products of
    the largest magnitude still fits; one granule more is refused."""
    assert (ops.K_MAX_A8W4 if bits == 4 else ops.K_MAX_INT8) == k_max
    assert per_product * k_max <= 2**31 - 1 < per_product * (k_max + (32 if bits == 4 else 16))
    assert ops.check_arguments(**_args(m=2, e=1, n=8, k=k_max, weight_bits=bits)) is None
    step = 32 if bits == 4 else 16
    with pytest.raises(ValueError, match=rf"argument 'x': expected K <= {k_max} for int8 x "
                                         rf"\(\|x·w\| <= 2\^{14 if bits == 8 else 10} per product"):
        ops.check_arguments(**_args(m=2, e=1, n=8, k=k_max + step, weight_bits=bits))
    assert ops.check_arguments(**_args(m=2, e=1, n=8, k=4 * k_max, dtype=FP8)) is None  # fp32 acc


def test_public_op_on_fake_tensors(fake):
    """The public op under a dispatch mode goes through the custom op's fake: every check, a
    K-major unpacked weight used as is, outputs of the right shapes."""
    m, e, n, k = 10, 4, 32, 64
    a = _args(m, e, n, k, FP8)
    x, x_scale, g = a["x"], a["x_scale"], a["group_list"]
    w_nk = a["w"]
    packed = gemmgen.MoeWeight(w_nk, a["w_scale"])
    # (an [E, K, N] weight that needs a copy cannot be packed here: a CPU-only torch cannot run
    # .contiguous() on a fake CUDA tensor)
    for weight, scale in ((packed, None), (w_nk.transpose(1, 2), a["w_scale"])):
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, weight, scale, x_scale, g)
        assert (q.shape, q.dtype, q_scale.shape, q_scale.dtype) == ((m, n // 2), FP8, (m,), torch.float32)
    with pytest.raises(ValueError, match=r"^gemmgen\.grouped_matmul_swiglu_quant: argument "
                                         r"'weight_scale': expected a contiguous torch\.float32"):
        gemmgen.grouped_matmul_swiglu_quant(x, w_nk.transpose(1, 2), None, x_scale, g)
    with pytest.raises(ValueError, match=r"argument 'group_list_type': expected 'count' or 'cumsum'"):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, g, "counts")
    with pytest.raises(ValueError, match=r"^gemmgen\.grouped_matmul_swiglu_quant: argument 'x'"):
        gemmgen.grouped_matmul_swiglu_quant(_empty(m, k, dtype=BF16), packed, None, x_scale, g)
    with pytest.raises(ValueError, match=r"^gemmgen\.grouped_matmul_swiglu_quant: argument 'weight': "
                                         r"expected a packed torch\.int8 tensor \[E, N, K\]"):
        gemmgen.grouped_matmul_swiglu_quant(_empty(m, k, dtype=INT8), packed, None, x_scale, g)
    with pytest.raises(ValueError, match=r"^gemmgen\.grouped_matmul_swiglu_quant: argument 'weight'"):
        gemmgen.grouped_matmul_swiglu_quant(x, _empty(e, k, n, dtype=BF16), a["w_scale"], x_scale, g)


def test_public_op_a8w4_on_fake_tensors(fake):
    """A8W4 through the custom op's fake: an int4 MoeWeight (weight_bits from it or given), the
    assist matrix accepted and its device checked, int8 x only; a raw weight with a bad
    weight_bits reaches the op's own check."""
    m, e, n, k = 10, 4, 32, 64
    a = _args(m, e, n, k, weight_bits=4)
    x, x_scale, g = a["x"], a["x_scale"], a["group_list"]
    packed = gemmgen.MoeWeight(a["w"], a["w_scale"], bits=4)
    assert packed.k == k
    op = gemmgen.grouped_matmul_swiglu_quant
    for extra in ({}, dict(weight_bits=4), dict(weight_assist_matrix=_empty(e, n))):
        q, q_scale = op(x, packed, None, x_scale, g, **extra)
        assert (q.shape, q.dtype, q_scale.shape, q_scale.dtype) == ((m, n // 2), INT8, (m,), torch.float32)
    prefix = r"^gemmgen\.grouped_matmul_swiglu_quant: argument "
    with pytest.raises(ValueError, match=prefix + r"'x': expected a torch\.int8 tensor: A8W4"):
        op(_empty(m, k, dtype=FP8), packed, None, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'x': expected K a positive multiple of 32"):
        k48 = gemmgen.MoeWeight(_empty(e, n, 24, dtype=UINT8), a["w_scale"], bits=4)
        op(_empty(m, 48, dtype=INT8), k48, None, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'weight_assist_matrix': expected None or a "
                                                  r"torch\.float32 tensor \[E=4, N=32\] on cuda:0"):
        op(x, packed, None, x_scale, g, weight_assist_matrix=_empty(e, n, device="cpu"))
    w8 = _args(m, e, n, k)["w"].transpose(1, 2)  # K-major: used as is
    with pytest.raises(ValueError, match=prefix + r"'weight_bits': expected None, 8 or 4; got 3"):
        op(x, w8, a["w_scale"], x_scale, g, weight_bits=3)


_P8 = gemmgen.pack_moe_weights(_W, _S)
_P4 = gemmgen.pack_moe_weights(_W, _S, weight_bits=4)
_X, _XS, _G = torch.zeros(4, 32, dtype=INT8), torch.ones(4), torch.tensor([2, 2])  # on the CPU
_PER_GROUP = torch.ones(2, 4, 16)  # [E, K/group, N]
_ASSIST_SHAPE = "None or a torch.float32 tensor [E=2, N=16] on cpu"
_PER_CHANNEL = "per-channel scales [E, N] with 8-bit weights: per-group [E, K/group, N] scales are A8W4's"


def test_public_op_early_errors_on_cpu():
    """Errors the public wrapper raises before any tensor check, on plain CPU tensors."""
    packed, x, x_scale, g = _P8, _X, _XS, _G
    prefix = r"^gemmgen\.grouped_matmul_swiglu_quant: argument "
    with pytest.raises(ValueError, match=prefix + r"'weight_scale': expected None with a packed MoeWeight"):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, _S, x_scale, g)
    for stale, got in ((dataclasses.replace(packed, layout_version=2), "arch 'sm90a', layout version 2"),
                       (dataclasses.replace(packed, arch="sm80"), "arch 'sm80', layout version 3")):
        with pytest.raises(ValueError, match=prefix + r"'weight': expected a MoeWeight packed for "
                                                      r"sm90a with layout version 3 .*; got " + got):
            gemmgen.grouped_matmul_swiglu_quant(x, stale, None, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'x': expected a 2-D tensor \[M, K\]"):
        gemmgen.grouped_matmul_swiglu_quant(x[0], packed, None, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'weight': expected a torch\.int8 or"):
        gemmgen.grouped_matmul_swiglu_quant(x, _W.to(BF16), _S, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'x': expected a CUDA tensor"):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, g)


# (name, weight, weight_scale, keywords, argument, the start of what is expected)
_EARLY_A8W4 = [
    ("bits 4 on an 8-bit MoeWeight", _P8, None, dict(weight_bits=4), "weight_bits",
     "None or 8 (the packed weight's); got 4"),
    ("bits 8 on an int4 MoeWeight", _P4, None, dict(weight_bits=8), "weight_bits",
     "None or 4 (the packed weight's); got 8"),
    ("assist, 8-bit MoeWeight", _P8, None, dict(weight_assist_matrix=_S), "weight_assist_matrix",
     "None: the assist matrix is A8W4's only (weight_bits=4)"),
    ("assist, raw 8-bit", _W, _S, dict(weight_assist_matrix=_S), "weight_assist_matrix",
     "None: the assist matrix is A8W4's only"),
    ("assist, bits 8", _W, _S, dict(weight_bits=8, weight_assist_matrix=_S), "weight_assist_matrix",
     "None: the assist matrix is A8W4's only"),
    ("assist [E, N/2]", _P4, None, dict(weight_assist_matrix=torch.ones(2, 8)), "weight_assist_matrix",
     _ASSIST_SHAPE),
    ("assist [N]", _P4, None, dict(weight_assist_matrix=torch.ones(16)), "weight_assist_matrix",
     _ASSIST_SHAPE),
    ("assist float64", _P4, None, dict(weight_assist_matrix=_S.double()), "weight_assist_matrix",
     _ASSIST_SHAPE),
    ("assist a list of E-1", _P4, None, dict(weight_assist_matrix=[_S[0]]), "weight_assist_matrix",
     _ASSIST_SHAPE),
    ("assist a ragged list", _P4, None, dict(weight_assist_matrix=[_S[0], _S[1, :8]]),
     "weight_assist_matrix[1]", "a torch.float32 tensor of shape (16,) on cpu like weight_assist_matrix[0]"),
    ("assist a string", _P4, None, dict(weight_assist_matrix="wam"), "weight_assist_matrix",
     "a stacked tensor [E, ...] or a non-empty list"),
    ("assist, raw int4 [E+1, N]", _W, _S, dict(weight_bits=4, weight_assist_matrix=torch.ones(3, 16)),
     "weight_assist_matrix", _ASSIST_SHAPE),
    # per-group scales: A8W4's only, group sizes multiples of 128 (these are K/4 = 8)
    ("per-group, int4 MoeWeight", dataclasses.replace(_P4, scale=_PER_GROUP), None, {}, "weight_scale",
     "a torch.float32 tensor [E, K/group, N]: group sizes that are multiples of 128"),
    ("per-group, 8-bit MoeWeight", dataclasses.replace(_P8, scale=_PER_GROUP), None, {}, "weight_scale",
     _PER_CHANNEL),
    ("per-group, raw, bits 8", _W, _PER_GROUP, dict(weight_bits=8), "weight_scale", _PER_CHANNEL),
    ("per-group, raw list, bits 8", _W, list(_PER_GROUP), dict(weight_bits=8), "weight_scale",
     _PER_CHANNEL),
    # weight_bits None with per-group scales is A8W4 (the reference's rule): packed as int4
    ("per-group, raw, bits None", _W, _PER_GROUP, {}, "weight_scale",
     "a torch.float32 tensor [E=2, K/group, N=16] on cpu: group sizes that are multiples of 128"),
    ("per-group, raw list, bits None", _W, list(_PER_GROUP), {}, "weight_scale",
     "a torch.float32 tensor [E=2, K/group, N=16] on cpu: group sizes that are multiples of 128"),
    # a raw weight with weight_bits=4 is packed on the call (pack_moe_weights' checks, the op's name)
    ("per-group, raw int4", _W, _PER_GROUP, dict(weight_bits=4), "weight_scale",
     "a torch.float32 tensor [E=2, K/group, N=16] on cpu: group sizes that are multiples of 128"),
    ("raw int4 out of range", _W + 8, _S, dict(weight_bits=4), "weight", "int4 values -8..7"),
    ("raw int4 from e4m3", _W.view(FP8), _S, dict(weight_bits=4), "weight",
     "int4 values in a torch.int8 tensor [E, K, N] with K even"),
]


@pytest.mark.parametrize("weight,scale,keywords,argument,expected", [case[1:] for case in _EARLY_A8W4],
                         ids=[case[0] for case in _EARLY_A8W4])
def test_public_op_a8w4_errors_on_cpu(weight, scale, keywords, argument, expected):
    """weight_bits, the assist matrix and per-group scales are refused before any CUDA work."""
    with pytest.raises(ValueError, match=rf"^gemmgen\.grouped_matmul_swiglu_quant: argument "
                                         rf"'{re.escape(argument)}': expected {re.escape(expected)}"):
        gemmgen.grouped_matmul_swiglu_quant(_X, weight, scale, _XS, _G, **keywords)


@pytest.mark.parametrize("weight,scale,keywords", [
    (_P4, None, {}), (_P4, None, dict(weight_bits=4, weight_assist_matrix=_S)),
    (_W, _S, dict(weight_bits=4)), (list(_W), list(_S), dict(weight_bits=4, weight_assist_matrix=list(_S)))])
def test_public_op_a8w4_arguments_pass_to_the_tensor_checks(weight, scale, keywords):
    """Valid A8W4 arguments on the CPU get as far as the op's first tensor check (x on CUDA)."""
    with pytest.raises(ValueError, match=r"^gemmgen\.grouped_matmul_swiglu_quant: argument 'x': "
                                         r"expected a CUDA tensor"):
        gemmgen.grouped_matmul_swiglu_quant(_X, weight, scale, _XS, _G, **keywords)


# ------------------------------------------------------------------------------- nvcc

_DIRECT_MANIFEST = MANIFEST.replace("dtypes: [e4m3]", "dtypes: [{x: int8, w: int4, scales: group}]").replace(
    """        tile: [128, 128, 128]
        cluster: [1, 1, 1]
        schedule: cooperative
        intermediate: bf16
""", """        tile: [64, 8, 128]
        schedule: direct
        warps_k: 2
""")
_DIRECT_KERNEL = "sm90a_grouped_matmul_swiglu_quant_i8w4g_f32_t64x8x128_direct_wk2_s4"
# the direct kernel's e4m3 path (mma.sync m16n8k32 e4m3 into a float32 accumulator)
_DIRECT_FP8_MANIFEST = _DIRECT_MANIFEST.replace("dtypes: [{x: int8, w: int4, scales: group}]", "dtypes: [e4m3]")
_DIRECT_FP8_KERNEL = "sm90a_grouped_matmul_swiglu_quant_e4m3_f32_t64x8x128_direct_wk2_s4"


@pytest.mark.compile
@pytest.mark.parametrize("text,name", [(MANIFEST, KERNEL), (_DIRECT_MANIFEST, _DIRECT_KERNEL),
                                       (_DIRECT_FP8_MANIFEST, _DIRECT_FP8_KERNEL),
                                       (_WGMMA_MANIFEST.replace("w: int4}", "w: int4, scales: group}"),
                                        _WGMMA_GROUP_KERNEL),
                                       # up to 32 tokens a tile the loop is unrolled over whole
                                       # rings, an 8-chunk ring waiting once every two chunks
                                       (_WGMMA_MANIFEST.replace("w: int4}", "w: int4, scales: group}")
                                        .replace("tile: [128, 64, 128]\n        schedule: wgmma\n",
                                                 "tile: [64, 16, 128]\n        schedule: wgmma\n"
                                                 "        stages: 8\n"),
                                        "sm90a_grouped_matmul_swiglu_quant_i8w4g_f32_t64x16x128_wgmma_s8")],
                         ids=["cutlass", "direct", "direct_fp8", "wgmma", "wgmma_unrolled"])
def test_moe_kernel_compiles_and_loads(tmp_path, text, name):
    """One real kernel of each of the family's kinds (the CUTLASS 3.x grouped GEMM + SwiGLU +
    quant, the direct mma.sync kernel and the wgmma kernel, both with per-group scales): builds,
    loads (ABI size check),
    refuses to run without an sm90 GPU."""
    if not (os.environ.get("CUDACXX") or shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        pytest.skip("nvcc not found")
    toolchain.find_toolchain.cache_clear()
    report = builder.build_manifest(_write(tmp_path, text), tmp_path / "build", jobs=2,
                                    log=lambda line: None)
    assert report.kernel_count == 1
    library = load_library(tmp_path / "build" / "onemoe" / "current")
    assert list(library.kernels) == [name]
    assert library.cdll.gemmgen_moe_args_size() == ctypes.sizeof(MoeArgs)
    args = MoeArgs()
    assert library.kernels[name].run(ctypes.byref(args), None, 0, None) == 5  # GEMMGEN_WRONG_ARCH
    assert name in library.last_error()


def _library_of_shipped_manifest():
    from gemmgen.bindings.library import Kernel, Library
    lib = Library("moe", "sm90a", Path("."), "f" * 16, None, {}, {}, None)
    lib.kernels.update({s.name: Kernel(s, lib, None, None) for s in expand(load_manifest(SHIPPED))})
    return lib


def test_the_tuner_measures_every_moe_class_on_expert_layers_only():
    """`gemmgen tune` on the MoE library: its four classes, each measured on the shapes that name
    experts and top_k (a linear layer's shape is not an MoE problem), at the grid's row counts of
    one token's rows or more; a table's m counts rows (the table_point of the dispatch values)."""
    from gemmgen.tuning import tune as tuning
    from gemmgen.tuning.shapes import load_many
    from gemmgen.tuning.tune import TuneOptions

    lib = _library_of_shipped_manifest()
    classes = tuning.classes_of(lib, TuneOptions(shapes=[], m_grid=(1,)))
    assert classes == sorted({k.spec.dispatch_class for k in lib.kernels.values()})
    assert tuning.classes_of(lib, TuneOptions(shapes=[], m_grid=(1,), dtypes=("e4m3",))) == [
        ("grouped_matmul_swiglu_quant", "e4m3", "e4m3", "channel")]
    # a --dtypes that selects nothing names what the library has, not "no tunable family"
    with pytest.raises(GemmgenError, match=r"--dtypes a8w5 selects none of the classes library "
                                           r"'moe' builds: .*int8 x int4 x channel.*--help"):
        tuning.classes_of(lib, TuneOptions(shapes=[], m_grid=(1,), dtypes=("a8w5",)))
    shapes = load_many(["llama3_8b", "moe_qwen3_30b_a3b", "moe_mixtral_8x7b"])
    measured = tuning.shapes_for(classes[0], shapes)
    assert [(s.n, s.k, s.experts, s.top_k) for s in measured] == [(1536, 2048, 128, 8),
                                                                   (28672, 4096, 8, 2)]
    assert tuning.grid_for(classes[0], measured[0], (2, 6, 8, 16)) == (8, 16)  # top-8
    # without --m the MoE library is tuned on its rows grid (640 rows included: ragged experts),
    # whatever other shapes are given; dispatch rounds rows up to that grid before reading a
    # table, so a point off it would make a bucket nothing reaches (rows 3-4 look up 6): the plan
    # is refused before anything runs; a subset of it, or points past it, may be asked for
    from gemmgen.tuning.shapes import MOE_M_GRID
    assert tuning.default_m_grid(lib, TuneOptions(shapes=shapes, m_grid=())) == MOE_M_GRID
    assert {320, 640, 7168} < set(MOE_M_GRID)
    tuning.check_plan(lib, TuneOptions(shapes=shapes, m_grid=(2, 6, 8, 16384, 24576)))
    tuning.check_plan(lib, TuneOptions(shapes=shapes, m_grid=(256, 320, 512, 640, 768)))
    with pytest.raises(GemmgenError, match=r"--m: the MoE family's dispatch rounds rows up to its "
                       r"grid \(2, 6, 8, .*8192, then multiples of 8192\).*; 4, 9000 are not on it "
                       r"\(rounded: 6, 16384\)"):
        tuning.check_plan(lib, TuneOptions(shapes=shapes, m_grid=(2, 4, 8, 9000)))
    w8a8 = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")
    assert [s.experts for s in tuning.shapes_for(w8a8, shapes)] == [0, 0, 0, 0]  # linear layers
    assert FAMILY.has_tables and FAMILY.table_point((5, 128, 1536, 2048, 600)) == (600, 1536, 2048)


def test_a_retune_of_the_moe_table_takes_its_shape_files(monkeypatch):
    """`gemmgen tune --library moe --retune <the shipped H200 table>`: the table keeps only (N, K)
    of its layers, and the MoE tuner needs their experts and top-k, so without --shapes it is
    refused with a message that says so; with the shape files it re-times the asked rows of the
    layers the table lists, and the table's pick at each point is among what it times."""
    from gemmgen.tuning import tune as tuning
    from gemmgen.tuning.shapes import load_many
    from gemmgen.tuning.tune import TuneOptions

    monkeypatch.setattr(tuning, "gpu_identity", lambda: ("NVIDIA H200", 132))
    lib = _library_of_shipped_manifest()
    table = DEFAULT_MANIFEST_DIR / "moe_sm90.tuned.h200.yaml"
    bare = TuneOptions(shapes=[], m_grid=(256, 512), dtypes=("e4m3",), retune=str(table))
    with pytest.raises(GemmgenError, match=r"keeps only \(N, K\) of its shapes.*experts and top-k.*--shapes"):
        tuning.table_to_retune(lib, bare)
    options = TuneOptions(shapes=load_many(["moe_mixtral_8x7b"]), m_grid=(256, 512), dtypes=("e4m3",),
                          retune=str(table))
    retuning = tuning.table_to_retune(lib, options)
    assert options.m_grid == (256, 512) and [(s.n, s.k) for s in options.shapes] == [(28672, 4096)]
    (cls,) = tuning.classes_of(lib, options)
    picks = tuning.previous_picks(lib, options)
    for m in (256, 512):
        bucket = retuning.classes[cls].lookup(m, 28672, 4096).bucket
        assert picks(cls, 28672, 4096, m) == [tuning._candidate_of(bucket)]
    assert picks(cls, 1536, 2048, 256) and picks(cls, 4096, 4096, 256) == []  # a layer it lists; one it does not


def test_the_tuner_refuses_what_cannot_give_an_moe_table(tmp_path):
    """Before anything is measured: no expert layer among the shapes, or --select (whose pruned
    rules are over m); two expert layers of one (n, k) with other experts or top-k clash."""
    from gemmgen.errors import GemmgenError
    from gemmgen.tuning import tune as tuning
    from gemmgen.tuning.shapes import load_many
    from gemmgen.tuning.tune import TuneOptions

    lib = _library_of_shipped_manifest()
    with pytest.raises(GemmgenError, match="none of the 4 shapes is measured by library 'moe' "
                                           r"\(moe\): the MoE family's tuner takes expert layers"):
        tuning.check_plan(lib, TuneOptions(shapes=load_many(["llama3_8b"]), m_grid=(8,)))
    with pytest.raises(GemmgenError, match="--select writes a pruned manifest with rules over m; "
                                           "the moe family's rules are over tokens_per_expert"):
        tuning.check_plan(lib, TuneOptions(shapes=load_many(["moe_mixtral_8x7b"]), m_grid=(8,),
                                           select=True))
    other = tmp_path / "other.yaml"
    other.write_text("model: Other\nshapes:\n  - {name: w13, n: 2816, k: 2048, experts: 60, top_k: 4}\n")
    with pytest.raises(ManifestError, match=r"other\.yaml:3: shapes: expected one expert layer per "
                                            r"\(n, k\); 2816x2048 has 60 experts, top 4 here and 64, top 6"):
        load_many(["moe_deepseek_v2_lite", str(other)])


@pytest.mark.parametrize("experts,top_k", [(8, 2), (128, 8), (64, 6), (4, 4)])
def test_the_tuners_batch_has_the_points_rows(experts, top_k):
    """The routed batches of a tuning point of m rows: the most whole tokens that fit (one token
    below top-k rows), each in top-k distinct experts, uniform or Zipf-skewed (the hot experts
    first); another routing is refused by name."""
    from gemmgen.families.moe.tuning import ROUTINGS, routing_counts, tokens_for
    for m in (1, 2, 3, 7, 16, 64, 1024, 8192):
        tokens = tokens_for(m, top_k)
        assert tokens == max(1, m // top_k)
        for routing in ROUTINGS:
            counts = routing_counts(tokens, experts, top_k, seed=m, routing=routing)
            assert sum(counts) == tokens * top_k and max(counts) <= tokens and len(counts) == experts
            assert sum(counts) <= m or tokens == 1
    if top_k < experts:
        uniform = routing_counts(4096, experts, top_k, seed=1, routing="uniform")
        skewed = routing_counts(4096, experts, top_k, seed=1, routing="skewed")
        assert skewed[0] == max(skewed) and skewed[0] > 1.2 * max(uniform)
        assert sum(skewed[-max(1, experts // 4):]) < sum(uniform[-max(1, experts // 4):])
    with pytest.raises(ValueError, match=r"routing: expected one of uniform, skewed, got 'zipf'"):
        routing_counts(4, experts, top_k, seed=0, routing="zipf")


def test_moe_shape_files_name_experts_and_top_k_together(tmp_path):
    from gemmgen.tuning.shapes import load_shapes
    bad = {"experts: 8}": "expected 'top_k' beside 'experts'",
           "experts: 8, top_k: 9}": "top_k: expected at most experts (8), got 9",
           "experts: 0, top_k: 1}": "experts: expected an integer in [1, 65535], got 0",
           "experts: 8, top_k: 2, tokens: 3}": "expected one of name, n, k, experts, top_k, got "
                                               "unknown key 'tokens'"}
    for tail, message in bad.items():
        path = tmp_path / "s.yaml"
        path.write_text("model: X\nshapes:\n  - {name: w13, n: 64, k: 64, " + tail + "\n")
        with pytest.raises(ManifestError, match=re.escape(message)):
            load_shapes(path)


def _moe_table(path: Path, specs, gpu=("NVIDIA H200", 132)) -> str:
    """A table `gemmgen tune` could have written beside the MoE manifest at `path`: A8W4 per
    channel on Mixtral's layer, `mid_wgmma` up to 8 rows, `stream` beyond."""
    from gemmgen.generator.kernel_config import RuntimeKnobs
    from gemmgen.tuning.table import (Bucket, ClassTable, ShapeEntry, kernel_set_hash, render_table,
                                      table_path_for)
    key = ("grouped_matmul_swiglu_quant", "int8", "int4", "channel")
    name = {s.origin.config: s.name for s in specs if s.dispatch_class == key}
    shapes = (ShapeEntry(28672, 4096, (Bucket(8, name["mid_wgmma"], RuntimeKnobs()),
                                       Bucket(8192, name["stream"], RuntimeKnobs()))),)
    meta = {"library": "moe", "arch": "sm90a", "gpu": gpu[0], "sm_count": gpu[1],
            "kernel_set": kernel_set_hash(s.name for s in specs)}
    table_path_for(path, gpu[0]).write_text(render_table(meta, [ClassTable(key, shapes)]))
    return name["mid_wgmma"]


def test_a_tuned_moe_table_serves_its_listed_layers_only(tmp_path, monkeypatch):
    """Dispatch reads an MoE table at (rows, n, k) of the listed layer; another
    layer (no nearest-shape transfer: the layers of two MoE models differ in E and top-k too) and
    a class the table does not hold go to the manifest's rules."""
    from gemmgen.bindings import library as binding_library
    path = tmp_path / "moe_sm90.yaml"
    shutil.copy(SHIPPED, path)
    specs = expand(load_manifest(path))
    mid_wgmma = _moe_table(path, specs)
    monkeypatch.setattr(dispatch, "gpu_identity", lambda device=None: ("NVIDIA H200", 132))
    monkeypatch.setattr(dispatch, "gpu_capability", lambda device=None: (9, 0))
    dispatch.cache_clear()
    binding_library.reload()
    try:
        a8w4 = dict(x_dtype=torch.int8, weight_bits=4, manifests=[path])
        choice = dispatch.choose("grouped_matmul_swiglu_quant", m=2, experts=8, n=28672, k=4096, **a8w4)
        assert choice.source == "table" and choice.kernel.name == mid_wgmma
        assert "bucket rows <= 8" in choice.reason and "moe_sm90.tuned.h200.yaml" in choice.reason
        # 9 rows and more: the second bucket, though 9 rows make 2 tokens per expert as 16 do
        for rows in (9, 16, 100000):
            assert dispatch.choose("grouped_matmul_swiglu_quant", m=rows, experts=8, n=28672,
                                   k=4096, **a8w4).kernel.spec.origin.config == "stream"
        assert dispatch.choose("grouped_matmul_swiglu_quant", m=8, experts=8, n=28672, k=4096,
                               **a8w4).kernel.name == mid_wgmma
        for other in (dict(m=2, experts=8, n=28672, k=2048, **a8w4),  # another layer
                      dict(m=2, experts=8, n=28672, k=4096, per_group=True, **a8w4),  # another class
                      dict(m=2, experts=8, n=28672, k=4096, x_dtype=torch.int8, manifests=[path])):
            choice = dispatch.choose("grouped_matmul_swiglu_quant", **other)
            assert choice.source == "rule", other
        rules = dispatch.choose("grouped_matmul_swiglu_quant", m=2, experts=8, n=28672, k=4096,
                                tuned=False, **a8w4)
        assert rules.source == "rule" and rules.kernel.name != mid_wgmma
    finally:
        dispatch.cache_clear()
        binding_library.reload()


def test_routing_counts_are_the_benchmarks_earlier_draws():
    """bench_moe.py's batches are drawn by the tuner's routing_counts since session 20 and must
    equal the draws of its earlier own code (so its rows stay comparable with earlier results):
    a Generator seeded by crc32("<model>/<tokens>/<routing>"), odds 1 or 1/(i+1), multinomial
    without replacement."""
    import zlib

    import torch

    from gemmgen.families.moe.tuning import routing_counts
    for name, experts, top_k in (("mixtral-8x7b", 8, 2), ("qwen3-30b-a3b", 128, 8)):
        for tokens in (1, 16, 1024):
            for routing in ("uniform", "skewed"):
                seed = zlib.crc32(f"{name}/{tokens}/{routing}".encode())
                gen = torch.Generator().manual_seed(seed)
                odds = (torch.ones(experts) if routing == "uniform"
                        else 1.0 / torch.arange(1, experts + 1, dtype=torch.float32))
                picks = torch.multinomial(odds.repeat(tokens, 1), top_k, replacement=False, generator=gen)
                earlier = torch.bincount(picks.flatten(), minlength=experts).tolist()
                assert routing_counts(tokens, experts, top_k, seed, routing) == earlier


def test_the_tuners_time_is_the_mean_over_both_routings(monkeypatch):
    """time_candidate times the pool's calls once per routing's group list, through a CUDA
    graph, and returns the mean; a candidate that cannot be captured is an error, not a time."""
    import pytest as _pytest

    from gemmgen.errors import GemmgenError
    from gemmgen.families.moe import tuning
    from gemmgen.tuning.measure import Candidate

    seen = []
    times = {"uniform": 10.0, "skewed": 30.0}
    lists = {"uniform": object(), "skewed": object()}

    def fake_impl(q, q_scale, x, w, w_scale, x_scale, group_list, *rest):
        seen.append(group_list)

    def fake_graph_time(call, pool_size):
        before = len(seen)
        for i in range(pool_size):
            call(i)
        routing = next(r for r, gl in lists.items() if gl is seen[before])
        assert all(gl is lists[routing] for gl in seen[before:])
        return times[routing], "graph"

    monkeypatch.setattr(tuning.ops, "_gmm_swiglu_quant_out_impl", fake_impl)
    monkeypatch.setattr(tuning, "graph_time_us", fake_graph_time)
    problem = tuning.Problem(pool=[("x", "xs", "w", "ws")] * 3, group_lists=dict(lists),
                             weight_bits=8, q=None, q_scale=None)
    candidate = Candidate("k", "heuristic", 1, 1)
    assert tuning.time_candidate(candidate, problem) == 20.0
    assert len(seen) == 6 and {id(gl) for gl in seen} == {id(gl) for gl in lists.values()}
    monkeypatch.setattr(tuning, "graph_time_us", lambda call, n: (5.0, "eager (RuntimeError)"))
    with _pytest.raises(GemmgenError, match="could not be captured in a CUDA graph"):
        tuning.time_candidate(candidate, problem)


def test_the_moe_tuners_dtypes_select_an_x_dtype_or_one_class():
    """`gemmgen tune --dtypes`: int8 / e4m3 select every class of that x dtype; a8w8, a8w4 and
    a8w4g one class each (re-tuning per-channel A8W4 alone after adding its configs)."""
    from types import SimpleNamespace

    from gemmgen.families.moe import tuning
    op = "grouped_matmul_swiglu_quant"
    built = {(op, "int8", "int8", "channel"), (op, "int8", "int4", "channel"),
             (op, "int8", "int4", "group"), (op, "e4m3", "e4m3", "channel")}

    def picked(*dtypes):
        return [c[1:] for c in tuning.classes(built, SimpleNamespace(dtypes=dtypes))]
    assert len(picked()) == 4
    assert picked("int8") == [("int8", "int4", "channel"), ("int8", "int4", "group"),
                              ("int8", "int8", "channel")]
    assert picked("a8w4") == [("int8", "int4", "channel")]
    assert picked("a8w4g", "e4m3") == [("e4m3", "e4m3", "channel"), ("int8", "int4", "group")]
    assert picked("a8w8") == [("int8", "int8", "channel")]
    assert picked("bf16") == []


def test_the_tuners_scales_keep_c_of_order_one():
    """Full-range values of each kind with unit_output_scales on both sides give C = Σ_K x·w·sx·sw
    a standard deviation of order one (the fused kernels' time depends on C's size)."""
    from gemmgen.families.moe import tuning
    gen = torch.Generator().manual_seed(0)
    k = 4096
    values = {"int8": lambda s: torch.randint(-128, 128, s, generator=gen).float(),
              "int4": lambda s: torch.randint(-8, 8, s, generator=gen).float(),
              "e4m3": lambda s: torch.randn(s, generator=gen).to(torch.float8_e4m3fn).float()}
    for x_kind, w_kind in (("int8", "int8"), ("int8", "int4"), ("e4m3", "e4m3")):
        x, w = values[x_kind]((64, k)), values[w_kind]((k, 256))
        sx = tuning.unit_output_scales((64, 1), k, x_kind, generator=gen, device="cpu")
        sw = tuning.unit_output_scales((1, 256), k, w_kind, generator=gen, device="cpu")
        c = (x.double() @ w.double()) * sx.double() * sw.double()
        assert 0.5 < c.std().item() < 2.0, (x_kind, w_kind, c.std().item())


def test_the_moe_tuner_retimes_within_15_percent_and_names_its_method_in_the_store():
    from gemmgen.families.moe import tuning
    assert all(tuning.retime_window(m) == 0.15 for m in (2, 64, 8192))
    assert tuning.MEASURE_METHOD == "uniform+skewed-unitc"


def test_a_store_names_its_familys_measuring_method(monkeypatch, tmp_path):
    """The MoE store's file name carries MEASURE_METHOD (a store timed another way is not
    resumed); a family without one (W8A8) keeps the plain name."""
    from types import SimpleNamespace

    from gemmgen import settings
    from gemmgen.tuning import tune as tuning

    monkeypatch.setattr(tuning, "gpu_identity", lambda: ("NVIDIA H200", 132))
    monkeypatch.setattr(settings, "build_dir", lambda: tmp_path)

    def library(name, op):
        kernel = SimpleNamespace(spec=SimpleNamespace(op=op))
        return SimpleNamespace(name=name, kernel_set="abc", kernels={"k": kernel})
    options = SimpleNamespace(seed=0, retune=None)
    moe = tuning.store_path(library("moe", "grouped_matmul_swiglu_quant"), options)
    assert moe == tmp_path / "tune" / "moe-abc-uniform+skewed-unitc-NVIDIA_H200-132sm-seed0.jsonl"
    w8a8 = tuning.store_path(library("w8a8", "scaled_mm"), options)
    assert w8a8 == tmp_path / "tune" / "w8a8-abc-NVIDIA_H200-132sm-seed0.jsonl"


def test_dispatch_use_may_spell_default_keys(tmp_path):
    """A dispatch `use` mapping may spell an own-kernel config's keys at their defaults (cluster
    [1, 1, 1], swap_ab false, fused false), as the config itself may."""
    text = """\
library: usedefaults
arch: sm90a
families:
  - name: moe_int8
    op: grouped_matmul_swiglu_quant
    dtypes: [int8]
    configs:
      - {name: stream, tile: [64, 8, 128], schedule: direct, warps_k: 2, cluster: [1, 1, 1]}
      - {name: mid, tile: [128, 128, 128], cluster: [1, 1, 1], schedule: cooperative}
    dispatch:
      - {when: "tokens_per_expert <= 8", use: {schedule: direct, cluster: [1, 1, 1], swap_ab: false}}
      - {when: "true", use: {tile: [128, 128, 128], fused: false}}
"""
    (family,) = load_manifest(_write(tmp_path, text)).families
    assert [family.configs[r.config_index].name for r in family.dispatch] == ["stream", "mid"]
