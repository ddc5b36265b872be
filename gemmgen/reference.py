"""The plain torch definitions of gemmgen's ops that the GPU tests compare against: CPU or GPU,
no gemmgen kernels, high precision (float64 accumulation), as little code as the math needs.

- `mixed_mm(a, packed, bias=None)`: the mixed-input GEMM, a @ dequant(w) (+ bias), float32 result
  (dequant(w) in input-feature order: an act-order weight's groups are its g_idx).
- `scaled_mm(a, b, scale_a, scale_b, out_dtype, bias=None, azp_adj=None, azp=None)`: the W8A8
  scaled GEMM with its four epilogues (README's epilogue table), float64 result.
- `grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list, ...)`: the MoE
  grouped GEMM + dequant + SwiGLU + per-token quant (family gemmgen/families/moe; A8W8 and A8W4);
  `grouped_matmul_dequant` (its GEMM + dequant step alone) and `swiglu_quant_reference` (its
  SwiGLU + quant steps alone, for an unfused path).

Neither mixed_mm nor scaled_mm rounds to the op's output dtype: a test compares the kernel's
output (converted up) with the reference under a tolerance that accounts for that rounding. The
MoE op's output is quantized, so its reference defines every rounding (see there).
"""

from __future__ import annotations

from typing import Optional

import torch

from .errors import describe_argument
from .families.mixed.packing import PackedWeight, dequantize
from .families.moe.grouping import _group_offsets, _stack_weights


def _fail(op: str, argument: str, expected: str, got) -> ValueError:
    shown = (f"{got.dtype} tensor of shape {tuple(got.shape)}" if isinstance(got, torch.Tensor)
             else repr(got))
    return ValueError(f"gemmgen.reference.{op}: argument '{argument}': expected {expected}; "
                      f"got {shown}")


def mixed_mm(a: torch.Tensor, packed: PackedWeight,
             bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out[M, N] = a[M, K] @ dequantize(packed)[K, N] (+ bias[N]), as float32 on a's device.

    The dequantized weight is exact (see packing.dequantize); the product is accumulated in
    float64 (not float32: immune to TF32 settings and to summation order) and returned as float32,
    the dtype tests compare in. The op itself returns a's dtype; round with `.to(a.dtype)` to get
    the correctly rounded output.
    """
    if not isinstance(packed, PackedWeight):
        raise _fail("mixed_mm", "packed", "a PackedWeight", describe_argument(packed))
    if not isinstance(a, torch.Tensor) or a.dim() != 2 or a.shape[1] != packed.k:
        raise _fail("mixed_mm", "a", f"a 2-D tensor [M, K={packed.k}]", a)
    w = dequantize(packed).to(device=a.device, dtype=torch.float64)
    out = a.to(torch.float64) @ w
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.numel() != packed.n:
            raise _fail("mixed_mm", "bias", f"None or a tensor of N={packed.n} elements", bias)
        out = out + bias.to(device=a.device, dtype=torch.float64).reshape(1, -1)
    return out.to(torch.float32)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, bias: Optional[torch.Tensor] = None,
              azp_adj: Optional[torch.Tensor] = None, azp: Optional[torch.Tensor] = None
              ) -> torch.Tensor:
    """The W8A8 scaled GEMM in float64 [M, N] (the arguments of gemmgen.scaled_mm[_azp], by
    keyword past out_dtype: here bias comes before azp_adj and azp, as it does in scaled_mm):

        acc = A·B                                        a [M, K], b [K, N] (int8 or fp8)
        ScaledEpilogue / Bias:     D = s_a · s_b · acc (+ bias)
        ScaledEpilogueAzp:         D = s_a · s_b · (acc − azp_adj[n]) (+ bias)
        ScaledEpilogueAzpPerToken: D = s_a · s_b · (acc − azp[m] · azp_adj[n]) (+ bias)

    scale_a: 1 or M values, scale_b: 1 or N values (any shape). `out_dtype` (bfloat16 or float16)
    is accepted so that the call mirrors the op's; the result stays float64 (unrounded).
    """
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise _fail("scaled_mm", "out_dtype", "torch.bfloat16 or torch.float16", out_dtype)
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise _fail("scaled_mm", name, "a 2-D tensor", t)
    m, k = a.shape
    if b.shape[0] != k:
        raise _fail("scaled_mm", "b", f"shape [K={k}, N]", b)
    n = b.shape[1]
    if scale_a.numel() not in (1, m):
        raise _fail("scaled_mm", "scale_a", f"1 or M={m} values", scale_a)
    if scale_b.numel() not in (1, n):
        raise _fail("scaled_mm", "scale_b", f"1 or N={n} values", scale_b)
    acc = a.to(torch.float64) @ b.to(torch.float64)
    if azp_adj is not None:
        if azp_adj.numel() != n:
            raise _fail("scaled_mm", "azp_adj", f"N={n} values", azp_adj)
        adj = azp_adj.to(torch.float64).reshape(1, n)
        if azp is not None:
            if azp.numel() != m:
                raise _fail("scaled_mm", "azp", f"M={m} values", azp)
            adj = azp.to(torch.float64).reshape(m, 1) * adj
        acc = acc - adj
    elif azp is not None:
        raise _fail("scaled_mm", "azp", "None unless azp_adj is given", azp)
    d = scale_a.to(torch.float64).reshape(-1, 1) * scale_b.to(torch.float64).reshape(1, -1) * acc
    if bias is not None:
        if bias.numel() != n:
            raise _fail("scaled_mm", "bias", f"None or N={n} values", bias)
        d = d + bias.to(torch.float64).reshape(1, n)
    return d


# ---------------------------------------------------------------------------------------------
# MoE: grouped GEMM + dequant + SwiGLU + per-token quant (A8W8 int8, fp8 e4m3, A8W4)
# ---------------------------------------------------------------------------------------------

_FP8 = torch.float8_e4m3fn
QUANT_MAX = {torch.int8: 127, _FP8: 448}   # the largest |q| of each quantized output dtype


def _moe_fail(op: str, argument: str, expected: str, got) -> ValueError:
    """_fail, but a str `got` is shown as is (a description, not a value)."""
    if isinstance(got, str):
        return ValueError(f"gemmgen.reference.{op}: argument '{argument}': expected {expected}; "
                          f"got {got}")
    return _fail(op, argument, expected, got)


def _swiglu_quant(op: str, c: torch.Tensor, dtype: torch.dtype, fused: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    if dtype not in QUANT_MAX:
        raise _moe_fail(op, "dtype", "torch.int8 or torch.float8_e4m3fn", dtype)
    if (not isinstance(c, torch.Tensor) or c.dim() != 2 or not c.dtype.is_floating_point
            or c.dtype == _FP8 or c.shape[1] == 0 or c.shape[1] % 2):
        raise _moe_fail(op, "c", "a 2-D float32 / float16 / bfloat16 / float64 tensor [M, N] "
                        "with N even and positive (SwiGLU splits it in halves)", c)
    c = c.to(torch.float32)
    if not bool(torch.isfinite(c).all()):
        raise _moe_fail(op, "c", "finite values", "NaN or Inf")
    h = c.shape[1] // 2
    act, gate = c[:, :h].to(torch.float64), c[:, h:].to(torch.float64)
    s = (act / (1 + torch.exp(-act)) * gate).to(torch.float32)
    if not bool(torch.isfinite(s).all()):
        if fused:   # C is internal: name the scales that made it too large
            raise _moe_fail(op, "x_scale", "scales with which SwiGLU(C) = swish(act) * gate "
                            "fits in float32", "an overflow")
        raise _moe_fail(op, "c", "values whose SwiGLU swish(act) * gate fits in float32",
                        "an overflow")
    qmax = QUANT_MAX[dtype]
    q_scale = s.abs().amax(dim=1) / qmax                        # float32, one rounding
    zero = q_scale == 0
    v = s / torch.where(zero, 1.0, q_scale).unsqueeze(1)        # float32, one rounding
    if dtype == torch.int8:
        q = torch.round(v).clamp(-qmax, qmax)                   # half to even
    else:
        q = v.clamp(-qmax, qmax)                                # cast below: nearest, ties even
    q = torch.where(zero.unsqueeze(1), 0.0, q).to(dtype)
    return q, torch.where(zero, 0.0, q_scale)


def swiglu_quant_reference(c: torch.Tensor, dtype: torch.dtype = torch.int8
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The last two steps of grouped_matmul_swiglu_quant on a given C [M, N] (N even):
    SwiGLU, then per-row (per-token) symmetric quantization. Returns (q [M, N/2] of `dtype`,
    q_scale float32 [M]) on c's device.

        c is first converted to float32 (exact from float16 / bfloat16; float64 is rounded once)
        act, gate = c[:, :N/2], c[:, N/2:]
        S = swish(act) * gate,  swish(v) = v / (1 + exp(-v))
        q_scale[m] = max_j |S[m, j]| / QMAX          QMAX = 127 (int8), 448 (float8_e4m3fn)
        int8:    q = clamp(round(S / q_scale), -127, 127), round = half to even (torch.round:
                 2.5 -> 2, 3.5 -> 4, -0.5 -> -0)
        fp8:     q = clamp(S / q_scale, -448, 448) cast to float8_e4m3fn: round to nearest, ties
                 to even (13.5 -> 14, 12.5 -> 12), saturating at ±448 (the clamp: e4m3fn has no
                 inf, and the torch cast's overflow behavior is not relied on)
        a row with q_scale == 0 (S all zero, or max|S| / QMAX underflowing to 0): q = 0 and
        q_scale = 0, never NaN.

    Roundings: S is computed in float64 from the float32 act and gate and rounded once to
    float32 (so it does not depend on the device's float32 exp: CPU and GPU agree bit for bit;
    a kernel computing in float32 is within a few float32 ulps of it); q_scale = max|S| / QMAX
    and S / q_scale are float32 divisions (one IEEE rounding each). The quantization divides by
    q_scale, as specified (not multiplied by a reciprocal). Non-finite c, or an S that
    overflows float32, raise ValueError.
    """
    return _swiglu_quant("swiglu_quant_reference", c, dtype)


def _grouped_dequant(op: str, x, weight, weight_scale, x_scale, group_list, group_list_type,
                     weight_bits, weight_assist_matrix) -> tuple[torch.Tensor, torch.dtype]:
    """C float32 [M, N] (rows past the last group: 0) and the quantized output dtype."""
    where = f"reference.{op}"
    if weight_bits not in (None, 8, 4) or isinstance(weight_bits, bool):
        raise _moe_fail(op, "weight_bits", "None, 8 or 4", weight_bits)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.int8, _FP8):
        raise _moe_fail(op, "x", "a 2-D torch.int8 or torch.float8_e4m3fn tensor [M, K]", x)
    m, k = x.shape
    device = x.device
    w = _stack_weights(where, weight, "weight")
    if w.dtype != x.dtype or w.dim() != 3 or w.shape[1] != k or w.device != device:
        raise _moe_fail(op, "weight", f"a {x.dtype} tensor [E, K={k}, N] on {device} like x "
                        "(or a list of E [K, N] tensors)", w)
    e, _, n = w.shape
    if n == 0 or n % 2:
        raise _moe_fail(op, "weight", "N (the last dim) even and positive (SwiGLU splits C's "
                        "columns in halves)", w)
    ws = _stack_weights(where, weight_scale, "weight_scale")
    bits = weight_bits if weight_bits is not None else (4 if ws.dim() == 3 else 8)
    if bits == 4 and x.dtype != torch.int8:
        raise _moe_fail(op, "weight_bits", "8 for float8_e4m3fn x (A8W4 takes int8 x and int4 "
                        "values in an int8 weight)", bits)
    per_group = ws.dim() == 3
    if bits == 8:
        shape_ok = tuple(ws.shape) == (e, n)
        expected = f"a torch.float32 tensor [E={e}, N={n}] (or a list of E [N] tensors; " \
                   "per-group scales [E, K/group, N] are A8W4's: weight_bits=4)"
    else:
        shape_ok = ((ws.dim() == 2 and tuple(ws.shape) == (e, n)) or
                    (per_group and ws.shape[0] == e and ws.shape[2] == n and ws.shape[1] >= 1
                     and k % ws.shape[1] == 0))
        expected = (f"a torch.float32 tensor [E={e}, N={n}] (per-channel) or [E={e}, G, N={n}] "
                    f"with G dividing K={k} (per-group), or a list of E such tensors")
    if ws.dtype != torch.float32 or not shape_ok or ws.device != device:
        raise _moe_fail(op, "weight_scale", expected + f", on {device}", ws)
    if (not isinstance(x_scale, torch.Tensor) or x_scale.dtype != torch.float32
            or tuple(x_scale.shape) != (m,) or x_scale.device != device):
        raise _moe_fail(op, "x_scale", f"a torch.float32 tensor [M={m}] on {device}", x_scale)
    if isinstance(group_list, torch.Tensor) and group_list.device != device:
        raise _moe_fail(op, "group_list", f"a tensor on {device} like x", group_list)
    if isinstance(group_list, torch.Tensor) and group_list.dim() == 1 and group_list.shape[0] != e:
        raise _moe_fail(op, "group_list", f"E={e} entries (one per expert of weight)", group_list)
    starts, ends = _group_offsets(where, group_list, group_list_type, m, True)
    for name, t in (("weight_scale", ws), ("x_scale", x_scale)):
        if not bool(torch.isfinite(t).all()):
            raise _moe_fail(op, name, "finite values", "NaN or Inf")
    if bits == 4 and w.numel():
        lo, hi = int(w.min()), int(w.max())
        if lo < -8 or hi > 7:
            raise _moe_fail(op, "weight", "int4 values -8..7 (weight_bits=4)",
                            f"values in {lo}..{hi}")
    groups = ws.shape[1] if per_group else 1
    ws64 = ws.reshape(e, groups, n).to(torch.float64)
    w64 = w.to(torch.float64)
    if weight_assist_matrix is not None:
        if bits != 4:
            raise _moe_fail(op, "weight_assist_matrix", "None: the assist matrix is A8W4's "
                            "only (weight_bits=4)", weight_assist_matrix)
        _check_assist_matrix(op, _stack_weights(where, weight_assist_matrix,
                                                "weight_assist_matrix"), w, ws, w64, ws64)
    gs = k // groups
    xs64 = x_scale.to(torch.float64)
    c = torch.zeros(m, n, dtype=torch.float64, device=device)
    for i, (s, t) in enumerate(zip(starts.tolist(), ends.tolist())):
        if t > s:
            xi = x[s:t].to(torch.float64).reshape(t - s, groups, gs)
            acc = torch.einsum("rgk,gkn->rgn", xi, w64[i].reshape(groups, gs, n))   # exact
            c[s:t] = (acc * ws64[i]).sum(dim=1) * xs64[s:t].unsqueeze(1)
    c = c.to(torch.float32)
    if not bool(torch.isfinite(c).all()):
        raise _moe_fail(op, "x_scale", "scales with which every C = (X·W) ⊙ x_scale ⊙ "
                        "weight_scale fits in float32", "an overflow")
    return c, (torch.int8 if x.dtype == torch.int8 else _FP8)


def _check_assist_matrix(op: str, wam: torch.Tensor, w: torch.Tensor, ws: torch.Tensor,
                         w64: torch.Tensor, ws64: torch.Tensor) -> None:
    e, k, n = w.shape
    if wam.dtype != torch.float32 or tuple(wam.shape) != (e, n) or wam.device != w.device:
        raise _moe_fail(op, "weight_assist_matrix", f"None or a torch.float32 tensor "
                        f"[E={e}, N={n}] on {w.device} (or a list of E [N] tensors)", wam)
    if ws.dim() == 2:
        expected = ws * w.sum(dim=1).to(torch.float32) * 8      # one rounding: the same value
        bad = wam != expected                                   # in any order, or via float64
        rule = "8 · weight_scale · Σ_k weight (per-channel; exact in float32)"
    else:
        groups = ws.shape[1]
        terms = w64.reshape(e, groups, k // groups, n) * ws64.reshape(e, groups, 1, n)
        expected = 8 * terms.sum(dim=(1, 2))
        bound = (k + 2) * 2.0 ** -24 * 8 * terms.abs().sum(dim=(1, 2)) + 2.0 ** -149
        bad = (wam.to(torch.float64) - expected).abs() > bound
        rule = ("8 · Σ_k weight[k] · weight_scale[k // group] (per-group; within float32 "
                "summation error)")
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise _moe_fail(op, "weight_assist_matrix", rule,
                        f"weight_assist_matrix[{i}, {j}] = {float(wam[i, j])!r}, not "
                        f"{float(expected[i, j])!r}")


def grouped_matmul_dequant(x, weight, weight_scale, x_scale, group_list,
                           group_list_type: str = "count", *, weight_bits: Optional[int] = None,
                           weight_assist_matrix=None) -> torch.Tensor:
    """The first step of grouped_matmul_swiglu_quant alone: C float32 [M, N] on x's device (the
    same arguments and checks; rows past the last group are 0). See there for the definition
    and its roundings. `swiglu_quant_reference(C, q dtype)` gives the op's (q, q_scale)."""
    c, _ = _grouped_dequant("grouped_matmul_dequant", x, weight, weight_scale, x_scale,
                            group_list, group_list_type, weight_bits, weight_assist_matrix)
    return c


def grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list,
                                group_list_type: str = "count", *,
                                weight_bits: Optional[int] = None, weight_assist_matrix=None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The MoE grouped GEMM + dequant + SwiGLU + per-token quant (like Ascend's
    aclnnGroupedMatmulSwigluQuantV2), in plain torch on x's device (CPU or GPU).
    Returns (q [M, N/2], q_scale float32 [M]).

    Arguments (all on x's device):
      x             [M, K] torch.int8 (A8W8, A8W4) or torch.float8_e4m3fn (fp8); rows grouped by
                    expert, contiguous, in expert order.
      weight        [E, K, N] (not transposed), x's dtype; or a list of E [K, N] tensors.
                    A8W4: the int4 values -8..7 held in a torch.int8 tensor (one per byte).
                    N even (SwiGLU halves).
      weight_scale  torch.float32 [E, N] per-channel (or a list of E [N]); A8W4 also
                    [E, G, N] per-group, G dividing K, group = K / G (or a list of E [G, N]).
      x_scale       torch.float32 [M] per-token.
      group_list    torch.int64 [E]: rows per expert (group_list_type="count") or end offsets
                    ("cumsum"); see gemmgen.families.moe.grouping. Checked (ValueError naming the
                    first bad entry); rows [end of the last group, M) belong to no expert.
      weight_bits   None (default), 8 or 4. None: 4 when weight_scale is 3-D (per-group scales
                    exist in A8W4 only), else 8. int4 values in an int8 tensor look like int8,
                    and per-channel A8W4 has exactly A8W8's math; weight_bits=4 adds the check
                    that the weight holds -8..7 and admits weight_assist_matrix. fp8: 8 only.
      weight_assist_matrix  A8W4 only (else it must be None): Ascend's offline-computed
                    [E, N] float32 (or a list of E [N]) that its kernel adds back after splitting
                    int8 x into two int4 halves. IGNORED by the computation (it is implied by
                    the weights: this reference multiplies X·W directly), but VALIDATED when
                    given: shape [E, N] float32, and its values: per-channel it must equal
                    8 · weight_scale · Σ_k weight exactly (a single float32 rounding of an
                    exact product, the same whatever the order the caller computed it in);
                    per-group 8 · Σ_k weight[k] · weight_scale[k // group] within float32
                    summation error ((K + 2) · 2^-24 · 8 · Σ_k |weight[k] · weight_scale[..]|).

    Definition, for expert i with rows X_i = x[start_i:end_i]:
      1. C_i = (X_i · W_i) ⊙ x_scale_i (over columns) ⊙ weight_scale_i (over rows);
         A8W4 per-group: C_i = Σ_g (X_i[:, g] · W_i[g, :]) ⊙ weight_scale_i[g, :],
         then ⊙ x_scale_i.
         The products X·W are exact: integer sums (what int32 accumulation gives whenever it
         does not overflow: |x·w| <= 2^14, so for K < 2^17) or, for fp8, the exact sum of the
         exact e4m3 products (float64 holds it for K <= 2^17), which a kernel's float32
         accumulation approximates. The scaling is computed in float64 and rounded once to
         float32: C is the correctly rounded float32 of the exact value (but in the
         vanishingly rare case where that value lies within ~2^-50 relative of a float32
         rounding midpoint, and never for scales of a few significant bits).
      2. act_i, gate_i = the first and second halves of C_i's N columns;
      3. S_i = swish(act_i) ⊙ gate_i, swish(v) = v / (1 + e^(−v)), a float32 result;
      4. per row: q_scale = max|S_row| / 127, q = round(S_row / q_scale) to nearest with ties
         to EVEN (torch.round), clamped to [−127, 127]. fp8: q_scale = max|S_row| / 448,
         q = S_row / q_scale cast to float8_e4m3fn (nearest, ties to even, saturating at ±448).
    Rows past the last group: q = 0, q_scale = 0. A row whose S is all zero: q = 0, q_scale = 0
    (never NaN). Steps 2-4 and their exact roundings: `swiglu_quant_reference`.

    Every bad argument raises ValueError "gemmgen.reference.grouped_matmul_swiglu_quant:
    argument '...': expected ...; got ...". Reads values back to the host (group list, checks):
    a reference, not a kernel.
    """
    op = "grouped_matmul_swiglu_quant"
    c, dtype = _grouped_dequant(op, x, weight, weight_scale, x_scale, group_list,
                                group_list_type, weight_bits, weight_assist_matrix)
    return _swiglu_quant(op, c, dtype, fused=True)
