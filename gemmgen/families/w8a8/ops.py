"""The W8A8 family's PyTorch ops: argument checks, the torch custom op, and the launch through ctypes.

`gemmgen::scaled_mm_out` is one custom op for all four epilogues (which optional tensors are
given selects the epilogue); it writes into `out`, so `torch.compile(fullgraph=True)` sees an
allocation plus a mutating op, and CUDA graphs capture the launch on the current stream.
The parts every family shares (arch policy, memoized dispatch, buffers, launch) are in
gemmgen/bindings/launch.py.
"""

from __future__ import annotations

from typing import Optional

import torch

from ... import arch as arch_policy
from ...bindings import launch, torch_ops
from ...bindings.library import Kernel
from ...dtypes import dtype_name
from ...generator.kernel_config import RuntimeKnobs
from .abi import ARGS_LAYOUT as _ARGS_LAYOUT
from .abi import RASTER_CODES, ScaledMmArgs

_IN_DTYPES = (torch.int8, torch.float8_e4m3fn)
_OUT_DTYPES = (torch.bfloat16, torch.float16)
_ALIGN_BYTES = launch.ALIGN_BYTES
# Errors name the public op the user called: scaled_mm_azp is the one that passes azp_adj (it
# refuses None), so `azp_adj is None` picks the prefix, also through the custom op and its fake.
_fail = launch.ArgumentErrors("scaled_mm")
_fail_azp = launch.ArgumentErrors("scaled_mm_azp")
_check_vector, _check_vector_azp = _fail.vector, _fail_azp.vector  # bound once, not per call
_describe = launch.describe
INT32_MAX = 2**31 - 1  # M, N, K: the C++ wrappers and CUTLASS's problem shapes take int
# int8 x int8 products accumulate in int32: a product is at most (-128) * (-128) = 2^14, so a
# sum of K of them fits for K * 2^14 <= 2^31 - 1, i.e. K < 2^17; K is a multiple of 16, so the
# largest K is 2^17 - 16 = 131056 (2^17 itself overflows when every product is 2^14).
# fp8 accumulates in fp32: no such limit.
INT8_MAX_K = 2**17 - 16
clear_caches = launch.clear_caches


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _epilogue(bias, azp_adj, azp) -> str:
    if azp_adj is None:
        if azp is not None:
            raise _fail("azp", "None unless azp_adj is given (azp ⊗ azp_adj)", "a tensor")
        return "ScaledEpilogue" if bias is None else "ScaledEpilogueBias"
    return "ScaledEpilogueAzp" if azp is None else "ScaledEpilogueAzpPerToken"


def _common_problem(out, a, b, scale_a, scale_b, bias) -> Optional[tuple]:
    """The sizes of a call without zero points that check_arguments accepts, read in as few tensor
    accesses as its conditions allow: (m, n, k, device, lda, ldb, ldd, scale_a per token,
    scale_b per channel), the leading strides as the kernels take them. None for anything else,
    refusals included: then check_arguments decides, and explains.

    NOTES: each condition here implies check_arguments' (tests/test_op_arguments.py holds the two
    side by side on random layouts); it may refuse more (N = 1, M = 0, int8-sized K for fp8,
    non-tensors), which only sends those calls the long way. ~2 µs cheaper a call than
    check_arguments, which explains every refusal and so reads every fact separately."""
    try:
        m, k = a.shape
        k_b, n = b.shape
        lda, a_inner = a.stride()
        b_inner, ldb = b.stride()
        ldd, out_inner = out.stride()
        device = a.get_device()
        a_dtype, out_dtype = a.dtype, out.dtype
        if not (a_inner == 1 and b_inner == 1 and out_inner == 1 and k_b == k and device >= 0
                and 0 < m <= INT32_MAX and 1 < n <= INT32_MAX and 0 < k <= INT8_MAX_K
                and (a_dtype is torch.int8 or a_dtype is torch.float8_e4m3fn) and b.dtype is a_dtype
                and (out_dtype is torch.bfloat16 or out_dtype is torch.float16)
                and ldb >= k and not (k % 16 or ldb % 16 or n % 8)
                and (m == 1 or (lda >= k and ldd >= n and not (lda % 16 or ldd % 8)))
                and out.shape == (m, n) and a.is_cuda
                and b.get_device() == device and out.get_device() == device):
            return None
        scales_a, scales_b = scale_a.numel(), scale_b.numel()
        if not (scale_a.dtype is torch.float32 and scale_b.dtype is torch.float32
                and scale_a.get_device() == device and scale_b.get_device() == device
                and (scales_a == 1 or (scales_a == m and scale_a.is_contiguous()))
                and (scales_b == 1 or (scales_b == n and scale_b.is_contiguous()))):
            return None
        if bias is not None and not (bias.dtype is out_dtype and bias.numel() == n
                                     and bias.get_device() == device and bias.is_contiguous()):
            return None
    except (AttributeError, TypeError, ValueError):  # not tensors, or not 2-D ones
        return None
    # NOTES: a single row has no meaningful stride and torch may report 1 for it; TMA wants a
    # leading stride of at least the row length, so the kernels get the packed one.
    return m, n, k, device, lda if m > 1 else k, ldb, ldd if m > 1 else n, scales_a > 1, scales_b > 1


def check_arguments(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                    scale_b: torch.Tensor, bias: Optional[torch.Tensor],
                    azp_adj: Optional[torch.Tensor], azp: Optional[torch.Tensor]) -> str:
    """Validate every argument (shapes, dtypes, layouts, alignment); returns the epilogue name.

    Works on fake tensors too (no data access), so torch.compile reports the same errors.
    NOTES: this runs on every call; it reads each tensor's metadata once and compares device
    indices as ints, because a few µs here is the whole host budget of a small-M GEMM.
    Errors name gemmgen.scaled_mm_azp when azp_adj is given (only that op passes it), else
    gemmgen.scaled_mm.
    """
    if azp_adj is None:
        fail, check_vector = _fail, _check_vector
    else:
        fail, check_vector = _fail_azp, _check_vector_azp
    for name, t in (("a", a), ("b", b), ("out", out)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise fail(name, "a 2-D tensor", _describe(t))
    a_dtype = a.dtype
    if a_dtype not in _IN_DTYPES:
        raise fail("a", "dtype torch.int8 or torch.float8_e4m3fn", _describe(a))
    if b.dtype != a_dtype:
        raise fail("b", f"the dtype of a ({a_dtype})", _describe(b))
    m, k = a.shape
    k_b, n = b.shape
    if k_b != k:
        raise fail("b", f"shape [K={k}, N] (column-major; pass an [N, K] weight as w.t())", _describe(b))
    if k > INT8_MAX_K:  # (one comparison on the fast path)
        if k > INT32_MAX:
            raise fail("a", f"K <= {INT32_MAX} (2^31 - 1: the kernels take int sizes)", _describe(a))
        if a_dtype == torch.int8:
            raise fail("a", f"K <= {INT8_MAX_K} for int8: int8 products accumulate in int32, and a "
                            f"sum of more than {INT8_MAX_K} products of up to 128 x 128 can "
                            "overflow it (float8_e4m3fn accumulates in float32 and has no such "
                            "limit)", _describe(a))
    if m > INT32_MAX or n > INT32_MAX:
        raise fail("a" if m > INT32_MAX else "b", f"{'M' if m > INT32_MAX else 'N'} <= {INT32_MAX} "
                   "(2^31 - 1: the kernels take int sizes)", _describe(a if m > INT32_MAX else b))
    device = a.get_device()
    if device < 0 or not a.is_cuda:
        raise fail("a", "a CUDA tensor", _describe(a))
    if b.get_device() != device:
        raise fail("b", f"a tensor on cuda:{device} like a", _describe(b))
    if out.get_device() != device:
        raise fail("out", f"a tensor on cuda:{device} like a", _describe(out))
    lda, a_inner = a.stride()
    b_inner, ldb = b.stride()
    if a_inner != 1 or (m > 1 and lda < k):
        raise fail("a", "row-major [M, K] (stride(1) == 1)", _describe(a))
    if b_inner != 1 or (n > 1 and ldb < k):
        raise fail("b", "column-major [K, N] (stride(0) == 1), e.g. w.t() of a row-major [N, K] weight",
                   _describe(b))
    if k == 0 or n == 0:
        raise fail("b", "K > 0 and N > 0", _describe(b))
    elem = a.element_size()
    if (k * elem) % _ALIGN_BYTES:
        raise fail("a", f"K ({k}) a multiple of {_ALIGN_BYTES // elem} (16-byte TMA alignment)", _describe(a))
    if m > 1 and (lda * elem) % _ALIGN_BYTES:
        raise fail("a", f"row stride a multiple of {_ALIGN_BYTES // elem} elements", _describe(a))
    if n > 1 and (ldb * elem) % _ALIGN_BYTES:
        raise fail("b", f"column stride a multiple of {_ALIGN_BYTES // elem} elements", _describe(b))
    out_dtype = out.dtype
    if out_dtype not in _OUT_DTYPES:
        raise fail("out", "dtype torch.bfloat16 or torch.float16", _describe(out))
    out_elem = out.element_size()
    ldd, out_inner = out.stride()
    if out.shape != (m, n) or out_inner != 1 or (m > 1 and ldd < n):
        raise fail("out", f"row-major [M={m}, N={n}] with stride(1) == 1", _describe(out))
    if (n * out_elem) % _ALIGN_BYTES or (m > 1 and (ldd * out_elem) % _ALIGN_BYTES):
        raise fail("out", f"N and the row stride multiples of {_ALIGN_BYTES // out_elem} "
                          "(16-byte TMA alignment)", _describe(out))
    if scale_a is None or scale_b is None:
        raise fail("scale_a" if scale_a is None else "scale_b", "a float32 tensor", None)
    check_vector("scale_a", scale_a, torch.float32, (1, m), f"1 (per-tensor) or M={m} (per-token) elements", device)
    check_vector("scale_b", scale_b, torch.float32, (1, n), f"1 (per-tensor) or N={n} (per-channel) elements", device)
    check_vector("bias", bias, out_dtype, (n,), f"N={n} elements (per-channel, output dtype)", device)
    check_vector("azp_adj", azp_adj, torch.int32, (n,), f"N={n} elements", device)
    check_vector("azp", azp, torch.int32, (m,), f"M={m} elements (per-token zero points)", device)
    if a_dtype != torch.int8 and azp_adj is not None:
        raise fail("a", "int8 activations for the azp epilogues", _describe(a))
    return _epilogue(bias, azp_adj, azp)


def _kernel_for(kernel: Optional[str], a: torch.Tensor, out: torch.Tensor, epilogue: str,
                m: int, n: int, k: int, arch: Optional[str] = None,
                fail: launch.ArgumentErrors = _fail) -> tuple[Kernel, RuntimeKnobs, Optional[bool]]:
    """The forced kernel (checked against the call) with its manifest knobs, or dispatch's
    choice of kernel and knobs (memoized per problem); and how long it holds (launch.choice)."""
    if kernel is None:
        device = a.get_device()
        arches = launch.arches_for(device, arch, fail)
        key = ("scaled_mm", dtype_name(a.dtype), dtype_name(out.dtype), epilogue)
        return launch.choice("scaled_mm", device, arches, key, (m, n, k))
    chosen = launch.forced_kernel(kernel, arch, fail)
    spec = chosen.spec
    want = (dtype_name(a.dtype), dtype_name(out.dtype), epilogue)
    if spec.family != "w8a8" or (spec.a, spec.d, spec.epilogue) != want:
        raise fail("kernel", f"a kernel for {want[0]} -> {want[1]} with {want[2]}",
                   f"{kernel} ({getattr(spec, 'a', '?')} -> {getattr(spec, 'd', '?')}, "
                   f"{getattr(spec, 'epilogue', spec.family)})")
    return chosen, spec.knobs, True


def _scaled_mm_out_impl(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                        scale_b: torch.Tensor, bias: Optional[torch.Tensor],
                        azp_adj: Optional[torch.Tensor], azp: Optional[torch.Tensor],
                        kernel: Optional[str], arch: Optional[str] = None,
                        split_k: Optional[int] = None, knobs: Optional[RuntimeKnobs] = None) -> None:
    """The eager implementation. `knobs` (the tuner's) overrides the kernel's run-time knobs."""
    fail = _fail_azp if azp_adj is not None else _fail
    problem = _common_problem(out, a, b, scale_a, scale_b, bias) if azp_adj is None and azp is None else None
    if problem is None:
        epilogue = check_arguments(out, a, b, scale_a, scale_b, bias, azp_adj, azp)
        m, k = a.shape
        n = b.shape[1]
        if m == 0:
            if kernel is not None:  # still reject a wrong name
                _kernel_for(kernel, a, out, epilogue, 1, n, k, arch, fail)
            return
        problem = (m, n, k, a.get_device(), a.stride(0) if m > 1 else k, b.stride(1) if n > 1 else k,
                   out.stride(0) if m > 1 else n, scale_a.numel() > 1, scale_b.numel() > 1)
    else:
        epilogue = "ScaledEpilogue" if bias is None else "ScaledEpilogueBias"
    a_ptr, b_ptr, d_ptr = a.data_ptr(), b.data_ptr(), out.data_ptr()
    if (a_ptr | b_ptr | d_ptr) % _ALIGN_BYTES:
        launch.refuse_unaligned(fail, ("a", "b", "out"), (a_ptr, b_ptr, d_ptr))
    m, n, k, device, lda, ldb, ldd, scale_a_per_token, scale_b_per_channel = problem
    # (split_k=True or 1.0 would find split_k=1's plan: only _plan refuses them)
    memo_key = ((kernel, arch, split_k, epilogue, a.dtype, out.dtype) + problem
                if knobs is None and (split_k is None or type(split_k) is int) else None)
    plan = launch.memoized_plan(_plans, memo_key)
    if plan is None:
        plan = _plan(kernel, arch, split_k, knobs, a, out, epilogue, m, n, k, device, fail)
    _, raster, swizzle, slices, _, _ = plan
    buffer = launch.args_buffer(ScaledMmArgs)
    _ARGS_LAYOUT.pack_into(buffer, 0, a_ptr, b_ptr, d_ptr, m, n, k, lda, ldb, ldd,
                           scale_a.data_ptr(), scale_b.data_ptr(), 0 if bias is None else bias.data_ptr(),
                           _ptr(azp_adj), _ptr(azp), scale_a_per_token, scale_b_per_channel, raster,
                           swizzle, slices, launch.launch_flags())
    launch.launch_plan(_plans, memo_key, plan, buffer, device)
    launch.mark_written(out)


# (kernel, arch, split_k, epilogue, a dtype, out dtype) + _common_problem's tuple ->
# (kernel, raster code, swizzle, K slices, workspace bytes, lasting): what a call derives from
# dispatch's choice, once per problem (launch.plan_memo).
_plans = launch.plan_memo()


def _plan(kernel: Optional[str], arch: Optional[str], split_k: Optional[int],
          knobs: Optional[RuntimeKnobs], a: torch.Tensor, out: torch.Tensor, epilogue: str, m: int,
          n: int, k: int, device: int, fail: launch.ArgumentErrors) -> tuple:
    """The kernel for a problem and what its launch takes from the knobs (the tuner's `knobs`
    over the chosen ones, `split_k` over both), checked; the workspace size is left to the
    first call (None)."""
    chosen, chosen_knobs, lasting = _kernel_for(kernel, a, out, epilogue, m, n, k, arch, fail)
    knobs = knobs or chosen_knobs
    launch.check_device(device, chosen, fail)
    slices = knobs.split_k_slices if split_k is None else split_k
    if not isinstance(slices, int) or isinstance(slices, bool) or not 1 <= slices <= 64:
        raise fail("split_k", "an int in [1, 64] (K slices)", repr(split_k))
    if slices != 1 and not chosen.spec.split_k:
        raise fail("split_k", f"None or 1: kernel {chosen.name} was built without split-K (an "
                              "sm80 config with `split_k: {mode: serial|parallel, slices: N}`)",
                   f"{slices} slices" + ("" if split_k is not None else " (from the tuned table)"))
    return chosen, RASTER_CODES[knobs.raster], knobs.swizzle, slices, None, lasting


def _check_call_options(arch, split_k, fail: launch.ArgumentErrors) -> None:
    """arch and split_k as far as they can be checked without a GPU (the fake kernel runs this
    too, so torch.compile refuses what the eager call would)."""
    if arch is not None and arch not in arch_policy.PREFERENCE:
        raise fail("arch", f"one of {', '.join(arch_policy.PREFERENCE)} or None", repr(arch))
    if split_k is not None and (not isinstance(split_k, int) or isinstance(split_k, bool)
                                or not 1 <= split_k <= 64):
        raise fail("split_k", "an int in [1, 64] (K slices)", repr(split_k))


def _scaled_mm_out_fake(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel, arch=None,
                        split_k=None) -> None:
    check_arguments(out, a, b, scale_a, scale_b, bias, azp_adj, azp)
    _check_call_options(arch, split_k, _fail_azp if azp_adj is not None else _fail)


# out = epilogue(a · b); see gemmgen.scaled_mm / gemmgen.scaled_mm_azp.
scaled_mm_out = torch_ops.define_out_op(
    "scaled_mm_out",
    "(Tensor(a!) out, Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
    "Tensor? azp_adj, Tensor? azp, str? kernel, str? arch=None, SymInt? split_k=None) -> ()",
    _scaled_mm_out_impl, _scaled_mm_out_fake)


def _call(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel, arch, split_k) -> None:
    if launch.through_custom_op(a):
        fail = _fail_azp if azp_adj is not None else _fail
        launch.refuse_wrong_kinds(fail, (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)),
                                  (("bias", bias), ("azp_adj", azp_adj), ("azp", azp)), kernel)
        _check_call_options(arch, split_k, fail)
        torch.ops.gemmgen.scaled_mm_out(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel, arch,
                                        split_k)
    else:
        _scaled_mm_out_impl(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel, arch, split_k)


def _output(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, out: Optional[torch.Tensor],
            fail: launch.ArgumentErrors = _fail) -> torch.Tensor:
    if out_dtype not in _OUT_DTYPES:
        raise fail("out_dtype", "torch.bfloat16 or torch.float16", out_dtype)
    if out is None:
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 2 or b.dim() != 2:
            raise fail("a" if not isinstance(a, torch.Tensor) or a.dim() != 2 else "b", "a 2-D tensor",
                       _describe(a) if not isinstance(a, torch.Tensor) or a.dim() != 2 else _describe(b))
        return launch.new_output((a.shape[0], b.shape[1]), out_dtype, a.device)
    if not isinstance(out, torch.Tensor) or out.dtype != out_dtype:
        raise fail("out", f"None or a {out_dtype} tensor (out_dtype)", _describe(out))
    return out


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, bias: Optional[torch.Tensor] = None,
              out: Optional[torch.Tensor] = None, *, kernel: Optional[str] = None,
              arch: Optional[str] = None, split_k: Optional[int] = None) -> torch.Tensor:
    """D = scale_a · scale_b · (a @ b) [+ bias], computed by a fused CUTLASS kernel.

    a: [M, K] int8 or float8_e4m3fn, row-major. b: [K, N] same dtype, column-major (pass an
    [N, K] weight as `w.t()`). scale_a: float32, 1 or M values; scale_b: float32, 1 or N values.
    bias: [N] in out_dtype. out: optional [M, N] row-major output. kernel: force a kernel by name
    (default: the dispatch table picks). arch: "sm90a" or "sm80" to use that kernel family (default:
    the fastest one the GPU runs: sm90a on Hopper, sm80 on Ampere/Ada). split_k: K slices for a
    kernel built with split-K (sm80 `split_k` config key); default: the tuned table's value for
    this problem, else the config's own slices. Give it with `kernel=` (a kernel without split-K
    accepts only 1).
    """
    out = _output(a, b, out_dtype, out)
    _call(out, a, b, scale_a, scale_b, bias, None, None, kernel, arch, split_k)
    return out


def scaled_mm_azp(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  out_dtype: torch.dtype, azp_adj: torch.Tensor, azp: Optional[torch.Tensor] = None,
                  bias: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None, *,
                  kernel: Optional[str] = None, arch: Optional[str] = None,
                  split_k: Optional[int] = None) -> torch.Tensor:
    """Asymmetric int8 activations: D = scale_a · scale_b · (a @ b − zp) [+ bias].

    Without `azp` (per-tensor zero point): zp[m, n] = azp_adj[n], where azp_adj is
    azp · Σ_k b[k, n] precomputed ("azp_with_adj"). With `azp` [M] int32 (per-token):
    zp[m, n] = azp[m] · azp_adj[n], where azp_adj[n] = Σ_k b[k, n]. bias is optional (0 if None).
    """
    if azp_adj is None:
        raise _fail_azp("azp_adj", "an int32 tensor of N elements", None)
    out = _output(a, b, out_dtype, out, _fail_azp)
    _call(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel, arch, split_k)
    return out
