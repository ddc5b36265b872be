"""GPU tests of non-finite values at the edges of the ops: NaN / ±inf in scales, bias and zero
points, for every built W8A8 kernel (`gemmgen.scaled_mm`, `gemmgen.scaled_mm_azp`) and every
built mixed-input kernel (`gemmgen.mixed_mm`).

The definition (README, "Python API"): non-finite values propagate as the math says. The ops do
not check the values of scales, bias or zero points (that would read them back to the host), and
a non-finite one must neither be clamped away nor spread beyond the elements whose formula holds
it:

  W8A8     D[m, n] = s_a[m] · s_b[n] · (acc[m, n] − zp[m, n]) + bias[n]
           a NaN / inf in scale_a[m] reaches row m only; in scale_b[n] or bias[n] column n only;
           a per-tensor (single-value) scale reaches every element.
  mixed    D[m, n] = Σ_k a[m, k] · (stored[n, k] · s[g, n] + zp[g, n]) + bias[n],  g = k // group
           a NaN / inf in a group scale s[g, n], a zero point zp[g, n] or bias[n] reaches column
           n only.

Non-finite elements are exactly those whose formula holds a non-finite input: an infinity is never
multiplied back to a finite value, and an infinity times an exact 0 (an inf scale on an
accumulator that is exactly 0, or on a stored weight that is 0) is NaN, as IEEE says.

Each case:
  1. runs the op on fresh random data with finite scales into an output poisoned with NaN:
     `clean`, which must be all finite (the op writes every element);
  2. puts NaN / ±inf into copies of those scales / zero points / bias and runs it again into an
     output pre-filled with a finite sentinel: `got`;
  3. checks, against the float64 reference of the same non-finite inputs
     (`gemmgen.reference.scaled_mm`; for mixed, an element-wise float64 version of
     `gemmgen.reference.mixed_mm` that applies the packed `stored · s + zp` directly, since
     `reference.mixed_mm` recovers integer zero points from zp and cannot take non-finite ones):
     - the non-finite elements of `got` and of the reference are exactly the affected rows /
       columns;
     - `got` is NaN wherever the formula holds a NaN, and equals the reference's NaN / ±inf class
       wherever that class does not depend on rounding (everywhere for int8, whose accumulation is
       exact; for fp8 where |A·B| is far from 0 relative to the accumulation error; for mixed
       where the reference is ±inf, i.e. a bias infinity on finite products);
     - every finite element of `got` equals `clean` bit for bit (the poison touches nothing else);
  4. the call returns and `torch.cuda.synchronize()` succeeds (no fault, no hang: conftest's
     autouse fixture synchronizes after every test).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest
import torch

import gemmgen
from gemmgen import reference
from gemmgen.families.mixed.configs import WEIGHT_TYPES_FOR_KERNEL
from gemmgen.families.mixed.packing import Sm90Layout, q_range
from gemmgen.families.w8a8.configs import AZP_EPILOGUES

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
FP8 = torch.float8_e4m3fn
NAN, INF = float("nan"), float("inf")
SENTINEL = 4096.0  # finite, exact in bf16 / fp16, far from any real output here

W8A8_IN = {"int8": torch.int8, "e4m3": FP8}
W8A8_OUT = {"bf16": torch.bfloat16, "fp16": torch.float16}
W8A8_EPILOGUES = ("ScaledEpilogue", "ScaledEpilogueBias", "ScaledEpilogueAzp",
                  "ScaledEpilogueAzpPerToken")
# Scales as the other W8A8 tests draw them (low, width): |D| stays far inside fp16's range.
SCALE_RANGE = {torch.int8: (0.001, 0.01), FP8: (0.05, 0.5)}
# fp8 accumulates with fast accumulation: its sum is off by up to ~5e-3 · |A|·|B| (see
# test_scaled_mm_gpu.py); where |A·B| exceeds 10× that, an inf scale's sign is certain.
FP8_SIGN_MARGIN = 5e-2

MIXED_ACT = {"bf16": torch.bfloat16, "fp16": torch.float16}
MIXED_WEIGHT_TYPES = WEIGHT_TYPES_FOR_KERNEL

# Shapes every kernel takes (those of the other GPU tests): K a multiple of 16 (W8A8) / 64
# (mixed), N of 8; M = 1 (swap-AB / decode tiles) and 65 (one past a tile multiple).
W8A8_N, W8A8_K = 512, 256
MIXED_N, MIXED_K, MIXED_GROUP = 256, 512, 128
MS = (1, 65)


# ------------------------------------------------------------------------------------ helpers

def _poisoned(shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, NAN, dtype=dtype, device=DEVICE)


def _sentinel(shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, SENTINEL, dtype=dtype, device=DEVICE)


def _where(mask: torch.Tensor) -> str:
    idx = mask.nonzero()
    shown = ", ".join(str(tuple(i)) for i in idx[:5].tolist())
    return f"{int(mask.sum())} element(s), first at {shown}"


def _assert_clean(clean: torch.Tensor, label: str) -> None:
    bad = ~torch.isfinite(clean)
    assert not bool(bad.any()), (f"{label}: with finite inputs the output has non-finite or "
                                 f"unwritten (NaN poison) elements: {_where(bad)}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def assert_propagates(got: torch.Tensor, clean: Optional[torch.Tensor], ref: torch.Tensor, *,
                      affected: torch.Tensor, nan_inputs: torch.Tensor,
                      class_certain: torch.Tensor, label: str) -> None:
    """The checks of the module docstring.

    got / clean: the op's outputs with / without the poison; ref: float64 reference with it.
    affected: elements whose formula holds a non-finite input; nan_inputs: those holding a NaN;
    class_certain: where got's NaN / +inf / -inf class must equal ref's.
    """
    assert tuple(got.shape) == tuple(ref.shape), \
        f"{label}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    g = got.to(torch.float64)
    ref_bad = ~torch.isfinite(ref)
    # The test's own premise: the reference is non-finite exactly on the affected elements.
    assert torch.equal(ref_bad, affected), (
        f"{label}: test premise broken: the reference's non-finite elements are not the affected "
        f"ones (extra: {_where(ref_bad & ~affected)}; missing: {_where(affected & ~ref_bad)})")
    assert bool(torch.isnan(ref)[nan_inputs].all()), f"{label}: test premise broken: ref not NaN"

    got_bad = ~torch.isfinite(g)
    if not torch.equal(got_bad, affected):
        spread = got_bad & ~affected
        lost = affected & ~got_bad
        msg = [f"{label}: non-finite elements differ from the rows/columns the poison reaches"]
        if spread.any():
            i, j = spread.nonzero()[0].tolist()
            msg.append(f"non-finite outside them (spread, or an unwritten sentinel cannot be it): "
                       f"{_where(spread)}; got[{i}, {j}] = {float(g[i, j])!r}")
        if lost.any():
            i, j = lost.nonzero()[0].tolist()
            msg.append(f"finite where the math is not (clamped, or never written): {_where(lost)}; "
                       f"got[{i}, {j}] = {float(g[i, j])!r}, ref = {float(ref[i, j])!r}")
        raise AssertionError("; ".join(msg))

    not_nan = nan_inputs & ~torch.isnan(g)
    assert not bool(not_nan.any()), f"{label}: a NaN input did not give NaN: {_where(not_nan)}"

    check = class_certain & affected
    nan_differs = check & (torch.isnan(g) != torch.isnan(ref))
    inf_differs = check & torch.isinf(ref) & (g != ref)
    wrong = nan_differs | inf_differs
    if wrong.any():
        i, j = wrong.nonzero()[0].tolist()
        raise AssertionError(f"{label}: NaN / ±inf class differs from the reference: "
                             f"{_where(wrong)}; got[{i}, {j}] = {float(g[i, j])!r}, "
                             f"ref = {float(ref[i, j])!r}")

    if clean is not None:
        finite = ~affected
        changed = finite & (_bits(got) != _bits(clean))
        if changed.any():
            i, j = changed.nonzero()[0].tolist()
            raise AssertionError(f"{label}: the poison changed unaffected elements (or they were "
                                 f"not written): {_where(changed)}; got[{i}, {j}] = "
                                 f"{float(got[i, j])!r}, clean = {float(clean[i, j])!r}")


def _masks(m: int, n: int, rows=(), cols=(), nan_rows=(), nan_cols=()):
    affected = torch.zeros(m, n, dtype=torch.bool, device=DEVICE)
    nan_inputs = torch.zeros_like(affected)
    for r in rows:
        affected[r, :] = True
    for c in cols:
        affected[:, c] = True
    for r in nan_rows:
        nan_inputs[r, :] = True
    for c in nan_cols:
        nan_inputs[:, c] = True
    return affected, nan_inputs


# ------------------------------------------------------------------------------------- W8A8

@dataclasses.dataclass
class W8A8Case:
    """One kernel's operands (finite) and how to call it."""

    kernel: object
    in_dtype: torch.dtype
    out_dtype: torch.dtype
    a: torch.Tensor                   # [M, K] row-major
    b: torch.Tensor                   # [K, N] column-major (w.t())
    azp_adj: Optional[torch.Tensor]
    azp: Optional[torch.Tensor]

    @property
    def m(self) -> int:
        return self.a.shape[0]

    @property
    def n(self) -> int:
        return self.b.shape[1]

    @property
    def epilogue(self) -> str:
        return self.kernel.spec.epilogue

    @property
    def takes_bias(self) -> bool:
        """Bias is required by ScaledEpilogueBias, optional for the azp epilogues (given here)."""
        return self.epilogue != "ScaledEpilogue"

    def call(self, scale_a, scale_b, bias, out, split_k):
        if self.epilogue in AZP_EPILOGUES:
            result = gemmgen.scaled_mm_azp(self.a, self.b, scale_a, scale_b, self.out_dtype,
                                           self.azp_adj, azp=self.azp, bias=bias, out=out,
                                           kernel=self.kernel.name, split_k=split_k)
        else:
            result = gemmgen.scaled_mm(self.a, self.b, scale_a, scale_b, self.out_dtype,
                                       bias=bias, out=out, kernel=self.kernel.name,
                                       split_k=split_k)
        assert result is out
        torch.cuda.synchronize()  # a fault is reported here, by the call that caused it
        return out

    def reference(self, scale_a, scale_b, bias) -> torch.Tensor:
        return reference.scaled_mm(self.a, self.b, scale_a, scale_b, self.out_dtype, bias=bias,
                                   azp_adj=self.azp_adj, azp=self.azp)

    def class_certain(self) -> torch.Tensor:
        """Where the NaN / ±inf class of an inf-scaled element does not depend on rounding."""
        if self.in_dtype == torch.int8:   # int32 accumulation: exact, and so is its sign
            return torch.ones(self.m, self.n, dtype=torch.bool, device=DEVICE)
        a64, b64 = self.a.to(torch.float64), self.b.to(torch.float64)
        acc, mag = a64 @ b64, a64.abs() @ b64.abs()
        # mag == 0: every product is 0, so the kernel's sum is an exact 0 too (inf · 0 = NaN)
        return (acc.abs() > FP8_SIGN_MARGIN * mag) | (mag == 0)

    def split_k_values(self) -> tuple[Optional[int], ...]:
        """The config's own slices (None) and, for a split-K kernel, also the unsplit path (1)."""
        return (None, 1) if getattr(self.kernel.spec, "split_k", False) else (None,)


def _w8a8_case(kernel, m: int, zero_rows=()) -> W8A8Case:
    spec = kernel.spec
    if spec.a not in W8A8_IN or spec.d not in W8A8_OUT or spec.epilogue not in W8A8_EPILOGUES:
        pytest.skip(f"{kernel.name}: no inputs for {spec.a} -> {spec.d} with {spec.epilogue} "
                    "in this test")
    in_dtype, out_dtype = W8A8_IN[spec.a], W8A8_OUT[spec.d]
    if spec.epilogue in AZP_EPILOGUES and in_dtype != torch.int8:
        pytest.skip(f"{kernel.name}: the azp epilogues take int8 activations only")
    k, n = W8A8_K, W8A8_N
    if in_dtype == torch.int8:
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=DEVICE)
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEVICE)
        for r in zero_rows:
            a[r] = 0
    else:
        x = torch.randn(m, k, device=DEVICE)
        for r in zero_rows:
            x[r] = 0.0
        a = x.to(FP8)
        w = torch.randn(n, k, device=DEVICE).to(FP8)
    b = w.t()
    azp_adj = azp = None
    if spec.epilogue == "ScaledEpilogueAzp":       # per-tensor zero point z: azp_adj = z·colsum(B)
        z = int(torch.randint(1, 128, ()).item())
        azp_adj = (z * b.to(torch.int64).sum(dim=0)).to(torch.int32)
    elif spec.epilogue == "ScaledEpilogueAzpPerToken":
        azp_adj = b.to(torch.int64).sum(dim=0).to(torch.int32)
        azp = torch.randint(-128, 128, (m,), dtype=torch.int32, device=DEVICE)
    return W8A8Case(kernel, in_dtype, out_dtype, a, b, azp_adj, azp)


def _scales(case: W8A8Case, per_token: bool, per_channel: bool):
    low, width = SCALE_RANGE[case.in_dtype]

    def draw(shape):
        return torch.rand(shape, dtype=torch.float32, device=DEVICE) * width + low

    return draw((case.m, 1) if per_token else (1, 1)), draw((1, case.n) if per_channel else (1, 1))


def _bias(case: W8A8Case, scale_a, scale_b) -> Optional[torch.Tensor]:
    if not case.takes_bias:
        return None
    rms = float(case.reference(scale_a, scale_b, None).pow(2).mean().sqrt())
    return (torch.randn(case.n, dtype=torch.float64, device=DEVICE) * rms).to(case.out_dtype)


@pytest.mark.parametrize("m", MS)
def test_scaled_mm_nonfinite_vector_scales_and_bias(built_kernel, m):
    """Per-token scale_a [M, 1] with NaN in row 3, +inf in row M−1 and +inf in row 40 whose
    activations are all 0 (inf · 0 = NaN); per-channel scale_b [1, N] with NaN in column 5 and
    +inf in column N−1; bias (where the epilogue has one) NaN in column 130, −inf in column 300.
    Rows are poisoned only when M > 1 (with M = 1 a row is the whole output)."""
    nan_row, inf_row, zero_row = (3, m - 1, 40) if m > 1 else (None, None, None)
    case = _w8a8_case(built_kernel, m, zero_rows=() if zero_row is None else (zero_row,))
    n = case.n
    nan_col, inf_col, bias_nan_col, bias_inf_col = 5, n - 1, 130, 300

    scale_a, scale_b = _scales(case, per_token=True, per_channel=True)
    bias = _bias(case, scale_a, scale_b)
    bad_a, bad_b = scale_a.clone(), scale_b.clone()
    bad_b[0, nan_col], bad_b[0, inf_col] = NAN, INF
    rows, nan_rows = [], []
    if m > 1:
        bad_a[nan_row, 0], bad_a[inf_row, 0], bad_a[zero_row, 0] = NAN, INF, INF
        rows, nan_rows = [nan_row, inf_row, zero_row], [nan_row]
        if case.epilogue not in AZP_EPILOGUES:
            nan_rows.append(zero_row)   # s_a = inf on acc == 0 exactly: NaN (azp: acc − zp ≠ 0)
    cols, nan_cols = [nan_col, inf_col], [nan_col]
    bad_bias = None
    if bias is not None:
        bad_bias = bias.clone()
        bad_bias[bias_nan_col], bad_bias[bias_inf_col] = NAN, -INF
        cols += [bias_nan_col, bias_inf_col]
        nan_cols.append(bias_nan_col)
    affected, nan_inputs = _masks(m, n, rows, cols, nan_rows, nan_cols)
    ref = case.reference(bad_a, bad_b, bad_bias)
    certain = case.class_certain()

    for split_k in case.split_k_values():
        label = (f"{built_kernel.name} m={m} n={n} k={W8A8_K} split_k={split_k} "
                 f"bias={bias is not None}")
        clean = case.call(scale_a, scale_b, bias, _poisoned((m, n), case.out_dtype), split_k)
        _assert_clean(clean, label)
        got = case.call(bad_a, bad_b, bad_bias, _sentinel((m, n), case.out_dtype), split_k)
        assert_propagates(got, clean, ref, affected=affected, nan_inputs=nan_inputs,
                          class_certain=certain, label=label)
        if m > 1 and case.epilogue not in AZP_EPILOGUES:  # the definition, spelled out
            assert bool(torch.isnan(got[zero_row]).all()), \
                f"{label}: an inf scale on an all-zero row must give NaN (inf · 0)"


@pytest.mark.parametrize("m", MS)
def test_scaled_mm_nonfinite_per_tensor_scales(built_kernel, m):
    """A single-value (per-tensor) scale reaches every element: scale_a = [NaN] makes the whole
    output NaN; scale_b = [+inf] makes it all ±inf / NaN as the reference says (row 0's
    activations are 0 when M > 1: NaN there)."""
    zero_rows = (0,) if m > 1 else ()
    case = _w8a8_case(built_kernel, m, zero_rows=zero_rows)
    n = case.n
    scale_a, scale_b = _scales(case, per_token=True, per_channel=True)
    bias = _bias(case, scale_a, scale_b)
    everything = torch.ones(m, n, dtype=torch.bool, device=DEVICE)
    nothing = torch.zeros_like(everything)
    certain = case.class_certain()
    nan_a = torch.full((1,), NAN, dtype=torch.float32, device=DEVICE)
    inf_b = torch.full((1, 1), INF, dtype=torch.float32, device=DEVICE)
    for split_k in case.split_k_values():
        label = f"{built_kernel.name} m={m} split_k={split_k}"
        got = case.call(nan_a, scale_b, bias, _sentinel((m, n), case.out_dtype), split_k)
        assert_propagates(got, None, case.reference(nan_a, scale_b, bias), affected=everything,
                          nan_inputs=everything, class_certain=certain,
                          label=f"{label} scale_a=[NaN]")
        got = case.call(scale_a, inf_b, bias, _sentinel((m, n), case.out_dtype), split_k)
        zero_row_nan = nothing.clone()
        if zero_rows and case.epilogue not in AZP_EPILOGUES:
            zero_row_nan[0] = True
        assert_propagates(got, None, case.reference(scale_a, inf_b, bias), affected=everything,
                          nan_inputs=zero_row_nan, class_certain=certain,
                          label=f"{label} scale_b=[+inf]")


# ------------------------------------------------------------------------------------ mixed

def _mixed_reference(a: torch.Tensor, stored: torch.Tensor, packed,
                     bias: Optional[torch.Tensor]) -> torch.Tensor:
    """float64 [M, N]: Σ_k a[m, k] · (stored[n, k] · s[g, n] (+ zp[g, n])) (+ bias[n]), with the
    products summed element-wise (IEEE: inf · 0 = NaN, inf − inf = NaN, whatever a BLAS does)."""
    group = packed.group_size
    s = packed.scales.to(torch.float64).repeat_interleave(group, dim=0)       # [K, N]
    w = stored.t().to(torch.float64) * s
    if packed.zeros is not None:
        w = w + packed.zeros.to(torch.float64).repeat_interleave(group, dim=0)
    out = (a.to(torch.float64).unsqueeze(2) * w.unsqueeze(0)).sum(dim=1)
    if bias is not None:
        out = out + bias.to(torch.float64).reshape(1, -1)
    return out


@pytest.mark.parametrize("m", MS)
def test_mixed_mm_nonfinite_scales_zeros_and_bias(built_mixed_kernel, m):
    """Group scales [G, N]: NaN at [0, 5], +inf at [G−1, N−1]; zero points (uint4 kernels):
    NaN at [G−1, 9], −inf at [0, 200]; bias: NaN at 130, −inf at 250. Group 128 and
    per-channel (group 32 for the `_g32` kernels), without and with bias, every weight type the
    kernel serves."""
    spec = built_mixed_kernel.spec
    key = (getattr(spec, "w", None), getattr(spec, "scheme", None))
    if spec.a not in MIXED_ACT or key not in MIXED_WEIGHT_TYPES:
        pytest.skip(f"{built_mixed_kernel.name}: no inputs for {spec.a} x {key} in this test")
    dtype = MIXED_ACT[spec.a]
    n, k = MIXED_N, MIXED_K
    for weight_type in MIXED_WEIGHT_TYPES[key]:
        for group in ((32,) if spec.group_k == 32 else (MIXED_GROUP, k)):
            groups = k // group
            low, high = q_range(weight_type)
            q = torch.randint(low, high + 1, (n, k), dtype=torch.int32, device=DEVICE)
            scales = (torch.rand(n, groups, device=DEVICE) * 0.02 + 0.005).to(dtype)
            zeros = (torch.randint(0, 16, (n, groups), dtype=torch.int32, device=DEVICE)
                     if weight_type == "uint4" else None)
            packed = gemmgen.pack_weights(q, scales, zeros, weight_type=weight_type,
                                          group_size=group, arch="sm90a")
            stored = q - Sm90Layout.offset(weight_type)  # what the kernel converts and scales

            # pack_weights refuses non-finite scales: poison the packed tensors themselves.
            bad_scales = packed.scales.clone()
            bad_scales[0, 5], bad_scales[groups - 1, n - 1] = NAN, INF
            cols, nan_cols = [5, n - 1], [5]
            bad_zeros = None
            if packed.zeros is not None:
                bad_zeros = packed.zeros.clone()
                bad_zeros[groups - 1, 9], bad_zeros[0, 200] = NAN, -INF
                cols += [9, 200]
                nan_cols.append(9)
            bad = dataclasses.replace(packed, scales=bad_scales, zeros=bad_zeros)

            a = torch.randn(m, k, device=DEVICE).to(dtype)
            for with_bias in (False, True):
                bias = bad_bias = None
                case_cols, case_nan_cols = list(cols), list(nan_cols)
                if with_bias:
                    bias = torch.randn(n, device=DEVICE).to(dtype)
                    bad_bias = bias.clone()
                    bad_bias[130], bad_bias[250] = NAN, -INF
                    case_cols += [130, 250]
                    case_nan_cols.append(130)
                label = (f"{built_mixed_kernel.name} {weight_type} m={m} n={n} k={k} "
                         f"group={group} bias={with_bias}")
                clean = _poisoned((m, n), dtype)
                assert gemmgen.mixed_mm(a, packed, bias, out=clean,
                                        kernel=built_mixed_kernel.name) is clean
                torch.cuda.synchronize()
                _assert_clean(clean, label)
                got = _sentinel((m, n), dtype)
                assert gemmgen.mixed_mm(a, bad, bad_bias, out=got,
                                        kernel=built_mixed_kernel.name) is got
                torch.cuda.synchronize()
                ref = _mixed_reference(a, stored, bad, bad_bias)
                affected, nan_inputs = _masks(m, n, cols=case_cols, nan_cols=case_nan_cols)
                # The class is certain where the reference is ±inf (a bias infinity on finite
                # products, added in the fp32 epilogue); a NaN from inf − inf or inf · 0 inside
                # the tensor-core sum is only required to be non-finite.
                assert_propagates(got, clean, ref, affected=affected, nan_inputs=nan_inputs,
                                  class_certain=torch.isinf(ref), label=label)
