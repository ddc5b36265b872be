"""GPU tests of the sm80 (CUTLASS 2.x) family, run on Hopper through the compute_80 PTX.

Every sm80 kernel of the built libraries is also exercised by test_scaled_mm_gpu.py's
every-kernel test; here: the `arch="sm80"` dispatch path over M, and the same problem through
every threadblock swizzle (1, 2, 4, 8, stream-K) of one tile shape, which must give bit-identical
results (int8 accumulates exactly, and the epilogue math does not depend on the tile order).
"""

from __future__ import annotations

import pytest
import torch

import gemmgen
from gemmgen.bindings.library import all_kernels, load_library
from gemmgen.build import builder
from gemmgen.errors import LibraryNotBuiltError

pytestmark = pytest.mark.gpu

OUT = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _sm80_kernels():
    """The built sm80 W8A8 kernels (this file tests scaled_mm; the mixed family has its own)."""
    return [k for k in gemmgen.list_kernels("scaled_mm") if k.spec.arch == "sm80"]


def _problem(m: int, n: int, k: int, out_dtype: torch.dtype):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    scale_a = torch.rand(m, 1, device="cuda") * 1e-3 + 1e-4
    scale_b = torch.rand(1, n, device="cuda") * 1e-3 + 1e-4
    # the bias as large as a typical element of the unbiased result, so that a wrong GEMM part
    # cannot hide under it in the relative checks of _assert_close
    rms = float(_reference(a, w.t(), scale_a, scale_b).pow(2).mean().sqrt())
    bias = (torch.randn(n, dtype=torch.float64, device="cuda") * rms).to(out_dtype)
    return a, w.t(), scale_a, scale_b, bias


def _reference(a, b, scale_a, scale_b, bias=None, azp_adj=None, azp=None):
    acc = a.double() @ b.double()
    if azp_adj is not None:
        zero = azp_adj.double()[None, :]
        acc = acc - (zero * azp.double()[:, None] if azp is not None else zero)
    out = scale_a.double().reshape(-1, 1) * scale_b.double().reshape(1, -1) * acc
    return out + bias.double() if bias is not None else out


def _assert_close(out, ref):
    assert not torch.isnan(out).any(), "some outputs were never written"
    tol = 1e-2 if out.dtype == torch.bfloat16 else 2e-3
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < tol, f"relative error {err:.3e}"
    assert torch.allclose(out.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("out_name", ["bf16", "fp16"])
@pytest.mark.parametrize("m", [1, 7, 16, 31, 64, 100, 128, 257, 1024])
def test_arch_sm80_dispatch(m, out_name):
    if not _sm80_kernels():
        pytest.skip("no sm80 library built")
    out_dtype = OUT[out_name]
    n, k = 768, 512
    a, b, scale_a, scale_b, bias = _problem(m, n, k, out_dtype)
    chosen = gemmgen.dispatch.lookup("scaled_mm", a_dtype=torch.int8, out_dtype=out_dtype,
                                     epilogue="ScaledEpilogueBias", m=m, n=n, k=k, arch="sm80")
    assert chosen.spec.arch == "sm80"
    for sa, sb in ((scale_a, scale_b), (scale_a[:1, :1].clone(), scale_b), (scale_a, scale_b[:, :1].clone())):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        gemmgen.scaled_mm(a, b, sa, sb, out_dtype, bias=bias, out=out, arch="sm80")
        _assert_close(out, _reference(a, b, sa, sb, bias))
    azp = torch.randint(-20, 20, (m,), dtype=torch.int32, device="cuda")
    azp_adj = b.to(torch.int32).sum(dim=0, dtype=torch.int32)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, out_dtype, azp_adj, azp=azp, out=out, arch="sm80")
    _assert_close(out, _reference(a, b, scale_a, scale_b, None, azp_adj, azp))


def test_arch_argument_is_checked():
    if not _sm80_kernels():
        pytest.skip("no sm80 library built")
    a, b, scale_a, scale_b, bias = _problem(16, 256, 128, torch.bfloat16)
    with pytest.raises(ValueError, match="'arch'"):
        gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, arch="sm70")
    sm90 = next((k for k in gemmgen.list_kernels("scaled_mm")
                 if k.spec.arch == "sm90a" and k.spec.a == "int8" and k.spec.d == "bf16"
                 and k.spec.epilogue == "ScaledEpilogue"), None)
    if sm90 is None:
        pytest.skip("no sm90a int8 -> bf16 ScaledEpilogue kernel built: the kernel/arch mismatch "
                    "check needs one")
    with pytest.raises(ValueError, match="'kernel'.*arch sm80"):
        gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, kernel=sm90.name, arch="sm80")


SWIZZLE_MANIFEST = """\
library: swizzles_sm80
arch: sm80
kernels_per_file: 1
families:
  - name: int8
    op: scaled_mm
    dtypes: [{a: int8, d: bf16}]
    epilogues: [ScaledEpilogueBias]
    configs:
""" + "".join(
    f"      - {{name: sw_{s}, tile: [128, 128, 64], warp: [64, 64, 64], stages: 4, swizzle: {s}}}\n"
    for s in (1, 2, 4, 8, "streamk"))


@pytest.fixture(scope="module")
def swizzle_kernels(tmp_path_factory):
    """A library of one tile shape in every threadblock swizzle, built by the real pipeline."""
    # Module-scoped, so it runs before the per-test GPU check of conftest.py: check here first.
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("needs a GPU of compute capability 8.0 or newer")
    try:
        registry = all_kernels()
    except LibraryNotBuiltError as exc:
        pytest.skip(f"gemmgen kernel library not available: {exc}")
    root = tmp_path_factory.mktemp("swizzles")
    manifest = root / "swizzles.yaml"
    manifest.write_text(SWIZZLE_MANIFEST)
    builder.build_manifest(manifest, root / "build", log=lambda line: None)
    library = load_library(root / "build" / "swizzles_sm80" / "current")
    registry.update(library.kernels)  # callable by name for this module's tests
    yield library.kernels
    for name in library.kernels:
        registry.pop(name, None)


@pytest.mark.parametrize("m, n, k", [(300, 1024, 512), (256, 256, 4096), (1, 4096, 1024)])
def test_every_swizzle_gives_identical_output(swizzle_kernels, m, n, k):
    assert len(swizzle_kernels) == 5
    a, b, scale_a, scale_b, bias = _problem(m, n, k, torch.bfloat16)
    ref = _reference(a, b, scale_a, scale_b, bias)
    outputs = {}
    for name in sorted(swizzle_kernels):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias=bias, out=out, kernel=name)
        _assert_close(out, ref)
        outputs[name] = out
    first = next(iter(outputs.values()))
    for name, out in outputs.items():
        assert torch.equal(out, first), f"{name} differs from the other swizzles"


def _ulps_apart(x: torch.Tensor, y: torch.Tensor) -> int:
    """Largest distance between x and y in units of the output type's last place."""
    eps = torch.finfo(x.dtype).eps
    scale = torch.maximum(x.abs(), y.abs()).double().clamp_min(torch.finfo(x.dtype).tiny)
    return int(((x.double() - y.double()).abs() / (scale * eps)).max().ceil().item())


@pytest.mark.parametrize("epilogue", ["ScaledEpilogue", "ScaledEpilogueBias", "ScaledEpilogueAzp",
                                      "ScaledEpilogueAzpPerToken"])
# (16, 256, 256): K / slices under CUTLASS's 128-element K alignment, so it makes fewer K
# partitions than the slices asked for (the reduction must sum only those it wrote).
@pytest.mark.parametrize("m, n, k", [(1, 512, 4096), (48, 1024, 2048), (200, 256, 8192), (16, 256, 256)])
def test_split_k_matches_no_split(m, n, k, epilogue):
    """Serial and parallel split-K, at several slice counts, give the result of no split."""
    def kernel_for(split_mode):
        return next(kern for kern in _sm80_kernels()
                    if kern.spec.d == "bf16" and kern.spec.epilogue == epilogue
                    and kern.config.tile == (64, 128, 128) and kern.config.split_k == split_mode)
    try:
        # a list, not a generator: next()'s StopIteration inside a generator becomes RuntimeError
        plain, serial, parallel = [kernel_for(mode) for mode in ("none", "serial", "parallel")]
    except StopIteration:
        pytest.skip("the default sm80 manifest's split-K configs are not built")
    a, b, scale_a, scale_b, bias = _problem(m, n, k, torch.bfloat16)
    azp_adj = b.to(torch.int32).sum(dim=0, dtype=torch.int32)
    azp = torch.randint(-20, 20, (m,), dtype=torch.int32, device="cuda")
    if epilogue == "ScaledEpilogue":
        call, ref = (lambda **kw: gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, **kw),
                     _reference(a, b, scale_a, scale_b))
    elif epilogue == "ScaledEpilogueBias":
        call, ref = (lambda **kw: gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias=bias, **kw),
                     _reference(a, b, scale_a, scale_b, bias))
    elif epilogue == "ScaledEpilogueAzp":
        azp_with_adj = azp_adj * 3
        call, ref = (lambda **kw: gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, torch.bfloat16,
                                                        azp_with_adj, bias=bias, **kw),
                     _reference(a, b, scale_a, scale_b, bias, azp_with_adj))
    else:
        call, ref = (lambda **kw: gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, torch.bfloat16,
                                                        azp_adj, azp=azp, **kw),
                     _reference(a, b, scale_a, scale_b, None, azp_adj, azp))

    def run(**kw):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        call(out=out, **kw)
        _assert_close(out, ref)
        return out

    expected = run(kernel=plain.name)
    for kernel in (serial, parallel):
        for slices in (None, 1, 2, 3, 8):  # None: the config's own 4 slices
            out = run(kernel=kernel.name, split_k=slices)
            distance = _ulps_apart(out, expected)
            assert distance <= 1, f"{kernel.name} split_k={slices}: {distance} ulps from no split"
    with pytest.raises(ValueError, match="'split_k'"):
        run(kernel=plain.name, split_k=2)
