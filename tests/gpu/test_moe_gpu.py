"""GPU tests of the MoE family, `gemmgen.grouped_matmul_swiglu_quant` (grouped GEMM per expert +
dequant + SwiGLU + dynamic per-token quantization, int8 and fp8 e4m3, sm90a).

What is tested, each against `gemmgen.reference` on fresh random data (seeded per test by
conftest.py, so a failure reproduces):
  1. every built kernel, forced by name: M in {1, 7, 64, 300}, uniform / skewed routing, an
     empty expert, rows past the last group; through the public op and through the custom op
     `torch.ops.gemmgen.grouped_matmul_swiglu_quant_out` writing into poisoned outputs (q: -128
     for int8, NaN bits for e4m3 — values the op can never produce, as it clamps to ±QMAX;
     q_scale: NaN), so an element the kernel never wrote is caught;
  2. the dispatch path: E in {1, 8, 64, 128}, M from 1 to 8192, routings uniform / Zipf-skewed /
     empty experts / all tokens on one expert / fewer rows than M, "count" and "cumsum" group
     lists, and every weight form (stacked [E, K, N], a list of E [K, N], a packed `MoeWeight`,
     a K-major view of a contiguous [E, N, K]);
  3. determinism (three runs bit for bit), CUDA graph capture and replay with new group lists
     (the default `check` must turn itself off while capturing), bad group lists with
     check=False (clamped on the device: no out-of-bounds access, the result of the clamped
     list) and check=True (ValueError), torch.compile(fullgraph=True), argument errors.

Comparison (`assert_quant_close`): the reference C = (X·W) ⊙ x_scale ⊙ weight_scale is exact
(float64, rounded once to float32); the kernel's C differs from it by
  * fp32 intermediate: a few float32 roundings (the int32 accumulator of int8 is exact), < 2^-21
    relative;
  * bf16 intermediate: the rounding to bf16, up to 2^-8 relative (8 significant bits);
  * fp8 inputs, either intermediate: CUTLASS's FP8 fast accumulation (no promotion to float32
    registers). Measured on an H100 (torch._scaled_mm with use_fast_accum=True, ~N(0, 1) e4m3
    data, K = 256..4096) its error is at most ~2^-11 of s_x·s_w·Σ_k|x·w|, whatever K; the
    bound used is 2^-9 of that magnitude.
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

import pytest
import torch

import gemmgen
import gemmgen.families.moe.ops  # noqa: F401  (registers the custom op *_out)
from gemmgen import reference
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

def built_elements() -> dict[str, list]:
    """The built kernels of the family, by element type name."""
    found: dict[str, list] = {}
    for kernel in gemmgen.list_kernels():
        if kernel.spec.family == "moe":
            found.setdefault(kernel.spec.x, []).append(kernel)
    return found


def require_element(name: str) -> torch.dtype:
    if name not in built_elements():
        pytest.skip(f"no built {OP} kernel for {name}")
    return ELEMENTS[name]


def dispatched_intermediate(x: torch.Tensor, e: int, n: int) -> str:
    """The intermediate type ("fp32" / "bf16") of the kernel dispatch picks for this problem."""
    m, k = x.shape
    choice = gemmgen.dispatch.choose(OP, x_dtype=x.dtype, m=max(m, 1), experts=e, n=n, k=k,
                                     device=x.get_device())
    return choice.kernel.spec.c


def random_values(shape, dtype: torch.dtype) -> torch.Tensor:
    """int8: the full range -128..127; e4m3: N(0, 1) rounded to e4m3."""
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, dtype=torch.int8, device=DEVICE)
    return torch.randn(shape, device=DEVICE).to(FP8)


def random_scales(shape, dtype: torch.dtype) -> torch.Tensor:
    return (torch.rand(shape, device=DEVICE) * 1e-2 + 1e-3) * SCALE_GAIN[dtype]


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
    """The custom op into poisoned q / q_scale (proves every element is written)."""
    q, q_scale = poisoned_outputs(x.shape[0], packed.n, x.dtype)
    torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(q, q_scale, x, packed.weight, packed.scale,
                                                      x_scale, group_list, group_list_type,
                                                      False, kernel)
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
    if x.dtype == FP8:   # fast accumulation: relative to s_x·s_w·Σ|x·w|
        def absolute(t):
            return t.float().abs().to(FP8)   # exact
        magnitude = reference.grouped_matmul_dequant(absolute(x), absolute(weight), weight_scale,
                                                     x_scale, group_list, group_list_type)
        bound = bound + FP8_ACCUM_REL * (1 + C_REL[intermediate]) * magnitude.double()
    return bound


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
                       label: str = "") -> None:
    """(q, q_scale) from the op against the reference, under the error model of the module
    docstring. `weight` is the logical [E, K, N] weight (or a list of E [K, N])."""
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
                                         group_list_type)
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


def element_params():
    return pytest.mark.parametrize("element", list(ELEMENTS))


# ------------------------------------------------------------------------- 1. every kernel

KERNEL_ROUTINGS = ["uniform", "skewed", "empty", "short"]


def test_kernel_matches_reference(built_moe_kernel):
    """Each built kernel, forced by name, E = 8, K = 256, N = 512, M in {1, 7, 64, 300}, four
    routings; the public op and the custom op into poisoned outputs agree bit for bit."""
    spec = built_moe_kernel.spec
    dtype = ELEMENTS[spec.x]
    e, k, n = 8, 256, 512
    weight = random_values((e, k, n), dtype)
    weight_scale = random_scales((e, n), dtype)
    packed = gemmgen.pack_moe_weights(weight, weight_scale)
    for m, routing in itertools.product((1, 7, 64, 300), KERNEL_ROUTINGS):
        group_list_type = "cumsum" if m == 64 else "count"
        label = f"{built_moe_kernel.name} M={m} {routing} {group_list_type}"
        x = random_values((m, k), dtype)
        x_scale = random_scales((m,), dtype)
        group_list = group_list_of(routing_counts(routing, m, e), group_list_type)
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(
            x, packed, None, x_scale, group_list, group_list_type, kernel=built_moe_kernel.name)
        assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list,
                           group_list_type, spec.c, label)
        out_q, out_scale = call_out_op(x, packed, x_scale, group_list, group_list_type,
                                       built_moe_kernel.name)
        torch.cuda.synchronize()
        assert not poison_left(out_q, out_scale), f"{label}: custom op left poison"
        assert same_bits(out_q, q) and same_bits(out_scale, q_scale), \
            f"{label}: the custom op and the public op differ"


# ------------------------------------------------------------------------- 2. dispatch path

ROUTINGS = ["uniform", "skewed", "empty", "one", "short"]
WEIGHT_FORMS = ["stacked", "list", "packed", "k_major"]


def weight_argument(form: str, weight: torch.Tensor, weight_scale: torch.Tensor):
    """(weight, weight_scale) arguments of the op for the logical [E, K, N] weight."""
    if form == "stacked":
        return weight, weight_scale
    if form == "list":
        return list(weight.unbind(0)), list(weight_scale.unbind(0))
    if form == "packed":
        return gemmgen.pack_moe_weights(weight, weight_scale), None
    if form == "k_major":
        view = weight.transpose(1, 2).contiguous().transpose(1, 2)   # [E, K, N], K contiguous
        assert view.stride(1) == 1 and torch.equal(view.view(torch.uint8), weight.view(torch.uint8))
        return view, weight_scale
    raise AssertionError(form)


@pytest.mark.parametrize("e", [1, 8, 64, 128], ids=lambda e: f"E{e}")
@element_params()
def test_routing_cases(element, e):
    """Dispatch (no forced kernel): M in {1, 16, 255, 1024, 8192} x every routing, cycling
    through "count" / "cumsum" and the four weight forms."""
    dtype = require_element(element)
    k, n = 512, 256
    weight = random_values((e, k, n), dtype)
    weight_scale = random_scales((e, n), dtype)
    cases = list(itertools.product((1, 16, 255, 1024, 8192), ROUTINGS))
    forms = itertools.cycle(WEIGHT_FORMS)
    types = itertools.cycle(["count", "cumsum", "cumsum"])   # 3 vs 4 forms: every pairing occurs
    for (m, routing), form, group_list_type in zip(cases, forms, types):
        label = f"{element} E={e} M={m} {routing} {group_list_type} {form}"
        x = random_values((m, k), dtype)
        x_scale = random_scales((m,), dtype)
        group_list = group_list_of(routing_counts(routing, m, e), group_list_type)
        w_arg, ws_arg = weight_argument(form, weight, weight_scale)
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, w_arg, ws_arg, x_scale, group_list,
                                                         group_list_type)
        assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, group_list,
                           group_list_type, dispatched_intermediate(x, e, n), label)


# ------------------------------------------------------------------------- 3. determinism

@element_params()
def test_bit_identical_runs(element):
    """The same call three times gives the same bits (no atomics, no order dependence)."""
    dtype = require_element(element)
    m, e, k, n = 1024, 64, 512, 512
    weight = random_values((e, k, n), dtype)
    weight_scale = random_scales((e, n), dtype)
    packed = gemmgen.pack_moe_weights(weight, weight_scale)
    x = random_values((m, k), dtype)
    x_scale = random_scales((m,), dtype)
    group_list = group_list_of(routing_counts("skewed", m, e), "count")
    runs = [gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list)
            for _ in range(3)]
    for q, q_scale in runs[1:]:
        assert same_bits(q, runs[0][0]) and same_bits(q_scale, runs[0][1])
    assert_quant_close(*runs[0], x, weight, weight_scale, x_scale, group_list, "count",
                       dispatched_intermediate(x, e, n))


# ------------------------------------------------------------------------- 4. CUDA graphs

@element_params()
def test_cuda_graph_capture_with_changing_group_lists(element):
    """Capture the op with the default `check` (which must not read the group list while
    capturing), then replay with new x values and new group lists written in place."""
    dtype = require_element(element)
    m, e, k, n = 200, 8, 256, 512
    weight = random_values((e, k, n), dtype)
    weight_scale = random_scales((e, n), dtype)
    packed = gemmgen.pack_moe_weights(weight, weight_scale)
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

    intermediate = dispatched_intermediate(x, e, n)
    for replay, routing in enumerate(["skewed", "empty", "short", "one", "uniform"]):
        x.copy_(random_values((m, k), dtype))
        x_scale.copy_(random_scales((m,), dtype))
        group_list.copy_(group_list_of(routing_counts(routing, m, e), "count"))
        q.view(torch.uint8).fill_(POISON[dtype])
        q_scale.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_quant_close(q.clone(), q_scale.clone(), x, weight, weight_scale, x_scale,
                           group_list, "count", intermediate, f"replay {replay} ({routing})")


# --------------------------------------------------------------------- 5. bad group lists

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
@element_params()
def test_bad_group_list_never_out_of_bounds(element, case):
    """check=False: a bad list is clamped on the device (no CUDA error, nothing out of bounds)
    and the result is that of the clamped list; check=True (the default): ValueError."""
    dtype = require_element(element)
    m, e, k, n = 64, 8, 256, 512
    group_list_type, values = BAD_LISTS[case]
    weight = random_values((e, k, n), dtype)
    weight_scale = random_scales((e, n), dtype)
    packed = gemmgen.pack_moe_weights(weight, weight_scale)
    x = random_values((m, k), dtype)
    x_scale = random_scales((m,), dtype)
    group_list = torch.tensor(values, dtype=torch.int64, device=DEVICE)

    q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                     group_list_type, check=False)
    torch.cuda.synchronize()
    counts = valid_counts(group_list, group_list_type, m)
    intermediate = dispatched_intermediate(x, e, n)
    assert_quant_close(q, q_scale, x, weight, weight_scale, x_scale, counts, "count",
                       intermediate, case)
    out_q, out_scale = call_out_op(x, packed, x_scale, group_list, group_list_type)
    torch.cuda.synchronize()
    assert same_bits(out_q, q) and same_bits(out_scale, q_scale)

    for check in ({}, {"check": True}):
        with pytest.raises(ValueError, match="group_list"):
            gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                group_list_type, **check)


# ---------------------------------------------------------------------- 6. torch.compile

@element_params()
def test_torch_compile_fullgraph(element):
    """torch.compile(fullgraph=True) through the custom op: bit for bit the eager result."""
    dtype = require_element(element)
    m, e, k, n = 96, 8, 256, 512
    torch._dynamo.reset()
    weight = random_values((e, k, n), dtype)
    weight_scale = random_scales((e, n), dtype)
    packed = gemmgen.pack_moe_weights(weight, weight_scale)

    def layer(x, x_scale, group_list):
        q, q_scale = gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                         check=False)
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
                           "count", dispatched_intermediate(x, e, n), f"compiled {routing}")


# ---------------------------------------------------------------------- 7. argument errors

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
        with pytest.raises(ValueError, match=rf"^gemmgen\.{OP}: argument '{name}': expected "):
            gemmgen.grouped_matmul_swiglu_quant(args["x"], args["weight"], args["weight_scale"],
                                                args["x_scale"], args["group_list"])
    with pytest.raises(ValueError, match=rf"^gemmgen\.{OP}: argument 'group_list_type': expected "):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list, "counts")
    with pytest.raises(ValueError, match=rf"^gemmgen\.{OP}: argument 'kernel': expected "):
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                            kernel="no_such_kernel")
