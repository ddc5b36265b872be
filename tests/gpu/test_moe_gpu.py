"""GPU tests of the MoE family, `gemmgen.grouped_matmul_swiglu_quant` (grouped GEMM per expert +
dequant + SwiGLU + dynamic per-token quantization, sm90a), in its three variants: A8W8 int8,
fp8 e4m3, A8W4 (int8 activations, int4 weights with per-channel scales) and A8W4 with per-group
scales ("a8w4g": [E, K/128, N], the direct and wgmma kernels; the wgmma kernels also on their own cases: K with a
partial last chunk, groups of 128 to 512).

What is tested, each against `gemmgen.reference` on fresh random data (seeded per test by
conftest.py, so a failure reproduces):
  1. every built kernel, forced by name, with weights of its `spec.w` (A8W4: int4 values -8..7
     packed with weight_bits=4): M in {1, 7, 64, 300}, uniform / skewed routing, an
     empty expert, rows past the last group; through the public op and through the custom op
     `torch.ops.gemmgen.grouped_matmul_swiglu_quant_out` writing into poisoned outputs (q: -128
     for int8, NaN bits for e4m3 — values the op can never produce, as it clamps to ±QMAX;
     q_scale: NaN), so an element the kernel never wrote is caught;
  2. the dispatch path: E in {1, 8, 64, 128}, M from 1 to 8192, routings uniform / Zipf-skewed /
     empty experts / all tokens on one expert / fewer rows than M, "count" and "cumsum" group
     lists, and every weight form (stacked [E, K, N], a list of E [K, N], a packed `MoeWeight`,
     a K-major view of a contiguous [E, N, K]; A8W4: the unpacked forms hold int4 values in int8
     and pass weight_bits=4, packed per call), checking that dispatch picks a kernel of the
     variant; K a small multiple of the op's K granule (16, A8W4 32), not of the tile's K;
  3. A8W4's weight forms (MoeWeight, unpacked int8 with weight_bits=4, the custom op on the
     packed uint8 tensor) agree bit for bit, and `weight_assist_matrix` (8·weight_scale·Σ_k W,
     which the reference validates) is accepted and ignored (same bits; garbage values too);
  4. for each variant (int8, e4m3, a8w4): determinism (three runs bit for bit), CUDA graph
     capture and replay with new group lists (the default `check` must turn itself off while
     capturing), bad group lists with check=False (clamped on the device: no out-of-bounds
     access, the result of the clamped list) and check=True (ValueError),
     torch.compile(fullgraph=True); argument errors, A8W4's included (per-group scales, the
     assist matrix, e4m3 x, K not a multiple of 32, weight_bits).

Comparison (`assert_quant_close`): the reference C = (X·W) ⊙ x_scale ⊙ weight_scale is exact
(float64, rounded once to float32); the kernel's C differs from it by
  * fp32 intermediate: a few float32 roundings (the int32 accumulator of int8 is exact, and of
    A8W4 too: int4 is widened to int8 in registers, same epilogue), < 2^-21 relative;
  * per-group scales: each group's exact int32 sum times its scale, added in float32 (in the
    warps that split K, then across them): at most (G + 16)·2^-24 of Σ_g |x_scale·w_scale_g·acc_g|;
  * bf16 intermediate: the rounding to bf16, up to 2^-8 relative (8 significant bits);
  * fp8 inputs, either intermediate: the tensor cores' fp8 accumulation (the accurate kernels
    promote it to float32 every 4 wgmmas; the `fast_accum` ones and the direct kernel do not,
    the worse case).
    Measured on an H100 with fast accumulation (torch._scaled_mm with use_fast_accum=True,
    ~N(0, 1) e4m3 data, K = 256..4096) the error is at most ~2^-11 of s_x·s_w·Σ_k|x·w|,
    whatever K; the bound used is 2^-9 of that magnitude.
That bound on C is carried exactly through SwiGLU (|d swish| <= |swish'|·dC + dC²/4, plus a
float32 evaluation error of 2^-20 relative), then through the row maximum (q_scale lies in
[max(|S| − dS), max(|S| + dS)] / QMAX) and the division S / q_scale, giving for every element an
interval of possible unrounded values v. q must be one of the quantized values of that interval:
for an fp32-intermediate int8 kernel the interval is ~1e-6 relative, so q equals the reference
except within ~1e-6 relative of a rounding tie (where it may differ by one); bf16 and fp8 allow
proportionally more. So that a loose bound cannot hide garbage, the fraction of elements that
differ from the reference's q at all is also bounded (MAX_DIFFERING). Rows past the last group
must be exactly q = 0, q_scale = 0.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import pytest
import torch

import gemmgen
import gemmgen.families.moe.ops  # noqa: F401  (registers the custom op *_out)
from gemmgen import reference
from gemmgen.bindings import launch
from gemmgen.families.moe.grouping import group_offsets, stack_weights

pytestmark = pytest.mark.gpu

OP = "grouped_matmul_swiglu_quant"
DEVICE = torch.device("cuda")
FP8 = torch.float8_e4m3fn
ELEMENTS = {"int8": torch.int8, "e4m3": FP8}
QMAX = {torch.int8: 127, FP8: 448}
# Bytes q is poisoned with: -128 (int8) and 0x7F (e4m3 NaN) are outside the op's clamped range.
POISON = {torch.int8: 0x80, FP8: 0x7F}
# Scales: rand·1e-2 + 1e-3, times a gain per dtype so that C is O(1)-O(10) (SwiGLU's curved part
# is exercised): int8 x·w sums are ~sqrt(K)·5e3, e4m3 ~N(0, 1) ones ~sqrt(K).
SCALE_GAIN = {torch.int8: 1.0, FP8: 64.0}
# int4 weights (-8..7, rms ~4.6) are ~16x smaller than int8 ones (rms ~74): their scales get 16x.
INT4_WEIGHT_GAIN = 16.0

# Error model of the kernel's C (see the module docstring).
C_REL = {"fp32": 2.0**-21, "bf16": 2.0**-8 + 2.0**-21}
FP8_ACCUM_REL = 2.0**-9      # of s_x·s_w·Σ|x·w|
S_REL = 2.0**-20             # float32 swish(act)·gate in the kernel vs the exact value
DIV_REL = 2.0**-22           # one float32 division (q_scale, S / q_scale), with margin
# The largest fraction of elements of q that may differ from the reference's at all (the bounds
# above are worst cases; this keeps garbage from passing under them). Seen: a CPU model of the
# kernel (float32 epilogue, bf16 rounding; fp8 accumulation noise up to 2^-11·Σ|x·w| in 1% of the
# elements and 2^-13 elsewhere, several times the H100's) differs in 0% (int8, fp32), ~2% (int8,
# bf16), ~7% (e4m3, fp32), ~9% (e4m3, bf16) of the elements, and in a single row (M = 1: one
# q_scale error shifts the whole row) in up to 0%, 8%, 14%, 17%; the same pipeline around the
# H100's own fp8 fast accumulation (torch._scaled_mm) in up to 2.4% (fp32) and 4.7% (bf16).
MAX_DIFFERING = {("int8", "fp32"): 0.01, ("int8", "bf16"): 0.15,
                 ("e4m3", "fp32"): 0.20, ("e4m3", "bf16"): 0.25}


# ------------------------------------------------------------------------------------ helpers

@dataclass(frozen=True)
class Variant:
    """A dispatch class of the op: activation type `x` (also q's) and weight type `w`, as in
    `kernel.spec.x` / `kernel.spec.w`."""

    name: str
    x: str
    w: str
    scales: str = "channel"

    @property
    def per_group(self) -> bool:
        return self.scales == "group"

    def scale_shape(self, e: int, k: int, n: int) -> tuple[int, ...]:
        """weight_scale's logical shape: [E, N], or [E, K/GROUP, N] per group."""
        return (e, k // GROUP, n) if self.per_group else (e, n)

    @property
    def dtype(self) -> torch.dtype:
        """x's (and q's) dtype."""
        return ELEMENTS[self.x]

    @property
    def bits(self) -> int:
        """The op's weight_bits."""
        return 4 if self.w == "int4" else 8

    @property
    def k_multiple(self) -> int:
        """The op's K granule (int4 weight rows hold K/2 bytes, 16-byte aligned)."""
        return 32 if self.bits == 4 else 16


GROUP = 128  # the per-group variant's group size
VARIANTS = {"int8": Variant("int8", "int8", "int8"), "e4m3": Variant("e4m3", "e4m3", "e4m3"),
            "a8w4": Variant("a8w4", "int8", "int4"), "a8w4g": Variant("a8w4g", "int8", "int4", "group")}


def variant_of(spec) -> Variant:
    for v in VARIANTS.values():
        if (v.x, v.w, v.scales) == (spec.x, spec.w, spec.scales):
            return v
    raise AssertionError(f"kernel spec with x={spec.x!r}, w={spec.w!r}, scales={spec.scales!r}: "
                         "no variant in this test")


def built_variants() -> dict[str, list]:
    """The built kernels of the family, by variant name."""
    found: dict[str, list] = {}
    for kernel in gemmgen.list_kernels():
        if kernel.spec.family == "moe":
            found.setdefault(variant_of(kernel.spec).name, []).append(kernel)
    return found


def require_variant(name: str) -> Variant:
    if name not in built_variants():
        pytest.skip(f"no built {OP} kernel for {name}")
    return VARIANTS[name]


def dispatched_intermediate(x: torch.Tensor, e: int, n: int, variant: Variant) -> str:
    """The intermediate type ("fp32" / "bf16") of the kernel dispatch picks for this problem
    (asserting that it is a kernel of the variant: A8W4 needs weight_bits=4)."""
    m, k = x.shape
    choice = gemmgen.dispatch.choose(OP, x_dtype=x.dtype, m=max(m, 1), experts=e, n=n, k=k,
                                     weight_bits=variant.bits, per_group=variant.per_group,
                                     device=x.get_device())
    spec = choice.kernel.spec
    assert (spec.x, spec.w, spec.scales) == (variant.x, variant.w, variant.scales), \
        f"dispatch picked {choice.kernel.name} for {variant.name}"
    return spec.c


def random_values(shape, dtype: torch.dtype) -> torch.Tensor:
    """int8: the full range -128..127; e4m3: N(0, 1) rounded to e4m3."""
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, dtype=torch.int8, device=DEVICE)
    return torch.randn(shape, device=DEVICE).to(FP8)


def random_scales(shape, dtype: torch.dtype) -> torch.Tensor:
    return (torch.rand(shape, device=DEVICE) * 1e-2 + 1e-3) * SCALE_GAIN[dtype]


def random_weight(shape, variant: Variant) -> torch.Tensor:
    """The logical weight [E, K, N]: x's dtype, or int4 values -8..7 in int8 (A8W4)."""
    if variant.bits == 4:
        return torch.randint(-8, 8, shape, dtype=torch.int8, device=DEVICE)
    return random_values(shape, variant.dtype)


def random_weight_scales(shape, variant: Variant) -> torch.Tensor:
    gain = INT4_WEIGHT_GAIN if variant.bits == 4 else 1.0
    return random_scales(shape, variant.dtype) * gain


def pack(weight: torch.Tensor, weight_scale: torch.Tensor, variant: Variant):
    return gemmgen.pack_moe_weights(weight, weight_scale, weight_bits=variant.bits)


def assist_matrix(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """Ascend's A8W4 weight_assist_matrix, 8 · Σ_k W[k] · weight_scale[group of k], [E, N]
    float32."""
    if weight_scale.dim() == 2:
        return 8 * weight_scale * weight.sum(dim=1).float()
    e, k, n = weight.shape
    per_group = weight.view(e, weight_scale.shape[1], -1, n).sum(dim=2).double()
    return (8 * (per_group * weight_scale.double()).sum(dim=1)).float()


def routing_counts(routing: str, m: int, e: int) -> list[int]:
    """Rows per expert (a valid "count" list for M = m rows):
    uniform: as even as possible; skewed: multinomial over Zipf-like weights (a dominant expert,
    a long tail of small or empty ones); empty: every other expert empty, the rest uniform;
    one: every row on one random expert; short: uniform over ~60% of the rows (rows past the
    last group), the last expert empty."""
    if routing == "uniform":
        base, extra = divmod(m, e)
        return [base + (i < extra) for i in range(e)]
    if routing == "skewed":
        weights = 1.0 / torch.arange(1, e + 1, dtype=torch.float64) ** 1.5
        weights = weights[torch.randperm(e)]
        picks = torch.multinomial(weights, m, replacement=True) if m else torch.zeros(0).long()
        return torch.bincount(picks, minlength=e).tolist()
    if routing == "empty":
        live = list(range(1, e, 2)) or [0]
        counts = [0] * e
        for i, c in zip(live, routing_counts("uniform", m, len(live))):
            counts[i] = c
        return counts
    if routing == "one":
        counts = [0] * e
        counts[int(torch.randint(e, ()))] = m
        return counts
    if routing == "short":
        counts = routing_counts("uniform", m * 3 // 5, max(e - 1, 1))
        return counts + [0] * (e - len(counts))
    raise AssertionError(f"unknown routing {routing!r}")


def group_list_of(counts: list[int], group_list_type: str) -> torch.Tensor:
    values = torch.tensor(counts, dtype=torch.int64, device=DEVICE)
    return values if group_list_type == "count" else torch.cumsum(values, 0)


def poisoned_outputs(m: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.empty((m, n // 2), dtype=dtype, device=DEVICE)
    q.view(torch.uint8).fill_(POISON[dtype])
    return q, torch.full((m,), float("nan"), device=DEVICE)


def call_out_op(x, packed, x_scale, group_list, group_list_type="count", kernel=None):
    """The custom op into poisoned q / q_scale (proves every element is written); `packed` a
    MoeWeight (A8W4: its uint8 [E, N, K/2] tensor with weight_bits=4)."""
    q, q_scale = poisoned_outputs(x.shape[0], packed.n, x.dtype)
    torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(q, q_scale, x, packed.weight, packed.scale,
                                                      x_scale, group_list, group_list_type,
                                                      packed.bits, False, kernel)
    return q, q_scale


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def quantize64(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 v quantized like the op's q, as float64: int8 round half to even clamped to ±127;
    e4m3 nearest, ties to even, saturating at ±448 (done in float64: no double rounding)."""
    if dtype == torch.int8:
        return torch.round(v.clamp(-127, 127))
    a = v.abs().clamp(max=448.0)
    exponent = torch.floor(torch.log2(a)).clamp(min=-6)   # subnormals step like 2^-6's binade
    step = torch.exp2(exponent - 3)
    return torch.copysign(torch.round(a / step) * step, v)


def c_error_bound(c, x, weight, weight_scale, x_scale, group_list, group_list_type,
                  intermediate: str) -> torch.Tensor:
    """A bound on |C_kernel - C_ref| per element (float64)."""
    bound = C_REL[intermediate] * c.double().abs()
    weight_scale = stack_weights(weight_scale, argument="weight_scale")
    if weight_scale.dim() == 3:   # per group: float32 sums of the scaled group sums
        groups = weight_scale.shape[1]
        bound = bound + (groups + 16) * 2.0**-24 * per_group_magnitude(
            x, stack_weights(weight), weight_scale, x_scale, group_list, group_list_type)
    if x.dtype == FP8:   # fp8 tensor-core accumulation: relative to s_x·s_w·Σ|x·w|
        def absolute(t):
            return t.float().abs().to(FP8)   # exact
        magnitude = reference.grouped_matmul_dequant(absolute(x), absolute(weight), weight_scale,
                                                     x_scale, group_list, group_list_type)
        bound = bound + FP8_ACCUM_REL * (1 + C_REL[intermediate]) * magnitude.double()
    return bound


def per_group_magnitude(x, weight, weight_scale, x_scale, group_list, group_list_type):
    """Σ_g |x_scale · weight_scale_g · (X·W)_g| per element of C (float64), with absolute values
    throughout (an upper bound of it)."""
    m, k = x.shape
    groups = weight_scale.shape[1]
    out = torch.zeros(m, weight.shape[2], dtype=torch.float64, device=x.device)
    starts, ends = group_offsets(group_list, group_list_type, m, check=False)
    for i, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        if end > start:
            xa = x[start:end].double().abs().view(end - start, groups, k // groups)
            wa = weight[i].double().abs().view(groups, k // groups, -1)
            out[start:end] = (torch.einsum("rgk,gkn,gn->rn", xa, wa, weight_scale[i].double().abs())
                              * x_scale[start:end].double().abs()[:, None])
    return out


def swiglu_with_bound(c: torch.Tensor, dc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S = swish(act)·gate in float64 from the float32 C, and a bound on the kernel's |S − S_ref|
    given |dC| <= dc: |Δswish| <= |swish'(a)|·da + da²/4 (|swish''| <= 1/2), |swish| <= 1.1."""
    h = c.shape[1] // 2
    a, g = c[:, :h].double(), c[:, h:].double()
    da, dg = dc[:, :h], dc[:, h:]
    sig = torch.sigmoid(a)
    swish = a * sig
    slope = sig * (1 + a * (1 - sig))
    s = swish * g
    ds = ((slope.abs() * da + da * da / 4) * g.abs() + (swish.abs() + 1.1 * da) * dg
          + S_REL * s.abs() + 1e-30)
    return s, ds


def poison_left(q: torch.Tensor, q_scale: torch.Tensor) -> bool:
    bad_q = (q == -128) if q.dtype == torch.int8 else q.float().isnan()
    return bool(bad_q.any() or q_scale.isnan().any())


def scale_interval(s: torch.Tensor, ds: torch.Tensor, qmax: int):
    """Where the kernel's q_scale may lie: [max(|S| - dS), max(|S| + dS)] / QMAX, per row."""
    lo = ((s.abs() - ds).amax(dim=1).clamp_min(0) / qmax) * (1 - DIV_REL)
    hi = ((s.abs() + ds).amax(dim=1) / qmax) * (1 + DIV_REL)
    return lo, hi


def value_interval(s, ds, scale_lo, scale_hi):
    """Where the kernel's unrounded S / q_scale may lie, per element, with S in [s - ds, s + ds]
    and q_scale in [scale_lo, scale_hi] (> 0), widened by one float32 division rounding."""
    lo_s, hi_s = s - ds, s + ds
    slo, shi = scale_lo.unsqueeze(1).clamp_min(1e-300), scale_hi.unsqueeze(1)
    v_lo = torch.where(lo_s >= 0, lo_s / shi, lo_s / slo) * (1 + DIV_REL * torch.sign(-lo_s))
    v_hi = torch.where(hi_s >= 0, hi_s / slo, hi_s / shi) * (1 + DIV_REL * torch.sign(hi_s))
    return v_lo, v_hi


def first_bad(bad: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(v) for v in bad.nonzero()[0])


def assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list,
                       group_list_type: str = "count", intermediate: str = "fp32",
                       label: str = "", *, weight_bits: int = 8) -> None:
    """(q, q_scale) from the op against the reference, under the error model of the module
    docstring. `weight` is the logical [E, K, N] weight (or a list of E [K, N]; A8W4: the int4
    values in int8, with weight_bits=4)."""
    dtype, m = x.dtype, x.shape[0]
    weight = stack_weights(weight)
    weight_scale = stack_weights(weight_scale, argument="weight_scale")
    where = f"{label}: " if label else ""
    assert q.dtype == dtype and tuple(q.shape) == (m, weight.shape[2] // 2), \
        f"{where}q is {q.dtype} {tuple(q.shape)}"
    assert q_scale.dtype == torch.float32 and tuple(q_scale.shape) == (m,), \
        f"{where}q_scale is {q_scale.dtype} {tuple(q_scale.shape)}"
    assert not poison_left(q, q_scale), f"{where}unwritten elements (poison left)"
    c = reference.grouped_matmul_dequant(x, weight, weight_scale, x_scale, group_list,
                                         group_list_type, weight_bits=weight_bits)
    ref_q, ref_scale = reference.swiglu_quant_reference(c, dtype)

    total = int(group_offsets(group_list, group_list_type, m)[1][-1])
    assert bool((q[total:].float() == 0).all() and (q_scale[total:] == 0).all()), \
        f"{where}rows past the last group ({total}..{m}) must get q = 0, q_scale = 0"
    if total == 0:
        return
    dc = c_error_bound(c, x, weight, weight_scale, x_scale, group_list, group_list_type,
                       intermediate)
    s, ds = swiglu_with_bound(c[:total], dc[:total])
    q, got_scale, ref_q, ref_scale = q[:total], q_scale[:total].double(), ref_q[:total], \
        ref_scale[:total].double()

    scale_lo, scale_hi = scale_interval(s, ds, QMAX[dtype])
    bad = (got_scale < scale_lo) | (got_scale > scale_hi) | got_scale.isnan()
    if bool(bad.any()):
        (i,) = first_bad(bad)
        raise AssertionError(f"{where}q_scale[{i}] = {float(got_scale[i])!r}, reference "
                             f"{float(ref_scale[i])!r}, allowed [{float(scale_lo[i])!r}, "
                             f"{float(scale_hi[i])!r}]; {int(bad.sum())} bad rows")

    zero = ref_scale == 0   # S all zero: q = 0 and q_scale = 0 exactly
    assert bool((got_scale[zero] == 0).all() and (q[zero].float() == 0).all()), \
        f"{where}rows with S = 0 must get q = 0, q_scale = 0"
    ones = torch.ones_like(scale_lo)
    v_lo, v_hi = value_interval(s, ds, torch.where(zero, ones, scale_lo),
                                torch.where(zero, ones, scale_hi))
    allowed_lo, allowed_hi = quantize64(v_lo, dtype), quantize64(v_hi, dtype)
    got = q.double()
    bad = ((got < allowed_lo) | (got > allowed_hi) | got.isnan()) & ~zero.unsqueeze(1)
    if bool(bad.any()):
        i, j = first_bad(bad)
        raise AssertionError(
            f"{where}q[{i}, {j}] = {float(got[i, j])!r}, reference {float(ref_q[i, j].float())!r}"
            f", allowed [{float(allowed_lo[i, j])!r}, {float(allowed_hi[i, j])!r}] (v in "
            f"[{float(v_lo[i, j])!r}, {float(v_hi[i, j])!r}]); {int(bad.sum())} of "
            f"{bad.numel()} elements out of bounds")

    differing = (got != ref_q.double()).double().mean().item()
    limit = MAX_DIFFERING[({torch.int8: "int8", FP8: "e4m3"}[dtype], intermediate)]
    assert differing <= limit, (f"{where}{differing:.2%} of q differs from the reference (at "
                                f"most {limit:.0%} expected with a {intermediate} intermediate)")


def valid_counts(group_list, group_list_type: str, m: int) -> torch.Tensor:
    """The count list equivalent to a possibly bad list under check=False's clamping."""
    starts, ends = group_offsets(group_list, group_list_type, m, check=False)
    return ends - starts


def variant_params():
    return pytest.mark.parametrize("variant", list(VARIANTS))


# ------------------------------------------------------------------------- 1. every kernel

KERNEL_ROUTINGS = ["uniform", "skewed", "empty", "short"]


def test_kernel_matches_reference(built_moe_kernel):
    """Each built kernel, forced by name, E = 8, K = 256, N = 512, M in {1, 7, 64, 300}, four
    routings, weights of the kernel's `spec.w` (A8W4: int4 packed with weight_bits=4); the public
    op and the custom op into poisoned outputs agree bit for bit. The direct kernels run both
    ways of finding their experts: each CTA scanning the group list (inline grouping: M up to 64
    here, grids of at most 512 CTAs) and group_work's shared lists (M = 300: 640 or more CTAs)."""
    spec = built_moe_kernel.spec
    variant = variant_of(spec)
    dtype = variant.dtype
    e, k, n = 8, 256, 512
    weight = random_weight((e, k, n), variant)
    weight_scale = random_weight_scales(variant.scale_shape(e, k, n), variant)
    packed = pack(weight, weight_scale, variant)
    assert packed.bits == variant.bits
    for m, routing in itertools.product((1, 7, 64, 300), KERNEL_ROUTINGS):
        group_list_type = "cumsum" if m == 64 else "count"
        label = f"{built_moe_kernel.name} M={m} {routing} {group_list_type}"
        x = random_values((m, k), dtype)
        x_scale = random_scales((m,), dtype)
        group_list = group_list_of(routing_counts(routing, m, e), group_list_type)
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(
            x, packed, None, x_scale, group_list, group_list_type, kernel=built_moe_kernel.name)
        assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list,
                           group_list_type, spec.c, label, weight_bits=variant.bits)
        out_q, out_scale = call_out_op(x, packed, x_scale, group_list, group_list_type,
                                       built_moe_kernel.name)
        torch.cuda.synchronize()
        assert not poison_left(out_q, out_scale), f"{label}: custom op left poison"
        assert same_bits(out_q, q) and same_bits(out_scale, q_scale), \
            f"{label}: the custom op and the public op differ"


def test_programmatic_launch_chain(built_moe_kernel):
    """Calls queued back to back as the model runs them, each call's q and q_scale the next
    call's x and x_scale (K = N / 2), under programmatic dependent launch (the sm90 kernels'
    GEMM waits for group_setup and lets the pass after it launch; each call's group setup starts
    after the previous call's pass): the same bits as the chain run call by call with PDL off, a
    sync after each step. Every step of the latter is checked against the reference."""
    spec = built_moe_kernel.spec
    variant = variant_of(spec)
    dtype = variant.dtype
    e, k, n, m, steps = 8, 256, 512, 300, 4
    weights = []
    for _ in range(2):
        weight = random_weight((e, k, n), variant)
        weight_scale = random_weight_scales(variant.scale_shape(e, k, n), variant)
        weights.append((weight, weight_scale, pack(weight, weight_scale, variant)))
    lists = [group_list_of(routing_counts(routing, m, e), "count")
             for routing in ("skewed", "uniform", "short", "empty")]
    x0, x_scale0 = random_values((m, k), dtype), random_scales((m,), dtype)
    before = launch.programmatic_dependent_launch()
    try:
        launch.set_programmatic_dependent_launch(False)
        x, x_scale = x0, x_scale0
        for i in range(steps):
            weight, weight_scale, packed = weights[i % 2]
            q, q_scale = call_out_op(x, packed, x_scale, lists[i], "count", built_moe_kernel.name)
            torch.cuda.synchronize()
            label = f"{built_moe_kernel.name} step {i}"
            assert not poison_left(q, q_scale), f"{label}: poison left"
            assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, lists[i], "count",
                               spec.c, label, weight_bits=variant.bits)
            x, x_scale = q, q_scale
        launch.set_programmatic_dependent_launch(True)
        chained, chained_scale = x0, x_scale0
        for i in range(steps):
            chained, chained_scale = call_out_op(chained, weights[i % 2][2], chained_scale,
                                                 lists[i], "count", built_moe_kernel.name)
        torch.cuda.synchronize()
        assert same_bits(chained, x) and same_bits(chained_scale, x_scale), \
            f"{built_moe_kernel.name}: the chain under PDL differs from the call-by-call chain"
    finally:
        launch.set_programmatic_dependent_launch(before)


# ------------------------------------------------------------------------- 2. dispatch path

ROUTINGS = ["uniform", "skewed", "empty", "one", "short"]
WEIGHT_FORMS = ["stacked", "list", "packed", "k_major"]


def weight_argument(form: str, weight: torch.Tensor, weight_scale: torch.Tensor,
                    variant: Variant):
    """(weight, weight_scale, keyword arguments) of the op for the logical [E, K, N] weight.
    A8W4: the unpacked forms hold int4 values in int8 and pass weight_bits=4 (packed by the
    op on every call); a MoeWeight carries its bits."""
    extra = {"weight_bits": 4} if variant.bits == 4 else {}
    if form == "stacked":
        return weight, weight_scale, extra
    if form == "list":
        return list(weight.unbind(0)), list(weight_scale.unbind(0)), extra
    if form == "packed":
        return pack(weight, weight_scale, variant), None, {}
    if form == "k_major":
        view = weight.transpose(1, 2).contiguous().transpose(1, 2)   # [E, K, N], K contiguous
        assert view.stride(1) == 1 and torch.equal(view.view(torch.uint8), weight.view(torch.uint8))
        return view, weight_scale, extra
    raise AssertionError(form)


@pytest.mark.parametrize("e", [1, 8, 64, 128], ids=lambda e: f"E{e}")
@variant_params()
def test_routing_cases(variant, e):
    """Dispatch (no forced kernel): M in {1, 16, 255, 1024, 8192} x every routing, cycling
    through "count" / "cumsum" and the four weight forms."""
    v = require_variant(variant)
    dtype = v.dtype
    k, n = 512, 256
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    cases = list(itertools.product((1, 16, 255, 1024, 8192), ROUTINGS))
    forms = itertools.cycle(WEIGHT_FORMS)
    types = itertools.cycle(["count", "cumsum", "cumsum"])   # 3 vs 4 forms: every pairing occurs
    for (m, routing), form, group_list_type in zip(cases, forms, types):
        label = f"{variant} E={e} M={m} {routing} {group_list_type} {form}"
        x = random_values((m, k), dtype)
        x_scale = random_scales((m,), dtype)
        group_list = group_list_of(routing_counts(routing, m, e), group_list_type)
        w_arg, ws_arg, extra = weight_argument(form, weight, weight_scale, v)
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, w_arg, ws_arg, x_scale, group_list,
                                                         group_list_type, **extra)
        assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list,
                           group_list_type, dispatched_intermediate(x, e, n, v), label,
                           weight_bits=v.bits)


@variant_params()
def test_k_not_a_multiple_of_the_tile(variant):
    """K = 1x and 5x the op's K granule (16; A8W4 32), not multiples of the tiles' K of 128: the
    last, partial K tile (zero-filled by the TMA; for A8W4 half-bytes of int4 rows) must add
    nothing but the real products."""
    if VARIANTS[variant].per_group:
        pytest.skip("per-group scales need K a multiple of the group size (128)")
    v = require_variant(variant)
    dtype = v.dtype
    e, n = 4, 256
    for k, (m, routing) in itertools.product((v.k_multiple, 5 * v.k_multiple),
                                             ((5, "uniform"), (200, "skewed"))):
        label = f"{variant} K={k} M={m} {routing}"
        weight = random_weight((e, k, n), v)
        weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
        packed = pack(weight, weight_scale, v)
        x = random_values((m, k), dtype)
        x_scale = random_scales((m,), dtype)
        group_list = group_list_of(routing_counts(routing, m, e), "count")
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)
        assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list, "count",
                           dispatched_intermediate(x, e, n, v), label, weight_bits=v.bits)


def own_kernels(schedule: str) -> list:
    """The built MoE kernels of the family's own `schedule` ("direct" or "wgmma")."""
    return [kernel for kernel in gemmgen.list_kernels()
            if kernel.spec.family == "moe" and kernel.spec.config.schedule == schedule]


# (K, group size (0: per channel), N, E, M, routing): a last chunk of 32 K, groups of one, two and
# four chunks, feature blocks cut by N (N = 264: two of 128 and 8 features), experts with many
# row tiles walked by one CTA's token slot (E = 2, M = 1000, skewed), empty experts.
WGMMA_CASES = [(160, 0, 264, 4, 300, "skewed"), (4096, 0, 512, 2, 1000, "skewed"),
               (512, 128, 264, 4, 300, "skewed"), (1024, 256, 512, 8, 64, "empty"),
               (2048, 512, 256, 2, 1000, "skewed"), (1536, 128, 384, 8, 7, "uniform"),
               # an odd number of 128-K chunks (the 7-8-slot rings wait for and queue chunks two
               # at a time: the last pair has one): per channel with a partial last chunk, per group
               (288, 0, 264, 4, 300, "skewed"), (384, 128, 264, 4, 300, "skewed")]


def check_forced_kernel(kernel, v, k: int, group: int, n: int, counts: list[int], label: str):
    """`kernel` forced by name on fresh data of K, N, per-group `group` (0: per channel) and the
    rows per expert `counts`, against the reference; the custom op into poisoned outputs agrees
    bit for bit."""
    e, m = len(counts), sum(counts)
    weight = random_weight((e, k, n), v)
    scale_shape = (e, k // group, n) if group else (e, n)
    weight_scale = random_weight_scales(scale_shape, v)
    packed = pack(weight, weight_scale, v)
    x = random_values((m, k), v.dtype)
    x_scale = random_scales((m,), v.dtype)
    group_list = group_list_of(counts, "count")
    q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                     kernel=kernel.name)
    assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list, "count",
                       kernel.spec.c, label, weight_bits=v.bits)
    out_q, out_scale = call_out_op(x, packed, x_scale, group_list, "count", kernel.name)
    torch.cuda.synchronize()
    assert not poison_left(out_q, out_scale), f"{label}: custom op left poison"
    assert same_bits(out_q, q) and same_bits(out_scale, q_scale), \
        f"{label}: the custom op and the public op differ"


def test_wgmma_kernels_group_sizes_and_partial_k():
    """Each built wgmma kernel (A8W4 on int8 wgmma), forced by name, on the cases of
    WGMMA_CASES its scales take (per channel: K with a last partial chunk; per group: groups of
    128 to 512), against the reference; the custom op into poisoned outputs agrees bit for bit."""
    kernels = own_kernels("wgmma")
    if not kernels:
        pytest.skip("no built wgmma kernel")
    for kernel in kernels:
        v = variant_of(kernel.spec)
        for k, group, n, e, m, routing in WGMMA_CASES:
            if bool(group) != v.per_group:
                continue
            check_forced_kernel(kernel, v, k, group, n, routing_counts(routing, m, e),
                                f"{kernel.name} K={k} group={group} N={n} E={e} M={m} {routing}")


def test_wgmma_row_tile_edges():
    """The row-tile walk at the edges of the kernel's tile of T rows: experts of T + 1 rows (a
    last tile of one row), T / 4, T / 2, T − 1, T, 2T + T / 4 + 3 and one row, an empty expert,
    per channel (K with a partial last chunk) and per group, against the reference."""
    kernels = own_kernels("wgmma")
    if not kernels:
        pytest.skip("no built wgmma kernel")
    for kernel in kernels:
        v = variant_of(kernel.spec)
        t = kernel.spec.config.tile[1]
        counts = [t + 1, t // 4, t // 4 + 1, 0, t // 2, t // 2 + 1, t - 1, 1, 2 * t + t // 4 + 3, t]
        k, group = (1024, 256) if v.per_group else (800, 0)
        check_forced_kernel(kernel, v, k, group, 264, counts,
                            f"{kernel.name} K={k} group={group} rows {counts}")


def unfused_kernels() -> list:
    """The built unfused MoE kernels (the ones whose SwiGLU pass reads C); skips when none is."""
    kernels = [kn for kn in gemmgen.list_kernels()
               if kn.spec.family == "moe" and not kn.spec.config.fused]
    if not kernels:
        pytest.skip(f"no built unfused {OP} kernel")
    return kernels


def check_row_cases(kernel, cases, k: int, e: int) -> Variant:
    """`kernel` forced on each (N, M, routing) of `cases` with K = k over e experts, against the
    reference (check_forced_kernel); returns the kernel's variant."""
    v = variant_of(kernel.spec)
    for n, m, routing in cases:
        check_forced_kernel(kernel, v, k, GROUP if v.per_group else 0, n,
                            routing_counts(routing, m, e), f"{kernel.name} N={n} M={m} {routing}")
    return v


# A row of S split over a cluster of CTAs (swiglu_quant.cuh: swiglu_row_parts), on a GPU of 132
# SMs (H100, H200; with fewer SMs the splits start at fewer rows): N = 8200 gives rows of 4100
# values, 1025 vectors of 4, shared by 4 CTAs (257, 257, 257, 254) up to M = 33 and by 2 up to
# M = 66 (one CTA a row from 67 on); N = 16400 (2050 vectors) by 8 (257 each, the last 251) up to
# M = 16. (N, M, routing); rows past the last group at M = 40.
SPLIT_ROW_CASES = [(8200, 1, "uniform"), (8200, 5, "skewed"), (8200, 40, "short"),
                   (8200, 100, "uniform"), (16400, 3, "uniform")]


def test_long_rows_split_over_a_cluster():
    """Each built unfused kernel (the ones whose SwiGLU pass reads C), forced by name, on few long
    rows (SPLIT_ROW_CASES: 4, 2, 1 and 8 parts a row), K = 256, against the reference
    (check_forced_kernel): every part of a row must quantize with the row's max, not its own.
    Then, with 4 and 8 parts, a NaN weight scale in the last column of act (S's last value,
    which only the row's last part reads) must give every grouped row a NaN q_scale (written by
    part 0) and rows past the groups 0."""
    k, e = 256, 4
    for kernel in unfused_kernels():
        v = check_row_cases(kernel, SPLIT_ROW_CASES, k, e)
        for n in sorted({n for n, _, _ in SPLIT_ROW_CASES}):
            weight = random_weight((e, k, n), v)
            weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
            nan_scale = weight_scale.clone()
            nan_scale[..., n // 2 - 1] = float("nan")
            m = 5
            counts = routing_counts("short", m, e)
            total = sum(counts)
            x = random_values((m, k), v.dtype)
            q, q_scale = gemmgen.grouped_matmul_swiglu_quant(
                x, pack(weight, nan_scale, v), None, random_scales((m,), v.dtype),
                group_list_of(counts, "count"), kernel=kernel.name)
            torch.cuda.synchronize()
            assert bool(q_scale[:total].isnan().all()), (
                f"{kernel.name} N={n}: a NaN in S's last value left q_scale "
                f"{q_scale[:total].tolist()}")
            assert bool((q_scale[total:] == 0).all() and (q[total:].float() == 0).all()), \
                f"{kernel.name} N={n}: rows past the groups must stay q = 0, q_scale = 0 with a NaN"


# Many short rows, several to a CTA of the SwiGLU pass (swiglu_quant.cuh: swiglu_quant_split_rows,
# Parts warps a row, 8 / Parts rows a CTA, up to 3 vectors of 4 values a lane; split_row_parts on a
# GPU of 132 SMs): (N, M, routing). N = 16 (two vectors a row, most lanes idle: 1 warp a row),
# 264 at 1000 rows (2 warps, 1 vector a lane), 776 (2 warps, 2 vectors), 520 at 450 rows (4 warps,
# 1 vector), Qwen3-30B-A3B's N (4 warps, 2 vectors), 2048 (4, 2), DeepSeek-V2-Lite's N (4 warps,
# 3 vectors), 720 at 5000 rows (1 warp, 3 vectors), 1200 at 3000 rows (2 warps, 3 vectors); at
# most a few rows (test_kernel_matches_reference) 8 warps a row; rows past the last group in CTAs
# that also hold grouped rows ("short").
MULTI_ROW_CASES = [(16, 3000, "uniform"), (264, 1000, "short"), (776, 700, "skewed"),
                   (520, 450, "skewed"), (1536, 2048, "uniform"), (2048, 1200, "short"),
                   (2816, 1536, "short"), (720, 5000, "skewed"), (1200, 3000, "short")]


def test_short_rows_several_to_a_cta():
    """Each built unfused kernel, forced by name, on MULTI_ROW_CASES (K = 256) against the
    reference (check_forced_kernel: poisoned outputs, rows past the groups 0): every row of a CTA
    that holds several must quantize with its own max. Then a NaN weight scale of one expert, whose
    rows share CTAs with the other experts' rows, reaches that expert's rows only."""
    k = 256
    for kernel in unfused_kernels():
        v = check_row_cases(kernel, MULTI_ROW_CASES, k, 4)
        counts, n = [500, 400, 300], 512
        m = sum(counts)
        weight = random_weight((3, k, n), v)
        weight_scale = random_weight_scales(v.scale_shape(3, k, n), v)
        x = random_values((m, k), v.dtype)
        x_scale = random_scales((m,), v.dtype)
        group_list = group_list_of(counts, "count")
        _, clean = gemmgen.grouped_matmul_swiglu_quant(x, pack(weight, weight_scale, v), None,
                                                       x_scale, group_list, kernel=kernel.name)
        poisoned = weight_scale.clone()
        poisoned[1, ..., 7] = float("nan")
        _, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, pack(weight, poisoned, v), None,
                                                         x_scale, group_list, kernel=kernel.name)
        torch.cuda.synchronize()
        assert bool(q_scale[500:900].isnan().all()), f"{kernel.name}: expert 1's rows not all NaN"
        rest = torch.cat([torch.arange(0, 500), torch.arange(900, m)]).to(DEVICE)
        assert same_bits(q_scale[rest], clean[rest]), f"{kernel.name}: other experts' rows changed"


# ------------------------------------------------------------- 3. A8W4 forms, assist matrix

def test_a8w4_weight_forms_and_assist_matrix():
    """A8W4 through dispatch: a MoeWeight (weight_bits None or 4), int8 [E, K, N] / a list of
    E [K, N] with weight_bits=4 (packed on the call), and the custom op on the uint8 packed
    tensor all give the same bits; weight_assist_matrix = 8·weight_scale·Σ_k W (which the
    reference validates exactly) changes nothing, nor does one with garbage values (the op
    checks its shape only)."""
    v = require_variant("a8w4")
    m, e, k, n = 300, 8, 256, 512
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)
    assert packed.weight.dtype == torch.uint8 and tuple(packed.weight.shape) == (e, n, k // 2)
    assert torch.equal(packed.logical_weight(), weight)
    x = random_values((m, k), torch.int8)
    x_scale = random_scales((m,), torch.int8)
    group_list = group_list_of(routing_counts("short", m, e), "count")
    wam = assist_matrix(weight, weight_scale)
    garbage = torch.randn((e, n), device=DEVICE) * 1e6

    # the reference validates the assist matrix's values (exactly): this one is Ascend's
    reference.grouped_matmul_dequant(x, weight, weight_scale, x_scale, group_list,
                                     weight_bits=4, weight_assist_matrix=wam)
    q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)
    assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list, "count",
                       dispatched_intermediate(x, e, n, v), "a8w4 packed", weight_bits=4)

    forms = {
        "packed, weight_bits=4": (packed, None, {"weight_bits": 4}),
        "int8 [E, K, N], weight_bits=4": (weight, weight_scale, {"weight_bits": 4}),
        "list of E [K, N], weight_bits=4": (list(weight.unbind(0)), list(weight_scale.unbind(0)),
                                            {"weight_bits": 4}),
    }
    for label, (w_arg, ws_arg, extra) in forms.items():
        for assist in (None, wam, garbage):
            got = gemmgen.grouped_matmul_swiglu_quant(x, w_arg, ws_arg, x_scale, group_list,
                                                      weight_assist_matrix=assist, **extra)
            what = "no" if assist is None else ("garbage" if assist is garbage else "Ascend's")
            assert same_bits(got[0], q) and same_bits(got[1], q_scale), \
                f"{label} with {what} weight_assist_matrix differs from the packed result"
    got = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                              weight_assist_matrix=wam)
    assert same_bits(got[0], q) and same_bits(got[1], q_scale)
    out_q, out_scale = call_out_op(x, packed, x_scale, group_list)
    torch.cuda.synchronize()
    assert same_bits(out_q, q) and same_bits(out_scale, q_scale), "custom op (weight_bits=4)"


# ------------------------------------------------------------------------- 4. determinism

@variant_params()
def test_bit_identical_runs(variant):
    """The same call three times gives the same bits (the fused kernels' atomic row max is
    order-independent; everything else has one writer)."""
    v = require_variant(variant)
    dtype = v.dtype
    m, e, k, n = 1024, 64, 512, 512
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)
    x = random_values((m, k), dtype)
    x_scale = random_scales((m,), dtype)
    group_list = group_list_of(routing_counts("skewed", m, e), "count")
    runs = [gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)
            for _ in range(3)]
    for q, q_scale in runs[1:]:
        assert same_bits(q, runs[0][0]) and same_bits(q_scale, runs[0][1])
    assert_quant_close(*runs[0], x, weight, weight_scale, x_scale, group_list, "count",
                       dispatched_intermediate(x, e, n, v), weight_bits=v.bits)


# ------------------------------------------------------------------------- 5. CUDA graphs

@variant_params()
def test_cuda_graph_capture_with_changing_group_lists(variant):
    """Capture the op with the default `check` (which must not read the group list while
    capturing), then replay with new x values and new group lists written in place. (A8W4 is
    captured with a packed MoeWeight: an unpacked int8 weight with weight_bits=4 is packed on
    every call, and that packing reads the values back, which capture forbids.)"""
    v = require_variant(variant)
    dtype = v.dtype
    m, e, k, n = 200, 8, 256, 512
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)
    x = random_values((m, k), dtype)
    x_scale = random_scales((m,), dtype)
    group_list = group_list_of(routing_counts("uniform", m, e), "count")

    def step():
        return gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, q_scale = step()

    intermediate = dispatched_intermediate(x, e, n, v)
    for replay, routing in enumerate(["skewed", "empty", "short", "one", "uniform"]):
        x.copy_(random_values((m, k), dtype))
        x_scale.copy_(random_scales((m,), dtype))
        group_list.copy_(group_list_of(routing_counts(routing, m, e), "count"))
        q.view(torch.uint8).fill_(POISON[dtype])
        q_scale.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_quant_close(q.clone(), q_scale.clone(), x, weight, weight_scale, x_scale,
                           group_list, "count", intermediate, f"replay {replay} ({routing})",
                           weight_bits=v.bits)


# --------------------------------------------------------------------- 6. bad group lists

BAD_LISTS = {   # M = 64, E = 8
    "negative-count": ("count", [10, -5, 20, 3, 0, 7, 2, 1]),
    "count-total-over-m": ("count", [20, 20, 0, 20, 20, 9, 0, 4]),
    "huge-count": ("count", [3, 2**62, 5, 0, 1, 1, 1, 1]),
    "negative-cumsum": ("cumsum", [-3, 10, 12, 20, 30, 31, 40, 50]),
    "decreasing-cumsum": ("cumsum", [10, 30, 20, 40, 40, 50, 45, 60]),
    "cumsum-over-m": ("cumsum", [10, 20, 70, 80, 90, 100, 110, 120]),
    "huge-cumsum": ("cumsum", [5, 2**62, 7, 2**63 - 1, 64, 64, 64, 64]),
}


@pytest.mark.parametrize("case", list(BAD_LISTS))
@variant_params()
def test_bad_group_list_never_out_of_bounds(variant, case):
    """check=False: a bad list is clamped on the device (no CUDA error, nothing out of bounds)
    and the result is that of the clamped list; check=True (the default): ValueError."""
    v = require_variant(variant)
    dtype = v.dtype
    m, e, k, n = 64, 8, 256, 512
    group_list_type, values = BAD_LISTS[case]
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)
    x = random_values((m, k), dtype)
    x_scale = random_scales((m,), dtype)
    group_list = torch.tensor(values, dtype=torch.int64, device=DEVICE)

    q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                     group_list_type, check=False)
    torch.cuda.synchronize()
    counts = valid_counts(group_list, group_list_type, m)
    intermediate = dispatched_intermediate(x, e, n, v)
    assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, counts, "count",
                       intermediate, case, weight_bits=v.bits)
    out_q, out_scale = call_out_op(x, packed, x_scale, group_list, group_list_type)
    torch.cuda.synchronize()
    assert same_bits(out_q, q) and same_bits(out_scale, q_scale)

    for check in ({}, {"check": True}):
        with pytest.raises(ValueError, match="group_list"):
            gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                group_list_type, **check)


# ---------------------------------------------------------------------- 7. torch.compile

@variant_params()
def test_torch_compile_fullgraph(variant):
    """torch.compile(fullgraph=True) through the custom op: bit for bit the eager result (A8W4:
    a packed MoeWeight, and the assist matrix passed through the compiled call)."""
    v = require_variant(variant)
    dtype = v.dtype
    m, e, k, n = 96, 8, 256, 512
    torch._dynamo.reset()
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)
    extra = {"weight_assist_matrix": assist_matrix(weight, weight_scale)} if v.bits == 4 else {}

    def layer(x, x_scale, group_list):
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                         check=False, **extra)
        return q, q_scale * 2.0   # an elementwise op after the custom op (exact)

    compiled = torch.compile(layer, fullgraph=True)
    for routing in ("skewed", "short"):
        x = random_values((m, k), dtype)
        x_scale = random_scales((m,), dtype)
        group_list = group_list_of(routing_counts(routing, m, e), "count")
        eager = layer(x, x_scale, group_list)
        got = compiled(x, x_scale, group_list)
        assert same_bits(got[0], eager[0]) and same_bits(got[1], eager[1]), routing
        assert_quant_close(got[0], got[1] / 2.0, x, weight, weight_scale, x_scale, group_list,
                           "count", dispatched_intermediate(x, e, n, v), f"compiled {routing}",
                           weight_bits=v.bits)


def test_torch_compile_default_check_and_bad_list():
    """check left at its default under torch.compile(fullgraph=True): the op decides at run time
    (not when dynamo traces), so a bad group list still raises from the compiled call."""
    v = require_variant("int8")
    m, e, k, n = 64, 4, 256, 256
    torch._dynamo.reset()
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)

    def layer(x, x_scale, group_list):
        return gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)

    compiled = torch.compile(layer, fullgraph=True)
    x = random_values((m, k), v.dtype)
    x_scale = random_scales((m,), v.dtype)
    good = group_list_of(routing_counts("skewed", m, e), "count")
    eager = layer(x, x_scale, good)
    got = compiled(x, x_scale, good)
    assert same_bits(got[0], eager[0]) and same_bits(got[1], eager[1])
    bad = torch.tensor([m, 1, 0, 0], dtype=torch.int64, device="cuda")   # m + 1 rows
    with pytest.raises(ValueError, match="group_list"):
        compiled(x, x_scale, bad)


def test_non_finite_rows_get_a_non_finite_scale():
    """A NaN or an infinity reaching S makes that row's q_scale NaN / +inf, never a finite value
    that would pass for a real result; other rows are untouched."""
    v = require_variant("int8")
    m, e, k, n = 8, 2, 256, 256
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)
    x = random_values((m, k), v.dtype)
    x_scale = random_scales((m,), v.dtype)
    group_list = group_list_of([4, 4], "count")
    _, clean = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)
    x_scale[1] = float("nan")
    x_scale[5] = float("inf")
    _, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)
    assert torch.isnan(q_scale[1]) and not torch.isfinite(q_scale[5])
    rest = [i for i in range(m) if i not in (1, 5)]
    assert same_bits(q_scale[rest], clean[rest])


@pytest.mark.parametrize("kind", ["unfused", "fused"])
def test_non_finite_weight_scale_reaches_its_expert_only(kind):
    """A NaN (or inf) in weight_scale[e, j] makes column j of expert e's C non-finite, so every
    row of expert e gets a non-finite q_scale; the other experts' rows are untouched."""
    v = require_variant("int8")
    kernels = [k for k in gemmgen.list_kernels() if k.spec.family == "moe" and (k.spec.x, k.spec.w) == ("int8", "int8")
               and k.spec.config.fused == (kind == "fused") and k.spec.c == "fp32"]
    if not kernels:
        pytest.skip(f"no built {kind} fp32 int8 kernel")
    m, e, k, n = 12, 3, 256, 512
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    x = random_values((m, k), v.dtype)
    x_scale = random_scales((m,), v.dtype)
    group_list = group_list_of([5, 4, 3], "count")
    for kernel in kernels:
        _, clean = gemmgen.grouped_matmul_swiglu_quant(x, pack(weight, weight_scale, v), None, x_scale,
                                                       group_list, kernel=kernel.name)
        for bad in (float("nan"), float("inf")):
            poisoned = weight_scale.clone()
            poisoned[1, 7 if bad != bad else n // 2 + 3] = bad  # an act column / a gate column
            _, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, pack(weight, poisoned, v), None,
                                                             x_scale, group_list, kernel=kernel.name)
            assert not torch.isfinite(q_scale[5:9]).any(), f"{kernel.name}: expert 1's rows stayed finite"
            if bad != bad:
                assert torch.isnan(q_scale[5:9]).all(), kernel.name
            rest = [0, 1, 2, 3, 4, 9, 10, 11]
            assert same_bits(q_scale[rest], clean[rest]), f"{kernel.name}: other experts changed"


# ------------------------------------------------------------------ 7. fused = unfused

def fused_pairs(s_type: str = "fp32") -> list[tuple]:
    """(fused CUTLASS kernel storing S in `s_type`, an fp32 CUTLASS kernel of the same variant and
    accumulation) for every such built fused kernel (fp8's fast and promoted accumulation round
    differently, and the direct kernel sums in another order). For an fp32 S the partner is
    unfused; for a bf16 S, the fused kernel of the same tile and schedule storing S in fp32 (the
    same C and S before S's rounding). The fused wgmma kernels: fused_wgmma_pairs."""
    kernels = [k for k in gemmgen.list_kernels() if k.spec.family == "moe"]
    pairs = []
    for fused in (k for k in kernels if k.spec.config.fused and k.spec.c == s_type
                  and not k.spec.config.is_own):
        cfg = fused.spec.config
        plain = [k for k in kernels if k.spec.c == "fp32"
                 and (k.spec.x, k.spec.w) == (fused.spec.x, fused.spec.w)
                 and k.spec.config.fast_accum == cfg.fast_accum
                 and not k.spec.config.is_own  # CUTLASS's mainloops, as the fused kernels
                 and (not k.spec.config.fused if s_type == "fp32" else
                      k.spec.config.fused and (k.spec.config.tile, k.spec.config.schedule,
                                               k.spec.config.cluster)
                      == (cfg.tile, cfg.schedule, cfg.cluster))]
        if plain:
            pairs.append((fused, plain[0]))
    return pairs


# (E, M, K, N, routing): N not a multiple of any tile N (partial last N tiles: 520 = 2·256 + 8,
# 1416 = 5·256 + 136), K not one of the tile K, many M tiles, rows past the last group, groups
# ending inside an M tile; the sixth case gives every persistent CTA several M tiles of 8 groups.
# The last two have long rows: the unfused pass's swiglu_quant (one CTA a row; 2 CTAs a row at 40
# rows) and, on a GPU of 132 SMs, the fused quantize pass 8 warps a row of 1025 vectors (shares of
# 129, rows past the groups among them) and 32 warps a row of 2050 (shares of 65). S stays in L2
# for the quantize pass up to a third of L2 (20 MiB on an H200): in the last case it does not,
# for either S type (24.6 MB in bf16), in the sixth only in bf16 (37 MB in fp32, 18.5 in bf16).
FUSED_CASES = [(8, 300, 256, 520, "skewed"), (4, 2048, 272, 1416, "short"),
               (1, 3000, 128, 2064, "uniform"), (16, 33, 1024, 256, "empty"), (64, 1000, 512, 768, "skewed"),
               (8, 9000, 128, 2056, "short"), (4, 600, 128, 8200, "short"),
               (2, 40, 256, 16400, "skewed"), (4, 6000, 128, 4104, "short")]


def fused_cases(pairs: list[tuple]):
    """For each (fused kernel, partner) and FUSED_CASES case, fresh random data of the fused
    kernel's variant run through both (the fused one twice, into poisoned outputs; checked: no
    poison left, bit-identical runs). Yields (variant, label, the reference's arguments after
    q and q_scale, the fused kernel's (q, q_scale), the partner's)."""
    for (fused, partner), (e, m, k, n, routing) in itertools.product(pairs, FUSED_CASES):
        v = variant_of(fused.spec)
        label = f"{fused.name} vs {partner.name} E={e} M={m} K={k} N={n} {routing}"
        weight = random_weight((e, k, n), v)
        weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
        packed = pack(weight, weight_scale, v)
        x = random_values((m, k), v.dtype)
        x_scale = random_scales((m,), v.dtype)
        group_list = group_list_of(routing_counts(routing, m, e), "count")
        got = call_out_op(x, packed, x_scale, group_list, "count", fused.name)
        again = call_out_op(x, packed, x_scale, group_list, "count", fused.name)
        other = call_out_op(x, packed, x_scale, group_list, "count", partner.name)
        torch.cuda.synchronize()
        assert not poison_left(*got), f"{label}: the fused kernel left poison"
        assert same_bits(got[0], again[0]) and same_bits(got[1], again[1]), f"{label}: not deterministic"
        yield v, label, (x, weight, weight_scale, x_scale, group_list, "count"), got, other


def test_fused_kernels_equal_unfused_bit_for_bit():
    """SwiGLU in the epilogue (S stored in fp32, the row max reduced across N tiles by atomics,
    then a quant pass) gives the fp32 unfused kernels' q and q_scale bit for bit: same C, same S,
    same max. Also against the reference, into poisoned outputs, and run twice (the atomics)."""
    pairs = fused_pairs()
    if not pairs:
        pytest.skip("no built fused kernel with an unfused fp32 kernel of its variant")
    for v, label, reference_args, got, want in fused_cases(pairs):
        assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), \
            f"{label}: fused and unfused differ in {int((got[0].view(torch.uint8) != want[0].view(torch.uint8)).sum())} q elements"
        assert_quant_close(*got, *reference_args, "fp32", label, weight_bits=v.bits)


def test_fused_kernels_with_bf16_s():
    """A fused kernel storing S in bf16 (half the bytes its epilogue writes and the quant pass
    reads): q and q_scale within the bf16-intermediate bounds of the reference, into poisoned
    outputs, deterministic; and against the fused kernel of the same tile storing S in fp32 (the
    same C and S before the rounding): the row max is the rounded S's (rounding keeps order), so
    each q_scale lies within 2^-8 relative (half a bf16 step, 8 significant bits) of the fp32
    kernel's, and at most the fraction of q MAX_DIFFERING allows for a bf16 intermediate differs
    from its q."""
    pairs = fused_pairs("bf16")
    if not pairs:
        pytest.skip("no built fused kernel storing S in bf16 beside one storing it in fp32")
    for v, label, reference_args, got, fp32 in fused_cases(pairs):
        assert_quant_close(*got, *reference_args, "bf16", label, weight_bits=v.bits)
        scale, scale32 = got[1].double(), fp32[1].double()
        assert ((scale - scale32).abs() <= (2.0**-8 + 2.0**-22) * scale32).all(), \
            f"{label}: q_scale further than half a bf16 step from the fp32-S kernel's"
        differing = (got[0].view(torch.uint8) != fp32[0].view(torch.uint8)).float().mean().item()
        limit = MAX_DIFFERING[("e4m3" if v.dtype == FP8 else "int8", "bf16")]
        assert differing <= limit, f"{label}: {differing:.1%} of q differ from the fp32-S kernel's"


def fused_wgmma_pairs() -> list[tuple]:
    """(fused wgmma kernel, an unfused wgmma kernel of its variant: of the same tile and copy
    where one is built) for every built fused wgmma kernel (A8W4). Every wgmma kernel of a
    variant sums and scales in the same order (per channel the exact int32 sum, per group the
    groups' promotions in K order), so their C, and S, agree bit for bit."""
    kernels = own_kernels("wgmma")
    pairs = []
    for fused in (k for k in kernels if k.spec.config.fused):
        cfg = fused.spec.config
        plain = sorted((k for k in kernels if not k.spec.config.fused
                        and variant_of(k.spec) == variant_of(fused.spec)),
                       key=lambda k: (k.spec.config.tile, k.spec.config.copy) != (cfg.tile, cfg.copy))
        if plain:
            pairs.append((fused, plain[0]))
    return pairs


def test_fused_wgmma_kernels_equal_unfused_bit_for_bit():
    """The wgmma kernel's fused epilogue (act and gate paired across lanes, S stored in fp32, each
    token's max by shared then global atomics, the quantize pass) gives its unfused twin's q and
    q_scale bit for bit, on WGMMA_CASES (partial chunks, groups of 128-512, feature blocks cut by
    N, empty experts, rows past the last group) and row counts at the tile's edges; into poisoned
    outputs, run twice (the atomics), and against the reference."""
    pairs = fused_wgmma_pairs()
    if not pairs:
        pytest.skip("no built fused wgmma kernel with an unfused wgmma kernel of its variant")
    for fused, partner in pairs:
        v = variant_of(fused.spec)
        t = fused.spec.config.tile[1]
        cases = [(k, group, n, routing_counts(routing, m, e), f"E={e} M={m} {routing}")
                 for k, group, n, e, m, routing in WGMMA_CASES if bool(group) == v.per_group]
        edges = [t + 1, t // 4, 0, t - 1, 1, 2 * t + t // 4 + 3, t]
        cases.append(((1024, 256, 264, edges, f"rows {edges}") if v.per_group
                      else (800, 0, 264, edges, f"rows {edges}")))
        for k, group, n, counts, what in cases:
            label = f"{fused.name} vs {partner.name} K={k} group={group} N={n} {what}"
            e, m = len(counts), sum(counts) + 5  # 5 rows past the last group
            weight = random_weight((e, k, n), v)
            weight_scale = random_weight_scales((e, k // group, n) if group else (e, n), v)
            packed = pack(weight, weight_scale, v)
            x = random_values((m, k), v.dtype)
            x_scale = random_scales((m,), v.dtype)
            group_list = group_list_of(counts, "count")
            got = call_out_op(x, packed, x_scale, group_list, "count", fused.name)
            again = call_out_op(x, packed, x_scale, group_list, "count", fused.name)
            want = call_out_op(x, packed, x_scale, group_list, "count", partner.name)
            torch.cuda.synchronize()
            assert not poison_left(*got), f"{label}: the fused kernel left poison"
            assert same_bits(got[0], again[0]) and same_bits(got[1], again[1]), \
                f"{label}: not deterministic"
            assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), \
                f"{label}: fused and unfused differ in {int((got[0] != want[0]).sum())} q elements"
            assert_quant_close(*got, x, weight, weight_scale, x_scale, group_list, "count",
                               "fp32", label, weight_bits=v.bits)


def test_fused_non_finite_rows():
    """The fused kernels' row max keeps a NaN (its bits exceed +inf's) and an infinity, S in
    fp32 or bf16; the fused wgmma kernels' too."""
    pairs = fused_pairs() + fused_pairs("bf16") + fused_wgmma_pairs()
    if not pairs:
        pytest.skip("no built fused kernel")
    for fused, _ in pairs:
        v = variant_of(fused.spec)
        m, e, k, n = 8, 2, 256, 512
        packed = pack(random_weight((e, k, n), v), random_weight_scales(v.scale_shape(e, k, n), v), v)
        x = random_values((m, k), v.dtype)
        x_scale = random_scales((m,), v.dtype)
        group_list = group_list_of([4, 4], "count")
        _, clean = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                       kernel=fused.name)
        x_scale[1], x_scale[5] = float("nan"), float("inf")
        _, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                         kernel=fused.name)
        assert torch.isnan(q_scale[1]) and not torch.isfinite(q_scale[5]), fused.name
        rest = [i for i in range(m) if i not in (1, 5)]
        assert same_bits(q_scale[rest], clean[rest]), fused.name


# ---------------------------------------------------------------------- 8. argument errors

def error_pattern(name: str, where: str = OP) -> str:
    return rf"^gemmgen\.{where}: argument '{name}': expected "


def test_argument_errors_on_gpu():
    """ValueError "gemmgen.grouped_matmul_swiglu_quant: argument '<name>': expected ...", raised
    before any kernel is looked up (so no built kernel is needed)."""
    m, e, k, n = 4, 2, 256, 64
    x = random_values((m, k), torch.int8)
    weight = random_values((e, k, n), torch.int8)
    weight_scale = random_scales((e, n), torch.int8)
    x_scale = random_scales((m,), torch.int8)
    group_list = torch.tensor([1, 2], dtype=torch.int64, device=DEVICE)
    packed = gemmgen.pack_moe_weights(weight, weight_scale)
    good = dict(x=x, weight=weight, weight_scale=weight_scale, x_scale=x_scale,
                group_list=group_list)
    cases = [
        ("x", dict(x=random_values((m, 200), torch.int8),
                   weight=random_values((e, 200, n), torch.int8))),
        ("weight", dict(weight=weight.to(torch.float16))),
        ("weight", dict(weight=random_values((e, k, n), FP8))),
        ("weight_scale", dict(weight_scale=random_scales((e, n + 1), torch.int8))),
        ("weight_scale", dict(weight=packed)),          # a MoeWeight holds its own scales
        ("x_scale", dict(x_scale=random_scales((m + 1,), torch.int8))),
        ("group_list", dict(group_list=group_list.to(torch.int32))),
        ("group_list", dict(group_list=torch.tensor([1, 2, 0], dtype=torch.int64,
                                                    device=DEVICE))),
    ]
    for name, change in cases:
        args = {**good, **change}
        with pytest.raises(ValueError, match=error_pattern(name)):
            gemmgen.grouped_matmul_swiglu_quant(args["x"], args["weight"], args["weight_scale"],
                                                args["x_scale"], args["group_list"])
    with pytest.raises(ValueError, match=error_pattern("group_list_type")):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list, "counts")
    with pytest.raises(ValueError, match=error_pattern("kernel")):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                            kernel="no_such_kernel")
    q, q_scale = poisoned_outputs(m, n, torch.int8)
    with pytest.raises(ValueError, match=error_pattern("weight_bits")):
        torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(q, q_scale, x, packed.weight,
                                                          packed.scale, x_scale, group_list,
                                                          "count", 3, False, None)


def test_a8w4_argument_errors_on_gpu():
    """A8W4's argument errors, raised before any kernel is looked up: per-group scales of an
    unsupported group size or with 8-bit weights, an assist matrix with 8-bit weights or of the wrong shape, int4 weights with e4m3 x,
    K not a multiple of 32, weight_bits disagreeing with a MoeWeight or out of range, values
    outside -8..7. Forcing a kernel of the other weight type is checked when one is built."""
    m, e, k, n = 4, 2, 256, 64
    v = VARIANTS["a8w4"]
    x = random_values((m, k), torch.int8)
    x_scale = random_scales((m,), torch.int8)
    group_list = torch.tensor([1, 2], dtype=torch.int64, device=DEVICE)
    weight = random_weight((e, k, n), v)
    weight_scale = random_weight_scales(v.scale_shape(e, k, n), v)
    packed = pack(weight, weight_scale, v)
    wam = assist_matrix(weight, weight_scale)
    per_group = random_weight_scales((e, k // 64, n), v)

    def op(x=x, w=weight, ws=weight_scale, **kwargs):
        return gemmgen.grouped_matmul_swiglu_quant(x, w, ws, x_scale, group_list, **kwargs)

    # per-group [E, K/group, N] scales: group sizes multiples of 128 that divide K; this one's is
    # 64 (errors of the op's per-call packing name the op; pack_moe_weights names itself).
    refused = r": argument 'weight_scale': expected .*group sizes that are multiples of 128"
    with pytest.raises(ValueError, match=rf"^gemmgen\.{OP}{refused}"):
        op(ws=per_group, weight_bits=4)
    with pytest.raises(ValueError, match=rf"^gemmgen\.pack_moe_weights{refused}"):
        gemmgen.pack_moe_weights(weight, per_group, weight_bits=4)
    with pytest.raises(ValueError, match=rf"^gemmgen\.{OP}{refused}"):
        op(w=gemmgen.MoeWeight(packed.weight, per_group, bits=4), ws=None)
    with pytest.raises(ValueError, match=rf"^gemmgen\.{OP}{refused}"):
        op(ws=per_group)  # weight_bits None with per-group scales and int8 x: A8W4, as above
    with pytest.raises(ValueError, match=error_pattern("weight_scale") + "per-channel scales"):
        op(ws=per_group, weight_bits=8)                  # weight_bits 8: [E, N] only

    # the assist matrix: A8W4's only, [E, N] float32
    int8_weight = random_values((e, k, n), torch.int8)
    int8_scale = random_scales((e, n), torch.int8)
    with pytest.raises(ValueError, match=error_pattern("weight_assist_matrix")):
        op(w=int8_weight, ws=int8_scale, weight_assist_matrix=wam)
    with pytest.raises(ValueError, match=error_pattern("weight_assist_matrix")):
        op(w=gemmgen.pack_moe_weights(int8_weight, int8_scale), ws=None,
           weight_assist_matrix=wam)
    with pytest.raises(ValueError, match=error_pattern("weight_assist_matrix")):
        op(w=weight, ws=weight_scale, weight_assist_matrix=wam, weight_bits=8)
    for bad in (wam[:, : n // 2], wam.unsqueeze(1), wam.double(), wam.cpu()):
        with pytest.raises(ValueError, match=error_pattern("weight_assist_matrix")):
            op(w=packed, ws=None, weight_assist_matrix=bad)
        with pytest.raises(ValueError, match=error_pattern("weight_assist_matrix")):
            op(weight_bits=4, weight_assist_matrix=bad)

    # weight_bits=4 with e4m3 x: int4 weights take int8 activations. The op names 'x' (its
    # argument check); an e4m3 weight with weight_bits=4 is refused by the per-call packing
    # (its errors name the op too).
    x8 = random_values((m, k), FP8)
    takes_int8 = re.escape("a torch.int8 tensor: A8W4 (int4 weights) takes int8 activations")
    with pytest.raises(ValueError, match=error_pattern("x") + takes_int8):
        op(x=x8, weight_bits=4)
    with pytest.raises(ValueError, match=error_pattern("x") + takes_int8):
        op(x=x8, w=packed, ws=None)
    with pytest.raises(ValueError, match=error_pattern("weight")):
        op(x=x8, w=random_values((e, k, n), FP8), ws=random_scales((e, n), FP8),
           weight_bits=4)

    # K = 48: a multiple of 16 (A8W8's granule) but not of 32
    k48 = 48
    weight48 = random_weight((e, k48, n), v)
    x48 = random_values((m, k48), torch.int8)
    for w_arg, ws_arg, extra in ((weight48, weight_scale, {"weight_bits": 4}),
                                 (pack(weight48, weight_scale, v), None, {})):
        with pytest.raises(ValueError, match=error_pattern("x") + "K a positive multiple of 32"):
            op(x=x48, w=w_arg, ws=ws_arg, **extra)

    # weight_bits: a MoeWeight's own, 8 or 4; int4 values -8..7
    with pytest.raises(ValueError, match=error_pattern("weight_bits")):
        op(w=packed, ws=None, weight_bits=8)
    with pytest.raises(ValueError, match=error_pattern("weight_bits")):
        op(weight_bits=2)
    with pytest.raises(ValueError, match=error_pattern("weight") + r"int4 values -8\.\.7"):
        op(w=weight * 2, weight_bits=4)
    # the custom op: a uint8 [E, N, K/2] weight with weight_bits=4, x's dtype [E, N, K] with 8
    q, q_scale = poisoned_outputs(m, n, torch.int8)
    with pytest.raises(ValueError, match=error_pattern("weight")):
        torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(
            q, q_scale, x, int8_weight.transpose(1, 2).contiguous(), int8_scale, x_scale,
            group_list, "count", 4, False, None)
    with pytest.raises(ValueError, match=error_pattern("weight")):
        torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(
            q, q_scale, x, packed.weight, packed.scale, x_scale, group_list, "count", 8, False,
            None)

    # a forced kernel of the other weight type (when built)
    built = built_variants()
    for kernels, w_arg, extra in ((built.get("a8w4"), gemmgen.pack_moe_weights(
            int8_weight, int8_scale), {}), (built.get("int8"), packed, {})):
        if kernels:
            with pytest.raises(ValueError, match=error_pattern("kernel")):
                op(w=w_arg, ws=None, kernel=kernels[0].name, **extra)


def test_tune_measures_moe_layers_and_its_winners_are_correct(tmp_path, moe_dispatch_library):
    """`gemmgen tune` on the MoE library, end to end on a small expert layer (E = 8, top-2):
    every int8-activation class measured at 2 and 128 rows (1 and 64 tokens), a table of the layer
    with buckets over rows, each bucket's kernel the fastest within the tie tolerance of
    the store's times; each winner, forced, matches the reference on fresh data."""
    from gemmgen.tuning import tune as tuning
    from gemmgen.tuning.measure import Candidate, Store
    from gemmgen.tuning.shapes import WeightShape
    from gemmgen.tuning.table import load_table

    library = moe_dispatch_library
    if not any(k.spec.x == "int8" for k in library.kernels.values()):
        pytest.skip(f"library {library.name} has no int8-activation kernel to tune")
    layer = WeightShape("w13", 1024, 512, "test", "test:1", experts=8, top_k=2)
    grid = (2, 128)
    options = tuning.TuneOptions(shapes=[layer], m_grid=grid, library=library.name,
                                 dtypes=("int8",), fresh=True, out=str(tmp_path / "moe.tuned.yaml"))
    table = load_table(tuning.tune(options), known_kernels=library.kernels)
    assert table.metadata["kernel_set"] == library.kernel_set
    store = Store(tuning.store_path(library, options))
    classes = tuning.classes_of(library, options)
    assert set(table.classes) == set(classes) and all(c[1] == "int8" for c in classes)
    for key, ctable in table.classes.items():
        times = store.times(key, {(layer.n, layer.k)})
        for m in grid:
            hit = ctable.lookup(m, layer.n, layer.k)
            assert hit.exact_shape
            row = times[(layer.n, layer.k, m)]
            fastest = min(us for us in row.values() if us is not None)
            chosen = row[Candidate.of(library.kernels[hit.bucket.kernel])]
            assert chosen <= fastest * (1 + table.metadata["tie_tolerance"]) + 1e-9, (key, m)
            kernel = library.kernels[hit.bucket.kernel]
            check_forced_kernel(kernel, variant_of(kernel.spec), layer.k,
                                GROUP if key[3] == "group" else 0, layer.n,
                                [m // layer.experts + 1] * layer.experts,
                                f"tuned {kernel.name} at m={m}")
