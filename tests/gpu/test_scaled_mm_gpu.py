"""GPU tests of gemmgen's W8A8 scaled GEMM (sm90): every built kernel, dispatch, azp, shapes,
strided operands, argument errors, CUDA graphs, torch.compile, opcheck.

Conventions (vLLM's): a [M, K] row-major int8 / float8_e4m3fn; b [K, N] column-major (`w.t()` of
a row-major [N, K] weight); scale_a float32 with 1 or M values, scale_b float32 with 1 or N
values; bias [N] in the output dtype.

Every check compares with an independent float64 reference built from the quantized inputs
(exact for int8, whose int32 accumulation is exact), writes into an output poisoned with NaN so
an element the kernel never wrote is caught, and uses fresh random data (seeded per test by
conftest.py, so a failure reproduces).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch

import gemmgen
import gemmgen.families.w8a8.ops  # noqa: F401  (registers torch.ops.gemmgen.scaled_mm_out)
from gemmgen.errors import KernelLaunchError, NoKernelError
from gemmgen.families.w8a8.configs import AZP_EPILOGUES

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
FP8 = torch.float8_e4m3fn
IN_DTYPES = {"int8": torch.int8, "e4m3": FP8}
OUT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SCALE_MODES = [(False, False), (False, True), (True, False), (True, True)]  # (per-token, per-channel)

# Random positive scales per input dtype, (low, width): keep |D| well inside fp16 (|D| < ~300
# with int8 in [-128, 127] and K <= 4096; fp8 inputs are ~N(0, 1), so they get larger scales).
SCALE_RANGE = {torch.int8: (0.001, 0.01), FP8: (0.05, 0.5)}

# Tolerances, element-wise |out - ref| <= RTOL·|ref| + ATOL_FRACTION·max|ref| [+ fp8 term]:
# * Rounding the fp32 epilogue result to bf16 (8 significant bits) / fp16 (11) is off by at most
#   2^-8 = 3.9e-3 / 2^-11 = 4.9e-4 of the value; the fp32 epilogue itself adds ~1e-7 relative.
#   int8 accumulation is exact, so for int8 this is the whole error.
# * ATOL_FRACTION covers results that cancel to ~0 (bias) and fp16 subnormals.
# * fp8 accumulates with FastAccum (no periodic promotion to fp32): Hopper's fp8 MMA keeps ~14
#   bits per step, so the error scales with s_a·s_b·(|A|·|B|), not with |ref|; the bound
#   FP8_ACCUM_FRACTION of that magnitude is several times a pessimistic estimate at K = 4096.
RTOL = {torch.bfloat16: 5e-3, torch.float16: 7e-4}
ATOL_FRACTION = 1e-5
FP8_ACCUM_FRACTION = 5e-3
# ‖out - ref‖ / ‖ref‖: for int8 below the worst-case rounding 2^-8 / 2^-11 (typical ~1.5e-3 / 2e-4);
# fp8 adds the fast-accumulation error (~1% at K = 4096 in a pessimistic model).
NORM_TOL = {(torch.int8, torch.bfloat16): 3e-3, (torch.int8, torch.float16): 4e-4,
            (FP8, torch.bfloat16): 3e-2, (FP8, torch.float16): 3e-2}


# ------------------------------------------------------------------------------------ helpers

def rand_q(shape, dtype: torch.dtype) -> torch.Tensor:
    """Fresh quantized values on the GPU: int8 uniform in [-128, 127]; e4m3 from randn."""
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, dtype=torch.int8, device=DEVICE)
    if dtype == FP8:
        return torch.randn(shape, device=DEVICE).to(FP8)
    raise AssertionError(f"no generator for {dtype}")


def poisoned(shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@dataclass
class Problem:
    """Operands plus their exact product; `b` is column-major [K, N]."""

    a: torch.Tensor
    b: torch.Tensor
    acc: torch.Tensor                 # A·B in float64 [M, N] (exact for int8 and fp8 inputs)
    mag: Optional[torch.Tensor]       # |A|·|B| in float64, fp8 only: bounds the fast-accum error

    @property
    def m(self) -> int:
        return self.a.shape[0]

    @property
    def n(self) -> int:
        return self.b.shape[1]

    @property
    def k(self) -> int:
        return self.a.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.a.dtype

    def rows(self, m: int) -> "Problem":
        """The first m rows of A (a contiguous row-major prefix) with the same B."""
        return Problem(self.a[:m], self.b, self.acc[:m], None if self.mag is None else self.mag[:m])


def problem_from(a: torch.Tensor, b: torch.Tensor) -> Problem:
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    mag = a64.abs() @ b64.abs() if a.dtype == FP8 else None
    return Problem(a, b, a64 @ b64, mag)


def make_problem(m: int, n: int, k: int, dtype: torch.dtype) -> Problem:
    a = rand_q((m, k), dtype)
    w = rand_q((n, k), dtype)  # row-major [N, K] weight; the op takes it column-major as w.t()
    return problem_from(a, w.t())


def make_scales(m: int, n: int, dtype: torch.dtype, per_token: bool, per_channel: bool,
                layout: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 scales; `layout` alternates the accepted shapes: [1]/[M]/[N] vs [1,1]/[M,1]/[1,N]."""
    low, width = SCALE_RANGE[dtype]
    flat = layout % 2 == 1

    def draw(shape):
        return torch.rand(shape, dtype=torch.float32, device=DEVICE) * width + low

    scale_a = draw(((m,) if flat else (m, 1)) if per_token else ((1,) if flat else (1, 1)))
    scale_b = draw(((n,) if flat else (1, n)) if per_channel else ((1,) if flat else (1, 1)))
    return scale_a, scale_b


def reference(acc: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              bias: Optional[torch.Tensor] = None, zp: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float64 epilogue: s_a[m] · s_b[n] · (acc − zp) + bias[n]."""
    x = acc if zp is None else acc - zp
    d = scale_a.to(torch.float64).reshape(-1, 1) * (scale_b.to(torch.float64).reshape(1, -1) * x)
    if bias is not None:
        d = d + bias.to(torch.float64).reshape(1, -1)
    return d


def make_bias(n: int, out_dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """Random bias in the output dtype, as large as a typical element of `like` (the unbiased D)."""
    rms = float(like.pow(2).mean().sqrt())
    return (torch.randn(n, dtype=torch.float64, device=DEVICE) * rms).to(out_dtype)


def column_sums(b: torch.Tensor) -> torch.Tensor:
    """Σ_k b[k, n] as int32 [N] (what vLLM calls azp_adj)."""
    return b.to(torch.int64).sum(dim=0).to(torch.int32)


def nonzero_zero_point() -> int:
    z = int(torch.randint(1, 128, ()).item())
    return z if torch.rand(()).item() < 0.5 else -z


def make_zero_points(p: Problem, mode: str):
    """(azp_adj, azp, zp) for the azp epilogues; zp is the float64 [M, N] (or [1, N]) term that
    the epilogue subtracts from the accumulator.

    with_adj:         per-tensor zero point z, azp_adj = z · colsum(B)   (ScaledEpilogueAzp)
    per_token:        azp [M] in [-128, 127], azp_adj = colsum(B)       (ScaledEpilogueAzpPerToken)
    random_adj:       arbitrary int32 azp_adj of the accumulator's size (ScaledEpilogueAzp)
    random_per_token: arbitrary azp [M] and azp_adj [N]                  (ScaledEpilogueAzpPerToken)
    """
    spread = max(2, int(3 * float(p.acc.std())))  # comparable to the accumulator itself
    if mode == "with_adj":
        azp_adj = (nonzero_zero_point() * column_sums(p.b).to(torch.int64)).to(torch.int32)
        azp = None
    elif mode == "per_token":
        azp_adj = column_sums(p.b)
        azp = torch.randint(-128, 128, (p.m,), dtype=torch.int32, device=DEVICE)
    elif mode == "random_adj":
        azp_adj = torch.randint(-spread, spread + 1, (p.n,), dtype=torch.int32, device=DEVICE)
        azp = None
    elif mode == "random_per_token":
        azp_adj = torch.randint(-(spread // 64) - 1, spread // 64 + 2, (p.n,), dtype=torch.int32,
                                device=DEVICE)
        azp = torch.randint(-128, 128, (p.m,), dtype=torch.int32, device=DEVICE)
    else:
        raise AssertionError(f"unknown zero-point mode {mode!r}")
    zp = azp_adj.to(torch.float64).reshape(1, -1)
    if azp is not None:
        zp = azp.to(torch.float64).reshape(-1, 1) * zp
    return azp_adj, azp, zp


def assert_matches(out: torch.Tensor, ref: torch.Tensor, *, in_dtype: torch.dtype,
                   mag: Optional[torch.Tensor] = None, label: str = "") -> None:
    """out (bf16/fp16, poisoned with NaN before the call) against the float64 reference.

    `mag` is s_a·s_b·(|A|·|B|) for fp8 inputs: the scale of the fast-accumulation error.
    """
    assert tuple(out.shape) == tuple(ref.shape), f"{label}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o = out.to(torch.float64)
    nan = torch.isnan(o)
    if nan.any():
        where = nan.nonzero()[0].tolist()
        raise AssertionError(f"{label}: {int(nan.sum())} of {o.numel()} output elements are still "
                             f"NaN (never written, or NaN produced), first at {where}")
    assert bool(torch.isfinite(o).all()), f"{label}: non-finite output values"
    ref_abs = ref.abs()
    amax = float(ref_abs.max())
    err = (o - ref).abs()
    tol = RTOL[out.dtype] * ref_abs + ATOL_FRACTION * amax
    if in_dtype == FP8:
        assert mag is not None, "fp8 checks need the |A|·|B| magnitude"
        tol = tol + FP8_ACCUM_FRACTION * mag
    bad = err > tol
    if bad.any():
        worst = int(torch.argmax(err - tol))
        i, j = divmod(worst, ref.shape[1])
        raise AssertionError(
            f"{label}: {int(bad.sum())} of {o.numel()} elements off; worst at [{i}, {j}]: "
            f"out={float(o[i, j])!r} ref={float(ref[i, j])!r} |err|={float(err[i, j]):.3g} "
            f"tol={float(tol[i, j]):.3g} (max|ref|={amax:.3g})")
    rel = float(torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref))
    limit = NORM_TOL[(in_dtype, out.dtype)]
    assert rel <= limit, f"{label}: ‖out−ref‖/‖ref‖ = {rel:.3g} > {limit}"


def scaled_mag(p: Problem, scale_a: torch.Tensor, scale_b: torch.Tensor) -> Optional[torch.Tensor]:
    return None if p.mag is None else reference(p.mag, scale_a, scale_b)


def run_case(p: Problem, out_dtype: torch.dtype, *, per_token: bool, per_channel: bool,
             bias: bool = False, zero_points: Optional[str] = None, kernel: Optional[str] = None,
             scale_layout: int = 0, out: Optional[torch.Tensor] = None, label: str = "") -> torch.Tensor:
    """One call of gemmgen.scaled_mm (or scaled_mm_azp when `zero_points` names a mode, see
    make_zero_points) on problem p, into a NaN-poisoned `out`, checked against the reference."""
    scale_a, scale_b = make_scales(p.m, p.n, p.dtype, per_token, per_channel, scale_layout)
    azp_adj = azp = zp = None
    if zero_points is not None:
        azp_adj, azp, zp = make_zero_points(p, zero_points)
    bias_t = make_bias(p.n, out_dtype, reference(p.acc, scale_a, scale_b, zp=zp)) if bias else None
    ref = reference(p.acc, scale_a, scale_b, bias_t, zp)
    if out is None:
        out = poisoned((p.m, p.n), out_dtype)
    if zero_points is None:
        result = gemmgen.scaled_mm(p.a, p.b, scale_a, scale_b, out_dtype, bias=bias_t, out=out,
                                   kernel=kernel)
    else:
        result = gemmgen.scaled_mm_azp(p.a, p.b, scale_a, scale_b, out_dtype, azp_adj, azp=azp,
                                       bias=bias_t, out=out, kernel=kernel)
    assert result is out, "the op must return the `out` tensor it was given"
    what = (f"{label} m={p.m} n={p.n} k={p.k} {p.dtype}->{out_dtype} "
            f"scale_a={'per-token' if per_token else 'per-tensor'}{tuple(scale_a.shape)} "
            f"scale_b={'per-channel' if per_channel else 'per-tensor'}{tuple(scale_b.shape)} "
            f"bias={bias} zero_points={zero_points} kernel={kernel}")
    assert_matches(out, ref, in_dtype=p.dtype, mag=scaled_mag(p, scale_a, scale_b), label=what)
    return out


def in_dtype_params():
    return pytest.mark.parametrize("in_name", list(IN_DTYPES))


def out_dtype_params():
    return pytest.mark.parametrize("out_name", list(OUT_DTYPES))


# ------------------------------------------------------------------------- 1. every kernel

KERNEL_SHAPES = [(1, 512, 256), (37, 512, 256), (300, 512, 256)]
# Per epilogue: the argument variants one kernel must serve (bias is optional for the azp ones).
EPILOGUE_VARIANTS = {
    "ScaledEpilogue": [dict(bias=False)],
    "ScaledEpilogueBias": [dict(bias=True)],
    "ScaledEpilogueAzp": [dict(bias=False, zero_points="with_adj"),
                          dict(bias=True, zero_points="random_adj")],
    "ScaledEpilogueAzpPerToken": [dict(bias=False, zero_points="per_token"),
                                  dict(bias=True, zero_points="random_per_token")],
}
_IN_BY_SPEC = {"int8": torch.int8, "e4m3": FP8}
_OUT_BY_SPEC = {"bf16": torch.bfloat16, "fp16": torch.float16}


def test_every_built_kernel(built_kernel):
    """Each built kernel, forced by name, on small/medium M with all scale combinations."""
    spec = built_kernel.spec
    if spec.a not in _IN_BY_SPEC or spec.d not in _OUT_BY_SPEC or spec.epilogue not in EPILOGUE_VARIANTS:
        pytest.fail(f"{built_kernel.name}: this test has no reference for {spec.a} -> {spec.d} "
                    f"with {spec.epilogue}; extend it")
    in_dtype, out_dtype = _IN_BY_SPEC[spec.a], _OUT_BY_SPEC[spec.d]
    for m, n, k in KERNEL_SHAPES:
        p = make_problem(m, n, k, in_dtype)
        for layout, (per_token, per_channel) in enumerate(SCALE_MODES):
            for variant in EPILOGUE_VARIANTS[spec.epilogue]:
                run_case(p, out_dtype, per_token=per_token, per_channel=per_channel,
                         kernel=built_kernel.name, scale_layout=layout, **variant)


# ------------------------------------------------------------------------- 2. dispatch path

DISPATCH_MS = [3, 40, 100, 700, 1500]  # one M in each region of the default dispatch table


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@out_dtype_params()
@in_dtype_params()
def test_dispatch_scales_bias_dtypes(in_name, out_name, bias):
    """No kernel= : the dispatch table picks; scales per-tensor/per-token × per-tensor/per-channel."""
    for m in DISPATCH_MS:
        p = make_problem(m, 512, 256, IN_DTYPES[in_name])
        for layout, (per_token, per_channel) in enumerate(SCALE_MODES):
            run_case(p, OUT_DTYPES[out_name], per_token=per_token, per_channel=per_channel,
                     bias=bias, scale_layout=layout + m)


# ------------------------------------------------------------------------------- 3. azp

@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@out_dtype_params()
@pytest.mark.parametrize("azp_kind", ["per_tensor", "per_token"])
def test_azp_matches_asymmetric_definition(azp_kind, out_name, bias):
    """q = a represents x = s_a·(a − azp): the azp epilogue output must equal
    s_a·s_b·((a − azp)·B) + bias, with azp_adj = azp·colsum(B) (per-tensor) or colsum(B) and
    azp [M] (per-token)."""
    out_dtype = OUT_DTYPES[out_name]
    n, k = 512, 256
    for m in (3, 50, 300):
        a = rand_q((m, k), torch.int8)
        b = rand_q((n, k), torch.int8).t()
        colsum = column_sums(b)
        if azp_kind == "per_tensor":
            z = nonzero_zero_point()
            azp, azp_adj = None, (z * colsum.to(torch.int64)).to(torch.int32)
            shifted = a.to(torch.float64) - z
        else:
            azp = torch.randint(-128, 128, (m,), dtype=torch.int32, device=DEVICE)
            azp_adj = colsum
            shifted = a.to(torch.float64) - azp.to(torch.float64).reshape(-1, 1)
        acc = shifted @ b.to(torch.float64)  # the dequantized GEMM, independent of the epilogue
        for layout, (per_token, per_channel) in enumerate(SCALE_MODES):
            scale_a, scale_b = make_scales(m, n, torch.int8, per_token, per_channel, layout)
            bias_t = make_bias(n, out_dtype, reference(acc, scale_a, scale_b)) if bias else None
            ref = reference(acc, scale_a, scale_b, bias_t)
            out = poisoned((m, n), out_dtype)
            result = gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, out_dtype, azp_adj, azp=azp,
                                           bias=bias_t, out=out)
            assert result is out
            assert_matches(out, ref, in_dtype=torch.int8,
                           label=f"azp {azp_kind} m={m} bias={bias} scales={per_token, per_channel}")


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@out_dtype_params()
@pytest.mark.parametrize("zero_points", ["random_adj", "random_per_token"])
def test_azp_arbitrary_int32_adjustments(zero_points, out_name, bias):
    """The epilogue definition with arbitrary int32 azp_adj (and azp): s·(acc − zp) + bias."""
    for m in (5, 64, 200, 1100):
        p = make_problem(m, 512, 256, torch.int8)
        for layout, (per_token, per_channel) in enumerate(SCALE_MODES):
            run_case(p, OUT_DTYPES[out_name], per_token=per_token, per_channel=per_channel,
                     bias=bias, zero_points=zero_points, scale_layout=layout)


# ---------------------------------------------------------------------------- 4. shapes

@in_dtype_params()
def test_m_sweep_1_to_127(in_name):
    """Every M in 1..127 (crossing the small-M / swap-AB dispatch boundaries), one call per M;
    the bits of M pick the scale modes, bias and out dtype so every combination recurs."""
    full = make_problem(127, 256, 128, IN_DTYPES[in_name])
    for m in range(1, 128):
        run_case(full.rows(m), torch.float16 if m & 8 else torch.bfloat16,
                 per_token=bool(m & 1), per_channel=bool(m & 2), bias=bool(m & 4),
                 scale_layout=m >> 4)


LARGE_SHAPES = [(4096, 4096, 4096), (33, 8192, 128), (1, 24576, 496)]


@pytest.mark.parametrize("shape", LARGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@in_dtype_params()
def test_large_shapes(in_name, shape):
    p = make_problem(*shape, IN_DTYPES[in_name])
    for layout, (out_dtype, per_token, per_channel, bias) in enumerate([
            (torch.bfloat16, True, True, True), (torch.float16, False, False, False),
            (torch.bfloat16, False, True, False), (torch.float16, True, False, True)]):
        run_case(p, out_dtype, per_token=per_token, per_channel=per_channel, bias=bias,
                 scale_layout=layout)


# ------------------------------------------------------------------- 5. strided operands

@pytest.mark.parametrize("m", [7, 200])
@in_dtype_params()
def test_sliced_and_strided_operands(in_name, m):
    """a, b and out as slices of wider tensors (leading strides > K or N, 16-byte-aligned offsets);
    the parts of the wider output outside the slice must stay poisoned."""
    dtype = IN_DTYPES[in_name]
    n, k = 384, 256
    a_full = rand_q((m + 3, k + 48), dtype)     # row stride 304: a multiple of 16 bytes
    w_rows = rand_q((n + 64, k), dtype)
    w_cols = rand_q((n, k + 32), dtype)         # column stride of b: 288
    a_views = {"a_full[:M, :K]": a_full[:m, :k],
               "a_full[1:M+1, 16:16+K]": a_full[1:m + 1, 16:16 + k]}
    b_views = {"w_rows[:N].t()": w_rows[:n].t(),
               "w_rows[32:32+N].t()": w_rows[32:32 + n].t(),
               "w_cols[:, 16:16+K].t()": w_cols[:, 16:16 + k].t()}
    inputs_before = [t.clone() for t in (a_full, w_rows, w_cols)]
    calls = [(an, bn) for an in a_views for bn in b_views]
    for index, (a_name, b_name) in enumerate(calls):
        a, b = a_views[a_name], b_views[b_name]
        assert a.stride(0) == k + 48
        p = problem_from(a, b)
        for out_dtype in (torch.bfloat16, torch.float16):
            out_full = poisoned((m + 2, n + 64), out_dtype)  # row stride 448 elements
            rows, cols = (slice(0, m), slice(0, n)) if index % 2 == 0 else (slice(1, m + 1), slice(8, 8 + n))
            out = out_full[rows, cols]
            assert out.stride(0) == n + 64
            # azp with sliced operands too, for int8 (half the calls)
            zero_points = "per_token" if dtype == torch.int8 and index % 2 == 1 else None
            run_case(p, out_dtype, per_token=True, per_channel=True, bias=True,
                     zero_points=zero_points, out=out, scale_layout=index,
                     label=f"a={a_name} b={b_name} out=out_full[{rows.start}:, {cols.start}:]")
            outside = torch.ones(out_full.shape, dtype=torch.bool, device=DEVICE)
            outside[rows, cols] = False
            written = int((~torch.isnan(out_full[outside])).sum())
            assert written == 0, (f"a={a_name} b={b_name}: {written} elements of out_full outside "
                                  "the out slice were overwritten")
    for before, after in zip(inputs_before, (a_full, w_rows, w_cols)):
        assert torch.equal(before.view(torch.uint8), after.view(torch.uint8)), "an input was modified"


# ------------------------------------------------------------------- 6. argument errors

M_E, N_E, K_E = 8, 64, 128


def _valid_arguments() -> dict:
    a = rand_q((M_E, K_E), torch.int8)
    b = rand_q((N_E, K_E), torch.int8).t()
    scale_a, scale_b = make_scales(M_E, N_E, torch.int8, True, True)
    return dict(a=a, b=b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16,
                out=poisoned((M_E, N_E), torch.bfloat16))


def _lookup_name(epilogue: str, out_dtype=torch.bfloat16) -> str:
    op = "scaled_mm_azp" if epilogue in AZP_EPILOGUES else "scaled_mm"
    return gemmgen.dispatch.lookup(op, a_dtype=torch.int8, out_dtype=out_dtype, epilogue=epilogue,
                                   m=M_E, n=N_E, k=K_E).name


def _k_not_multiple_of_16(args):
    args["a"] = rand_q((M_E, 100), torch.int8)
    args["b"] = rand_q((N_E, 100), torch.int8).t()


def _fp8_with_azp(args):
    args["a"] = rand_q((M_E, K_E), FP8)
    args["b"] = rand_q((N_E, K_E), FP8).t()
    args["azp_adj"] = column_sums(rand_q((K_E, N_E), torch.int8))


# case id -> (argument the error must name, how to break the valid arguments)
ARGUMENT_ERRORS = {
    "b-dtype-differs-from-a": ("b", lambda g: g.update(b=rand_q((N_E, K_E), FP8).t())),
    "b-row-major": ("b", lambda g: g.update(b=rand_q((K_E, N_E), torch.int8))),
    "b-wrong-K": ("b", lambda g: g.update(b=rand_q((N_E, K_E + 16), torch.int8).t())),
    "K-not-multiple-of-16": ("a", _k_not_multiple_of_16),
    "a-int32": ("a", lambda g: g.update(a=g["a"].to(torch.int32), b=g["b"].to(torch.int32))),
    "a-on-cpu": ("a", lambda g: g.update(a=g["a"].cpu())),
    "scale_a-numel": ("scale_a", lambda g: g.update(
        scale_a=torch.rand(2, dtype=torch.float32, device=DEVICE))),
    "scale_a-dtype": ("scale_a", lambda g: g.update(scale_a=g["scale_a"].half())),
    "scale_b-numel": ("scale_b", lambda g: g.update(
        scale_b=torch.rand(N_E // 2, dtype=torch.float32, device=DEVICE))),
    "scale_b-not-contiguous": ("scale_b", lambda g: g.update(
        scale_b=torch.rand(2 * N_E, dtype=torch.float32, device=DEVICE)[::2])),
    "bias-dtype": ("bias", lambda g: g.update(
        bias=torch.randn(N_E, device=DEVICE).to(torch.float16))),
    "bias-numel": ("bias", lambda g: g.update(
        bias=torch.randn(N_E + 8, device=DEVICE).to(torch.bfloat16))),
    "out-shape": ("out", lambda g: g.update(out=poisoned((M_E, N_E + 8), torch.bfloat16))),
    "out-dtype-not-out_dtype": ("out", lambda g: g.update(out=poisoned((M_E, N_E), torch.float16))),
    "out-column-major": ("out", lambda g: g.update(out=poisoned((N_E, M_E), torch.bfloat16).t())),
    "out_dtype-float32": ("out_dtype", lambda g: g.update(out_dtype=torch.float32)),
    "kernel-unknown": ("kernel", lambda g: g.update(kernel="nope")),
    "kernel-wrong-epilogue": ("kernel", lambda g: g.update(kernel=_lookup_name("ScaledEpilogueBias"))),
    "kernel-wrong-out-dtype": ("kernel", lambda g: g.update(
        kernel=_lookup_name("ScaledEpilogue", torch.float16))),
    "azp_adj-missing": ("azp_adj", lambda g: g.update(azp_adj=None)),
    "azp_adj-dtype": ("azp_adj", lambda g: g.update(
        azp_adj=column_sums(g["b"]).to(torch.int64))),
    "azp-numel": ("azp", lambda g: g.update(
        azp_adj=column_sums(g["b"]),
        azp=torch.randint(-128, 128, (M_E + 1,), dtype=torch.int32, device=DEVICE))),
    "azp-with-fp8": ("a", _fp8_with_azp),
}


@pytest.mark.parametrize("case", list(ARGUMENT_ERRORS))
def test_argument_errors_name_the_argument(case):
    name, breaks = ARGUMENT_ERRORS[case]
    args = _valid_arguments()
    breaks(args)
    with pytest.raises(ValueError, match=f"'{name}'") as caught:
        if "azp_adj" in args:
            gemmgen.scaled_mm_azp(args["a"], args["b"], args["scale_a"], args["scale_b"],
                                  args["out_dtype"], args["azp_adj"], azp=args.get("azp"),
                                  bias=args.get("bias"), out=args["out"], kernel=args.get("kernel"))
        else:
            gemmgen.scaled_mm(args["a"], args["b"], args["scale_a"], args["scale_b"],
                              args["out_dtype"], bias=args.get("bias"), out=args["out"],
                              kernel=args.get("kernel"))
    assert not isinstance(caught.value, KernelLaunchError)
    assert bool(torch.isnan(args["out"]).all()), "nothing may be written when the arguments are refused"


def test_a_memoized_plan_still_refuses_bad_options():
    """The eager call memoizes what it derives per problem (kernel, knob codes, workspace size):
    after a valid call has memoized its plan, the same problem with a bad split_k (True, 1.0 and
    1 hash alike), an unknown kernel or arch is still refused by name, nothing written, and the
    valid call still computes the right result."""
    args = _valid_arguments()
    a, b, scale_a, scale_b, out = args["a"], args["b"], args["scale_a"], args["scale_b"], args["out"]
    p = problem_from(a, b)
    ref = reference(p.acc, scale_a, scale_b)
    name = _lookup_name("ScaledEpilogue")
    bad_options = ((dict(split_k=True), "split_k"), (dict(split_k=1.0), "split_k"),
                   (dict(split_k=2), "split_k"), (dict(arch="sm70"), "arch"), (dict(kernel="nope"), "kernel"))
    for valid in ({}, {"kernel": name}, {"split_k": 1}):
        for bad, argument in bad_options:
            out.fill_(float("nan"))
            gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, out=out, **valid)
            assert_matches(out, ref, in_dtype=torch.int8, mag=scaled_mag(p, scale_a, scale_b),
                           label=f"{valid} before {bad}")
            out.fill_(float("nan"))
            expected = "kernel" if argument == "arch" and "kernel" in valid else argument
            with pytest.raises(ValueError, match=f"argument '{expected}'"):
                gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, out=out, **{**valid, **bad})
            torch.cuda.synchronize()
            assert bool(torch.isnan(out).all()), f"{valid} with {bad}: refused, yet something was written"


# ------------------------------------------------------------------------ 7. CUDA graphs

def check_graph_replays(dtype: torch.dtype, m: int, n: int, k: int, *, kernel: Optional[str] = None,
                        warmups: int = 3, replays: int = 2, label: str = "") -> None:
    """Capture gemmgen.scaled_mm (bias, per-token and per-channel scales; `kernel` forced or
    dispatched) in a CUDA graph, then `replays` times: refill every input in place, poison the
    output, replay; the result must be that of the new inputs."""
    a = rand_q((m, k), dtype)
    w = rand_q((n, k), dtype)
    b = w.t()
    scale_a, scale_b = make_scales(m, n, dtype, True, True)
    bias = torch.randn(n, device=DEVICE).to(torch.bfloat16)
    out = poisoned((m, n), torch.bfloat16)

    def step():
        gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias=bias, out=out, kernel=kernel)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    for replay in range(replays):
        a.copy_(rand_q((m, k), dtype))
        w.copy_(rand_q((n, k), dtype))
        new_a, new_b = make_scales(m, n, dtype, True, True)
        scale_a.copy_(new_a)
        scale_b.copy_(new_b)
        p = problem_from(a, b)
        bias.copy_(make_bias(n, torch.bfloat16, reference(p.acc, scale_a, scale_b)))
        ref = reference(p.acc, scale_a, scale_b, bias)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, ref, in_dtype=dtype, mag=scaled_mag(p, scale_a, scale_b),
                       label=f"{label}graph replay {replay} m={m}")


@pytest.mark.parametrize("m", [8, 300])
@in_dtype_params()
def test_cuda_graph_capture_and_replay(in_name, m):
    """Capture gemmgen.scaled_mm in a CUDA graph, refill the inputs in place, replay: the result
    must be that of the new inputs."""
    check_graph_replays(IN_DTYPES[in_name], m, 512, 256)


@in_dtype_params()
def test_cuda_graph_of_stream_k_kernels(in_name):
    """Every built sm90 stream-K kernel of this input dtype with bf16 output and the bias epilogue
    (the shipped tables pick stream-K), forced by name and captured in a CUDA graph at a few-tile
    shape (30 output tiles of 128 x 128, far fewer than the SMs: where the tables pick stream-K):
    its workspace (partial sums, tile flags) comes from torch's allocator inside the capture and
    is initialised on the stream at each replay, so every replay on new inputs must give the new
    result. (The other outputs and epilogues of the same configs share the mainloop and the
    scheduler; `test_every_built_kernel` runs each of them eagerly.)"""
    dtype = IN_DTYPES[in_name]
    names = [kernel.name for kernel in gemmgen.list_kernels()
             if kernel.spec.family == "w8a8" and kernel.spec.arch == "sm90a"
             and kernel.config.tile_scheduler == "streamk" and IN_DTYPES.get(kernel.spec.a) == dtype
             and kernel.spec.d == "bf16" and kernel.spec.epilogue == "ScaledEpilogueBias"]
    if not names:
        pytest.skip(f"no stream-K {in_name} -> bf16 bias kernel built")
    for name in names:
        check_graph_replays(dtype, 300, 1280, 4096, kernel=name, warmups=1, replays=3, label=f"{name}: ")


# ---------------------------------------------------------------------- 8. torch.compile

@in_dtype_params()
def test_torch_compile_fullgraph(in_name):
    """torch.compile(fullgraph=True) of gemmgen.scaled_mm followed by elementwise ops (no graph
    break, same result as eager), also writing into a caller's out= and for scaled_mm_azp."""
    dtype = IN_DTYPES[in_name]
    n, k = 512, 256
    torch._dynamo.reset()

    def gemm_then_elementwise(a, b, scale_a, scale_b, bias):
        y = gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias=bias)
        return y.float() * 2.0, torch.relu(y)  # both exact, so compiled == eager bit for bit

    def gemm_into_out(a, b, scale_a, scale_b, out):
        gemmgen.scaled_mm(a, b, scale_a, scale_b, out.dtype, out=out)
        return out.float() * 2.0

    compiled = torch.compile(gemm_then_elementwise, fullgraph=True)
    for m in (5, 300):  # the second M recompiles (dynamic M): the fake kernel sees SymInts
        p = make_problem(m, n, k, dtype)
        scale_a, scale_b = make_scales(m, n, dtype, True, True)
        bias = make_bias(n, torch.bfloat16, reference(p.acc, scale_a, scale_b))
        eager = gemm_then_elementwise(p.a, p.b, scale_a, scale_b, bias)
        got = compiled(p.a, p.b, scale_a, scale_b, bias)
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
        ref = reference(p.acc, scale_a, scale_b, bias)
        assert_matches((got[0] / 2.0).to(torch.bfloat16), ref, in_dtype=dtype,
                       mag=scaled_mag(p, scale_a, scale_b), label=f"compiled m={m}")
        assert_matches(got[1], ref.clamp_min(0), in_dtype=dtype,
                       mag=scaled_mag(p, scale_a, scale_b), label=f"compiled relu m={m}")

    compiled_out = torch.compile(gemm_into_out, fullgraph=True)
    m = 40
    p = make_problem(m, n, k, dtype)
    scale_a, scale_b = make_scales(m, n, dtype, False, True)
    out = poisoned((m, n), torch.float16)
    doubled = compiled_out(p.a, p.b, scale_a, scale_b, out)
    assert_matches(out, reference(p.acc, scale_a, scale_b), in_dtype=dtype,
                   mag=scaled_mag(p, scale_a, scale_b), label="compiled out= mutation")
    torch.testing.assert_close(doubled, out.float() * 2.0, rtol=0, atol=0)

    if dtype == torch.int8:
        def azp_gemm(a, b, scale_a, scale_b, azp_adj, azp):
            return gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, torch.float16, azp_adj, azp=azp).relu()

        compiled_azp = torch.compile(azp_gemm, fullgraph=True)
        azp_adj, azp, zp = make_zero_points(p, "per_token")
        got = compiled_azp(p.a, p.b, scale_a, scale_b, azp_adj, azp)
        torch.testing.assert_close(got, azp_gemm(p.a, p.b, scale_a, scale_b, azp_adj, azp),
                                   rtol=0, atol=0)
        assert_matches(got, reference(p.acc, scale_a, scale_b, zp=zp).clamp_min(0),
                       in_dtype=dtype, label="compiled azp")


# ------------------------------------------------------------------------------ 9. opcheck

OPCHECK_CASES = ["int8-per-tensor", "int8-per-token-per-channel-bias", "int8-azp-per-token-bias",
                 "int8-azp-kernel-name", "e4m3-bias-kernel-name"]


@pytest.mark.parametrize("case", OPCHECK_CASES)
def test_opcheck_custom_op(case):
    """torch.library.opcheck of gemmgen::scaled_mm_out (schema, fake kernel, AOT dispatch), then
    the raw custom op itself against the reference."""
    dtype = FP8 if case.startswith("e4m3") else torch.int8
    m, n, k = 48, 256, 128
    p = make_problem(m, n, k, dtype)
    per_token = case != "int8-per-tensor"
    scale_a, scale_b = make_scales(m, n, dtype, per_token, per_token)
    azp_adj = azp = zp = None
    if "azp" in case:
        azp_adj, azp, zp = make_zero_points(p, "per_token")
    bias = make_bias(n, torch.bfloat16, reference(p.acc, scale_a, scale_b, zp=zp)) \
        if "bias" in case or "kernel-name" in case else None
    kernel = None
    if "kernel-name" in case:
        epilogue = "ScaledEpilogueAzpPerToken" if azp is not None else "ScaledEpilogueBias"
        op = "scaled_mm_azp" if azp is not None else "scaled_mm"
        kernel = gemmgen.dispatch.lookup(op, a_dtype=dtype, out_dtype=torch.bfloat16,
                                         epilogue=epilogue, m=m, n=n, k=k).name
    out = poisoned((m, n), torch.bfloat16)
    args = (out, p.a, p.b, scale_a, scale_b, bias, azp_adj, azp, kernel)
    custom_op = torch.ops.gemmgen.scaled_mm_out  # registered once gemmgen.families.w8a8.ops is imported
    if dtype == FP8:
        # test_schema runs the op under SchemaCheckMode, which compares every input before and
        # after with torch.allclose: not implemented for float8 tensors, so it would fail in the
        # checker, not in gemmgen. The fp8 path is still checked for fake tensors and AOT dispatch
        # (the int8 cases cover the schema check of the same op).
        torch.library.opcheck(custom_op, args, test_utils=(
            "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    else:
        torch.library.opcheck(custom_op, args)
    # opcheck works on copies: `out` is still poisoned; now call the raw op on it.
    assert bool(torch.isnan(out).all())
    assert custom_op(*args) is None
    assert_matches(out, reference(p.acc, scale_a, scale_b, bias, zp), in_dtype=dtype,
                   mag=scaled_mag(p, scale_a, scale_b), label=f"raw custom op {case}")


# ---------------------------------------------------------------------- 10. dispatch.lookup

LOOKUP_CASES = ([("int8", d, e) for d in OUT_DTYPES
                 for e in ("ScaledEpilogue", "ScaledEpilogueBias", "ScaledEpilogueAzp",
                           "ScaledEpilogueAzpPerToken")]
                + [("e4m3", d, e) for d in OUT_DTYPES for e in ("ScaledEpilogue", "ScaledEpilogueBias")])


def _is_default_manifest(kernel) -> bool:
    origin = kernel.spec.origin
    return origin is not None and Path(str(origin.file)).name == "w8a8_sm90.yaml"


@pytest.mark.parametrize("in_name,out_name,epilogue", LOOKUP_CASES,
                         ids=[f"{i}-{o}-{e}" for i, o, e in LOOKUP_CASES])
def test_dispatch_lookup_and_kernel_call(in_name, out_name, epilogue):
    in_dtype, out_dtype = IN_DTYPES[in_name], OUT_DTYPES[out_name]
    op = "scaled_mm_azp" if epilogue in AZP_EPILOGUES else "scaled_mm"
    op_kernels = {kern.name for kern in gemmgen.list_kernels(op)}
    for m in (1, 7, 16, 17, 64, 65, 128, 200, 4000):
        # the manifest's rules (a tuned table may pick differently, by measurement)
        kern = gemmgen.dispatch.lookup(op, a_dtype=in_dtype, out_dtype=out_dtype, epilogue=epilogue,
                                       m=m, n=4096, k=4096, tuned=False)
        assert (kern.spec.a, kern.spec.d, kern.spec.epilogue) == (in_name, out_name, epilogue), kern.name
        assert kern.name in op_kernels, f"{kern.name} is not listed by list_kernels({op!r})"
        text = gemmgen.dispatch.explain(op, a_dtype=in_dtype, out_dtype=out_dtype, epilogue=epilogue,
                                        m=m, n=4096, k=4096, tuned=False)
        assert kern.name in text
    default = gemmgen.dispatch.lookup(op, a_dtype=in_dtype, out_dtype=out_dtype, m=5, n=512, k=256)
    assert default.spec.epilogue == ("ScaledEpilogue" if op == "scaled_mm" else "ScaledEpilogueAzp")

    # The returned Kernel is callable like the op: without out= (a new tensor), then into out=.
    m, n, k = 5, 512, 256
    kern = gemmgen.dispatch.lookup(op, a_dtype=in_dtype, out_dtype=out_dtype, epilogue=epilogue,
                                   m=m, n=n, k=k)
    p = make_problem(m, n, k, in_dtype)
    scale_a, scale_b = make_scales(m, n, in_dtype, True, False)
    extra, zp = [], None
    if epilogue in AZP_EPILOGUES:
        azp_adj, azp, zp = make_zero_points(p, "per_token" if epilogue.endswith("PerToken") else "with_adj")
        extra = [azp_adj] if azp is None else [azp_adj, azp]
    bias = make_bias(n, out_dtype, reference(p.acc, scale_a, scale_b, zp=zp)) \
        if epilogue == "ScaledEpilogueBias" else None
    kwargs = {} if bias is None else {"bias": bias}
    ref = reference(p.acc, scale_a, scale_b, bias, zp)
    fresh = kern(p.a, p.b, scale_a, scale_b, out_dtype, *extra, **kwargs)
    assert fresh.dtype == out_dtype and tuple(fresh.shape) == (m, n) and fresh.device.type == "cuda"
    assert_matches(fresh, ref, in_dtype=in_dtype, mag=scaled_mag(p, scale_a, scale_b),
                   label=f"{kern.name}(...)")
    out = poisoned((m, n), out_dtype)
    assert kern(p.a, p.b, scale_a, scale_b, out_dtype, *extra, out=out, **kwargs) is out
    assert_matches(out, ref, in_dtype=in_dtype, mag=scaled_mag(p, scale_a, scale_b),
                   label=f"{kern.name}(..., out=)")


@pytest.mark.parametrize("in_name,out_name,epilogue", LOOKUP_CASES,
                         ids=[f"{i}-{o}-{e}" for i, o, e in LOOKUP_CASES])
def test_default_manifest_uses_swap_ab_at_small_m(in_name, out_name, epilogue):
    """The shipped sm90 manifest's rules run the swap-AB configs at m <= 16."""
    op = "scaled_mm_azp" if epilogue in AZP_EPILOGUES else "scaled_mm"
    for m in (1, 7, 16):
        kern = gemmgen.dispatch.lookup(op, a_dtype=IN_DTYPES[in_name], out_dtype=OUT_DTYPES[out_name],
                                       epilogue=epilogue, m=m, n=4096, k=4096, tuned=False)
        if not _is_default_manifest(kern):
            pytest.skip(f"dispatch at m={m} comes from {kern.spec.origin}, not the shipped w8a8_sm90.yaml")
        assert kern.config.swap_ab, f"m={m}: the default manifest uses swap-AB, got {kern.name}"


CHECKED_ROWS = 48  # rows of a tuned-table check compared with the float64 reference (plus the first and last)


def test_every_tuned_table_choice():
    """Every distinct (kernel, knobs) the GPU's own tuned table picks (stream-K kernels and the
    raster / swizzle settings only the tune chose among them), run through dispatch at the bottom
    of its bucket (the smallest M it serves) on the smallest listed shape that picks it, in the
    class the table measured (int8 and e4m3 with bias, bf16 out; per-token and per-channel
    scales): dispatch must say the table chose, every output element must be written (NaN
    poison), and the first, the last and CHECKED_ROWS random rows must match the float64
    reference (all rows would cost a float64 GEMM of up to 8193 x 8192 x 57344)."""
    from gemmgen import dispatch
    from gemmgen.bindings.library import libraries
    library = next((lib for lib in libraries() if lib.name == "w8a8"), None)
    gpu = dispatch.gpu_identity()
    table = library.table_for(gpu)[0] if library is not None else None
    if table is None or tuple(table.gpu) != tuple(gpu) or (table.fit is not None and table.fit.dropped):
        pytest.skip("no w8a8 library with this GPU's own tuned table whose buckets all fit its kernels")
    ran = 0
    for key, ctable in sorted(table.classes.items()):
        op, a_name, d_name, epilogue = key
        in_dtype, out_dtype = IN_DTYPES[a_name], OUT_DTYPES[d_name]
        seen = set()
        for shape in sorted(ctable.shapes, key=lambda s: s.n * s.k):
            m_low = 1
            for bucket in shape.buckets:
                m, m_low = m_low, bucket.m_max + 1
                pick = (bucket.kernel, bucket.knobs)
                if pick in seen or bucket.dropped:
                    continue
                seen.add(pick)
                n, k = shape.n, shape.k
                choice = dispatch.choose(op, a_dtype=in_dtype, out_dtype=out_dtype, epilogue=epilogue,
                                         m=m, n=n, k=k)
                assert choice.source == "table" and choice.kernel.name == bucket.kernel, choice.reason
                assert choice.knobs == bucket.knobs, choice.reason
                a, w = rand_q((m, k), in_dtype), rand_q((n, k), in_dtype)
                scale_a, scale_b = make_scales(m, n, in_dtype, True, True)
                rows = torch.cat([torch.tensor([0, m - 1], device=DEVICE),
                                  torch.randint(0, m, (CHECKED_ROWS,), device=DEVICE)]).unique()
                p = problem_from(a[rows], w.t())
                scale_rows = scale_a.reshape(-1)[rows]
                bias = make_bias(n, out_dtype, reference(p.acc, scale_rows, scale_b))
                out = poisoned((m, n), out_dtype)
                gemmgen.scaled_mm(a, w.t(), scale_a, scale_b, out_dtype, bias=bias, out=out)
                label = f"{bucket.kernel} {bucket.knobs} m={m} n={n} k={k} (bucket to {bucket.m_max})"
                written = ~torch.isnan(out)
                assert bool(written.all()), f"{label}: {int((~written).sum())} elements never written"
                assert_matches(out[rows], reference(p.acc, scale_rows, scale_b, bias), in_dtype=in_dtype,
                               mag=scaled_mag(p, scale_rows, scale_b), label=label)
                ran += 1
                del a, w, out, p
    assert ran > 0


def test_lookup_refuses_unbuilt_combinations():
    # fp8 with an azp epilogue: no manifest builds it
    with pytest.raises(NoKernelError, match=r"computes scaled_mm e4m3->bf16 with ScaledEpilogueAzp"):
        gemmgen.dispatch.lookup("scaled_mm_azp", a_dtype=FP8, out_dtype=torch.bfloat16,
                                epilogue="ScaledEpilogueAzp", m=8, n=512, k=256)
    with pytest.raises(ValueError, match=r"epilogue 'ScaledEpilogueAzp' does not belong to op "
                                         r"'scaled_mm'"):
        gemmgen.dispatch.lookup("scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16,
                                epilogue="ScaledEpilogueAzp", m=8, n=512, k=256)


# --------------------------------------------------------------- 11. back-to-back calls

def test_back_to_back_calls_with_different_m():
    """Many calls in a row on one stream (no synchronization between them), with M jumping across
    dispatch regions and dtypes on the same input buffers: each result must be right, and the
    first call repeated at the end must give the same bits."""
    n, k = 512, 256
    plan = [300, 1, 64, 17, 1024, 5, 128, 2000, 3, 65, 16, 900]
    problems = {dtype: make_problem(max(plan), n, k, dtype) for dtype in (torch.int8, FP8)}
    calls = []
    for i, m in enumerate(plan):
        dtype = torch.int8 if i % 2 == 0 else FP8
        p = problems[dtype].rows(m)
        out_dtype = torch.bfloat16 if i % 3 else torch.float16
        scale_a, scale_b = make_scales(m, n, dtype, i % 4 < 2, i % 3 != 1, layout=i)
        bias = make_bias(n, out_dtype, reference(p.acc, scale_a, scale_b)) if i % 2 else None
        calls.append((p, out_dtype, scale_a, scale_b, bias, poisoned((m, n), out_dtype)))
    torch.cuda.synchronize()

    for p, out_dtype, scale_a, scale_b, bias, out in calls:  # launched back to back
        gemmgen.scaled_mm(p.a, p.b, scale_a, scale_b, out_dtype, bias=bias, out=out)
    p, out_dtype, scale_a, scale_b, bias, first = calls[0]
    again = gemmgen.scaled_mm(p.a, p.b, scale_a, scale_b, out_dtype, bias=bias)
    torch.cuda.synchronize()

    for index, (p, out_dtype, scale_a, scale_b, bias, out) in enumerate(calls):
        assert_matches(out, reference(p.acc, scale_a, scale_b, bias), in_dtype=p.dtype,
                       mag=scaled_mag(p, scale_a, scale_b), label=f"call {index} (m={p.m})")
    assert torch.equal(again, first), "the same call gave different bits after other calls"


# ------------------------------------------------- extra: size-1 dimension with stride 1

_SIZE1_STRIDE_SCRIPT = r"""
import json, sys, torch, gemmgen
which, k, n = sys.argv[1], 256, 512
a = torch.randint(-128, 128, (1, k), dtype=torch.int8, device="cuda")
w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
out = torch.full((1, n), float("nan"), dtype=torch.bfloat16, device="cuda")
if which == "a":
    a = a.reshape(k, 1).t()          # [1, K], strides (1, 1): torch calls it contiguous
else:
    out = torch.full((n, 1), float("nan"), dtype=torch.bfloat16, device="cuda").t()
scale_a = torch.full((1,), 0.01, device="cuda")
scale_b = torch.full((1,), 0.002, device="cuda")
try:
    gemmgen.scaled_mm(a, w.t(), scale_a, scale_b, torch.bfloat16, out=out)
    torch.cuda.synchronize()
except ValueError as exc:
    print(json.dumps({"status": "valueerror", "detail": str(exc)}))
    sys.exit(0)
except Exception as exc:
    print(json.dumps({"status": "error", "detail": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
ref = (a.double() @ w.double().t()) * scale_a.double() * scale_b.double()
err = float(((out.double() - ref).abs() - 5e-3 * ref.abs() - 1e-5 * ref.abs().max()).max())
ok = not bool(torch.isnan(out).any()) and err <= 0
print(json.dumps({"status": "ok" if ok else "wrong",
                  "detail": f"strides a={a.stride()} out={out.stride()} max excess error {err}"}))
"""


@pytest.mark.parametrize("which", ["a", "out"])
def test_single_row_operand_with_size1_dim_stride(which):
    """M = 1 with a [1, K] `a` (or [1, N] `out`) whose row stride is 1, as `x.reshape(K, 1).t()`
    gives (torch treats it as contiguous, so `.contiguous()` keeps it). gemmgen skips the row
    stride checks for M = 1 but passes the stride on to TMA, which needs 16-byte strides: the call
    must either be right or raise ValueError. Run in a subprocess, so a kernel fault cannot poison
    this process's CUDA context."""
    env = dict(os.environ)
    package_root = str(Path(gemmgen.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", _SIZE1_STRIDE_SCRIPT, which], capture_output=True,
                          text=True, timeout=300, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    tail = (proc.stderr or "")[-2000:]
    assert proc.returncode == 0 and lines, f"subprocess exited {proc.returncode}; stderr:\n{tail}"
    verdict = json.loads(lines[-1])
    assert verdict["status"] in ("ok", "valueerror"), f"{verdict}; stderr:\n{tail}"
