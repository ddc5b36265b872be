"""The MoE family (grouped_matmul_swiglu_quant) on the CPU: manifest keys and rules (file:line
errors), expansion and names, rendering, the dispatch request and the shipped rules (from the
manifest, nothing built), the packed weight layout (`pack_moe_weights` / `MoeWeight`), every
argument check of the op on fake CUDA tensors, and one real nvcc build of a MoE kernel (the CI
compile of this family's template).

The group lists and the torch reference are tested in test_moe_reference.py."""

from __future__ import annotations

import ctypes
import dataclasses
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
from gemmgen.errors import ManifestError
from gemmgen.families.moe import FAMILY, ops, packing
from gemmgen.families.moe.abi import ARGS_LAYOUT, MoeArgs
from gemmgen.families.moe.configs import ELEMENTS, INTERMEDIATES
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest
from gemmgen.generator.render import render_bindings, render_kernel_sources, render_library_source
from gemmgen.settings import DEFAULT_MANIFEST_DIR

OP = "grouped_matmul_swiglu_quant"
INT8, FP8, BF16 = torch.int8, torch.float8_e4m3fn, torch.bfloat16
SHIPPED = DEFAULT_MANIFEST_DIR / "moe_sm90.yaml"

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
    assert classes == {(OP, "int8"), (OP, "e4m3")}
    assert len(kernels) == sum(len(f.configs) for f in manifest.families)
    names = [k.name for k in kernels]
    assert len(set(names)) == len(names)
    assert all(n.startswith("sm90a_grouped_matmul_swiglu_quant_") for n in names)
    # fp8 stops at 128x128 tiles (promoted accumulation spills a 128x256 cooperative tile)
    assert {(k.x, k.origin.config) for k in kernels} == {
        ("int8", c) for c in ("decode", "small", "mid", "large")} | {
        ("e4m3", c) for c in ("decode", "small", "mid")}
    # the defaults the shipped manifest relies on: fp32 intermediate, stages auto
    assert all(k.c == "fp32" and k.config.stages == 0 for k in kernels)
    assert "sm90a_grouped_matmul_swiglu_quant_i8_f32_t128x16x128_c1x1x1_pp_sauto_swap" in names


def test_kernel_name_and_fields(tmp_path):
    (kernel,) = expand(load_manifest(_write(tmp_path, MANIFEST)))
    assert kernel.name == KERNEL and (kernel.x, kernel.d, kernel.c) == ("e4m3", "e4m3", "bf16")
    assert kernel.dispatch_class == (OP, "e4m3") and not kernel.split_k
    assert kernel.origin.family == "moe" and kernel.origin.config == "mid"


_AFTER = "        schedule: cooperative\n"


def _add(*lines: str) -> tuple[str, str]:
    """(old, new) that add config keys, each on a line of its own, after `schedule`."""
    return _AFTER, _AFTER + "".join(f"        {line}\n" for line in lines)


@pytest.mark.parametrize("edits,key,needle,message", [
    ([("dtypes: [e4m3]", "dtypes: [int4]")], "dtypes", "dtypes:", "unknown value 'int4'"),
    ([("dtypes: [e4m3]", "dtypes: [e4m3, e4m3]")], "dtypes", "dtypes:", "listed twice"),
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
    ([_add("raster: diagonal")], "raster", "raster:", "unknown value 'diagonal'"),
    ([('when: "true"', 'when: "m <= 16"')], "when", "when:",
     "unknown variable 'm' .* allowed: tokens_per_expert, experts, n, k"),
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


# ------------------------------------------------------------------------------- rendering

def test_render_names_the_manifest_entry_and_checks_the_arch(tmp_path):
    manifest = load_manifest(_write(tmp_path, MANIFEST))
    kernels = expand(manifest)
    (unit,) = render_kernel_sources(manifest, kernels)
    assert '#include "gemmgen/moe/sm90_grouped_swiglu_quant.hpp"' in unit.source
    assert "gemmgen::device_supports(9, 0, 9, 0)" in unit.source
    assert ("cutlass::float_e4m3_t, cutlass::bfloat16_t, /*swap_ab=*/false" in unit.source)
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
    assert list(namespace["DISPATCH"]) == [(OP, "e4m3")]


def test_render_shipped_manifest_spells_every_variant():
    manifest = load_manifest(SHIPPED)
    kernels = expand(manifest)
    units = render_kernel_sources(manifest, kernels)
    assert len(units) == len(kernels)  # kernels_per_file: 1
    element = {"int8": "int8_t", "e4m3": "cutlass::float_e4m3_t"}
    for unit in units:
        (k,) = unit.kernels
        swap = "true" if k.config.swap_ab else "false"
        assert f"{element[k.x]}, float, /*swap_ab=*/{swap}" in unit.source
        assert f"family '{k.origin.family}', config '{k.origin.config}'" in unit.source
        assert "gemmgen::device_supports(9, 0, 9, 0)" in unit.source
    assert {k.origin.config for k in kernels if k.config.swap_ab} == {"decode", "small"}
    namespace: dict = {}
    exec(compile(render_bindings(manifest, kernels, "f" * 16, "lib.so"), "bindings.py", "exec"), namespace)
    assert set(namespace["DISPATCH"]) == {(OP, "int8"), (OP, "e4m3")}


def test_bf16_intermediate_spelling(tmp_path):
    text = MANIFEST.replace("dtypes: [e4m3]", "dtypes: [int8]")
    manifest = load_manifest(_write(tmp_path, text))
    (unit,) = render_kernel_sources(manifest, expand(manifest))
    assert "int8_t, cutlass::bfloat16_t, /*swap_ab=*/false" in unit.source


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
    assert ARGS_LAYOUT.size == ctypes.sizeof(MoeArgs) == 8 * 8 + 4 * 8 + 4 * 4
    values = tuple(range(1, 9)) + (-1, 2**40, 3, 4) + (1, 2, 8, 0)
    buffer = (ctypes.c_char * ARGS_LAYOUT.size)()
    ARGS_LAYOUT.pack_into(buffer, 0, *values)
    args = MoeArgs.from_buffer(buffer)
    assert tuple(getattr(args, name) for name, _ in MoeArgs._fields_) == values


# ------------------------------------------------------------------------------- dispatch

def test_dispatch_request_values():
    family = registry.for_api_op(OP)
    assert family is FAMILY and family.variables == ("tokens_per_expert", "experts", "n", "k")
    for dtype, name in ((INT8, "int8"), (FP8, "e4m3")):
        for m, e, tokens in ((0, 8, 1), (1, 8, 1), (8, 8, 1), (9, 8, 2), (1000, 3, 334),
                             (2**31 - 1, 1, 2**31 - 1)):
            key, values = FAMILY.dispatch_request(OP, x_dtype=dtype, m=m, experts=e, n=4096, k=7168)
            assert key == (OP, name) and values == (tokens, e, 4096, 7168)


@pytest.mark.parametrize("problem,message", [
    (dict(x_dtype=BF16), r"x_dtype must be torch\.int8 or torch\.float8_e4m3fn"),
    (dict(experts=0), r"^experts must be an int in \[1, 2\^31 - 1\], got 0$"),
    (dict(m=-1), r"^m must be an int in \[0, 2\^31 - 1\], got -1$"),
    (dict(m=2**31), r"^m must be an int in \[0, 2\^31 - 1\]"),
    (dict(n=0), r"^n must be an int in \[1, 2\^31 - 1\]"),
    (dict(k=True), r"^k must be an int in \[1, 2\^31 - 1\], got True$"),
    (dict(m=1.0), r"^m must be an int"),
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


@pytest.mark.parametrize("dtype,n,tokens,config", [
    (INT8, 4096, 1, "decode"), (INT8, 4096, 16, "decode"), (INT8, 4096, 17, "small"),
    (INT8, 4096, 64, "small"), (INT8, 4096, 65, "mid"), (INT8, 4096, 128, "mid"),
    (INT8, 4096, 129, "large"), (INT8, 4096, 100_000, "large"),
    (FP8, 4096, 16, "decode"), (FP8, 4096, 17, "small"), (FP8, 4096, 64, "small"),
    (FP8, 4096, 65, "mid"), (FP8, 4096, 100_000, "mid"),
    (FP8, 8192, 65, "small"), (FP8, 28672, 100_000, "small")])
def test_shipped_rules_pick_by_tokens_per_expert(fresh_dispatch, dtype, n, tokens, config):
    experts = 8
    order = {INT8: ["decode", "small", "mid", "large"], FP8: ["decode", "small", "mid"]}[dtype]
    for m in (tokens * experts, (tokens - 1) * experts + 1):  # ceil(m / e) == tokens
        choice = dispatch.choose(OP, manifests=[SHIPPED], tuned=False, x_dtype=dtype, m=m,
                                 experts=experts, n=n, k=7168)
        assert choice.source == "rule" and choice.kernel.spec.origin.config == config
        assert choice.kernel.spec.x == {INT8: "int8", FP8: "e4m3"}[dtype]
        assert choice.rule_index == order.index(config)


def test_no_tokens_is_served_like_one(fresh_dispatch):
    choice = dispatch.choose(OP, manifests=[SHIPPED], tuned=False, x_dtype=INT8, m=0, experts=64,
                             n=4096, k=7168)
    assert choice.kernel.spec.origin.config == "decode"


# ------------------------------------------------------------------------------- packing

def _bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bytes of an 8-bit tensor (e4m3 NaN patterns compare equal)."""
    return t.contiguous().view(torch.int8)


def _random_weight(e, k, n, dtype, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, (e, k, n), generator=gen, dtype=torch.int8).view(dtype)


@pytest.mark.parametrize("dtype", [INT8, FP8])
def test_pack_stacked_and_list(dtype):
    e, k, n = 3, 32, 16
    w = _random_weight(e, k, n, dtype)
    scale = torch.rand(e, n)
    packed = gemmgen.pack_moe_weights(w, scale)
    assert isinstance(packed, gemmgen.MoeWeight)
    assert packed.weight.shape == (e, n, k) and packed.weight.is_contiguous()
    assert packed.weight.dtype == dtype and (packed.experts, packed.n, packed.k) == (e, n, k)
    assert torch.equal(_bits(packed.weight), _bits(w.transpose(1, 2)))
    assert packed.logical_weight().shape == (e, k, n)
    assert torch.equal(_bits(packed.logical_weight()), _bits(w))
    assert packed.scale.dtype == torch.float32 and torch.equal(packed.scale, scale)
    assert (packed.layout_version, packed.arch) == (packing.LAYOUT_VERSION, "sm90a") == (1, "sm90a")
    from_lists = gemmgen.pack_moe_weights(list(w.unbind(0)), list(scale.unbind(0)))
    assert torch.equal(_bits(from_lists.weight), _bits(packed.weight))
    assert from_lists.scale.shape == (e, n) and torch.equal(from_lists.scale, scale)
    moved = dataclasses.replace(packed, arch="sm80").to("cpu")
    assert moved.arch == "sm80" and moved.layout_version == 1
    assert torch.equal(_bits(moved.weight), _bits(packed.weight))


@pytest.mark.parametrize("dtype", [INT8, FP8])
def test_k_major_weights_are_used_without_a_copy(dtype):
    e, n, k = 2, 24, 48
    w_nk = _random_weight(e, n, k, dtype)          # nn.Linear-style [E, N, K], contiguous
    view = w_nk.transpose(1, 2)                    # the contract's [E, K, N]
    assert packing.is_k_major(view) and not packing.is_k_major(view.contiguous())
    packed_w = packing.packed_weight("test", view)
    assert packed_w.data_ptr() == w_nk.data_ptr() and packed_w.is_contiguous()
    packed = gemmgen.pack_moe_weights(view, torch.ones(e, n))
    assert packed.weight.data_ptr() == w_nk.data_ptr()
    copied = packing.packed_weight("test", view.contiguous())
    assert copied.data_ptr() != w_nk.data_ptr() and torch.equal(_bits(copied), _bits(w_nk))


@st.composite
def _packing_case(draw):
    e, k, n = draw(st.integers(1, 4)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
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
    assert torch.equal(_bits(packed.weight), _bits(w.transpose(1, 2)))
    assert torch.equal(packed.scale, scale)
    if form == "k_major":
        assert packed.weight.data_ptr() == w.data_ptr()
    again = gemmgen.pack_moe_weights(packed.logical_weight(), packed.scale)  # already K-major
    assert again.weight.data_ptr() == packed.weight.data_ptr()


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
])
def test_pack_errors(weight, scale, argument, expected):
    with pytest.raises(ValueError, match=rf"^gemmgen\.pack_moe_weights: argument '{re.escape(argument)}': "
                                         rf"expected {re.escape(expected)}"):
        gemmgen.pack_moe_weights(weight, scale)


# ------------------------------------------------------------------------------- argument checks

@pytest.fixture
def fake():
    with FakeTensorMode():
        yield


def _args(m=10, e=4, n=32, k=64, dtype=INT8, device="cuda") -> dict:
    """A valid problem for check_arguments (fake CUDA tensors under FakeTensorMode)."""
    empty = lambda *shape, dtype=torch.float32: torch.empty(shape, dtype=dtype, device=device)  # noqa: E731
    return dict(q=empty(m, n // 2, dtype=dtype), q_scale=empty(m), x=empty(m, k, dtype=dtype),
                w=empty(e, n, k, dtype=dtype), w_scale=empty(e, n), x_scale=empty(m),
                group_list=empty(e, dtype=torch.int64), group_list_type="count")


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
     "a torch.int8 tensor [E, K, N] like x"),
    ("weight 2-D", lambda: dict(w=_empty(32, 64, dtype=INT8)), "weight", "a torch.int8 tensor [E, K, N]"),
    ("weight K", lambda: dict(w=_empty(4, 32, 80, dtype=INT8)), "weight", "K = 64 rows per expert"),
    ("weight not packed", lambda: dict(w=_empty(4, 64, 32, dtype=INT8).transpose(1, 2)), "weight",
     "packed [E, N, K] weights"),
    ("N % 8", lambda: _args(n=12), "weight", "N (the last dim of [E, K, N]) a positive multiple of 8"),
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


def test_sizes_beyond_int32(fake):
    with pytest.raises(ValueError, match=r"argument 'x': expected M, N and K below 2\^31"):
        ops.check_arguments(**_args(m=2**31, e=1, n=8, k=16))


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
                                         r"expected a torch\.int8 tensor \[E, K, N\] like x"):
        gemmgen.grouped_matmul_swiglu_quant(_empty(m, k, dtype=INT8), packed, None, x_scale, g)
    with pytest.raises(ValueError, match=r"^gemmgen\.grouped_matmul_swiglu_quant: argument 'weight'"):
        gemmgen.grouped_matmul_swiglu_quant(x, _empty(e, k, n, dtype=BF16), a["w_scale"], x_scale, g)


def test_public_op_early_errors_on_cpu():
    """Errors the public wrapper raises before any tensor check, on plain CPU tensors."""
    packed = gemmgen.pack_moe_weights(_W, _S)
    x, x_scale = torch.zeros(4, 32, dtype=INT8), torch.ones(4)
    g = torch.tensor([2, 2])
    prefix = r"^gemmgen\.grouped_matmul_swiglu_quant: argument "
    with pytest.raises(ValueError, match=prefix + r"'weight_scale': expected None with a packed MoeWeight"):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, _S, x_scale, g)
    for stale, got in ((dataclasses.replace(packed, layout_version=2), "arch 'sm90a', layout version 2"),
                       (dataclasses.replace(packed, arch="sm80"), "arch 'sm80', layout version 1")):
        with pytest.raises(ValueError, match=prefix + r"'weight': expected a MoeWeight packed for "
                                                      r"sm90a with layout version 1 .*; got " + got):
            gemmgen.grouped_matmul_swiglu_quant(x, stale, None, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'x': expected a 2-D tensor \[M, K\]"):
        gemmgen.grouped_matmul_swiglu_quant(x[0], packed, None, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'weight': expected a torch\.int8 or"):
        gemmgen.grouped_matmul_swiglu_quant(x, _W.to(BF16), _S, x_scale, g)
    with pytest.raises(ValueError, match=prefix + r"'x': expected a CUDA tensor"):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, g)


# ------------------------------------------------------------------------------- nvcc

@pytest.mark.compile
def test_moe_kernel_compiles_and_loads(tmp_path):
    """One real CUTLASS 3.x grouped GEMM + SwiGLU + quant kernel: builds, loads (ABI size check),
    refuses to run without an sm90 GPU."""
    if not (os.environ.get("CUDACXX") or shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        pytest.skip("nvcc not found")
    toolchain.find_toolchain.cache_clear()
    report = builder.build_manifest(_write(tmp_path, MANIFEST), tmp_path / "build", jobs=2,
                                    log=lambda line: None)
    assert report.kernel_count == 1
    library = load_library(tmp_path / "build" / "onemoe" / "current")
    assert list(library.kernels) == [KERNEL]
    assert library.cdll.gemmgen_moe_args_size() == ctypes.sizeof(MoeArgs)
    args = MoeArgs()
    assert library.kernels[KERNEL].run(ctypes.byref(args), None, 0, None) == 5  # GEMMGEN_WRONG_ARCH
    assert KERNEL in library.last_error()
