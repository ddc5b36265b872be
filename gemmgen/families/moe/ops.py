"""The MoE family's PyTorch op: argument checks, the torch custom op, and the launch.

`gemmgen.grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list,
group_list_type="count", check=None)` returns (q, q_scale); the custom op
`gemmgen::grouped_matmul_swiglu_quant_out` takes the packed tensors, writes into q and q_scale,
and so works under CUDA graphs and `torch.compile`.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...bindings import launch, torch_ops
from . import FAMILY
from ...bindings.library import Kernel
from ...generator.kernel_config import RuntimeKnobs
from .abi import ARGS_LAYOUT, GROUP_LIST_CODES, RASTER_CODES, MoeArgs
from .grouping import GROUP_LIST_TYPES, check_group_list
from .grouping import _stack_weights
from .packing import (LAYOUT_VERSION, PER_GROUP_8BIT_REFUSED, MoeWeight,  # noqa: F401 (gemmgen.*)
                      group_size_problem, pack, pack_moe_weights, packed_scale, packed_weight)

OP = "grouped_matmul_swiglu_quant"
_ELEMENTS = (torch.int8, torch.float8_e4m3fn)
_ALIGN = launch.ALIGN_BYTES
# K: every expert's first row of x starts a TMA box, so x's rows must be 16-byte aligned;
# N: the intermediate's rows likewise (fp32 or bf16), and the epilogue stores 8-element vectors.
K_MULTIPLE = 16
K_MULTIPLE_INT4 = 32  # int4 weight rows: K/2 bytes, 16-byte aligned
N_MULTIPLE = 8
# int32 accumulation: |x·w| <= 2^14 per int8 product (-128 · -128), 2^10 per A8W4 one (-128 · -8),
# so K < 2^31 / max|x·w|; K is a multiple of 16 (32 for A8W4): the largest such K below it
K_MAX_INT8 = 2**17 - 16
K_MAX_A8W4 = 2**21 - 32
_INTERMEDIATE = {"fp32": torch.float32, "bf16": torch.bfloat16}
_fail = launch.ArgumentErrors(OP)
_describe = launch.describe


def check_arguments(q: torch.Tensor, q_scale: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                    w_scale: torch.Tensor, x_scale: torch.Tensor, group_list: torch.Tensor,
                    group_list_type: str, weight_bits: int = 8) -> None:
    """Validate every argument (shapes, dtypes, layouts, devices) before launch, without reading
    any value (no sync); works on fake tensors too, so torch.compile reports the same errors.
    `w` is the packed weight: [E, N, K] of x's dtype, or uint8 [E, N, K/2] (weight_bits=4)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in _ELEMENTS:
        raise _fail("x", "a 2-D torch.int8 or torch.float8_e4m3fn tensor [M, K]", _describe(x))
    device = x.get_device()
    if device < 0 or not x.is_cuda:
        raise _fail("x", "a CUDA tensor", _describe(x))
    m, k = x.shape
    if not x.is_contiguous():
        raise _fail("x", "a contiguous row-major [M, K] tensor", _describe(x))
    if type(weight_bits) is not int or weight_bits not in (8, 4):
        raise _fail("weight_bits", "8 or 4", repr(weight_bits))
    int4 = weight_bits == 4
    if int4 and x.dtype != torch.int8:
        raise _fail("x", "a torch.int8 tensor: A8W4 (int4 weights) takes int8 activations",
                    _describe(x))
    w_dtype, per_byte = (torch.uint8, 2) if int4 else (x.dtype, 1)
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype != w_dtype:
        raise _fail("weight", f"a packed {w_dtype} tensor [E, N, K{'/2' if int4 else ''}] "
                    "(gemmgen.pack_moe_weights" + (", weight_bits=4)" if int4 else ")"),
                    _describe(w))
    e, n, k_w = w.shape[0], w.shape[1], w.shape[2] * per_byte
    if k_w != k:
        raise _fail("weight", f"K = {k} rows per expert (x has K = {k} columns)",
                    f"K = {k_w}: {_describe(w)} (packed [E, N, K{'/2' if int4 else ''}])")
    if not w.is_contiguous():
        raise _fail("weight", f"packed [E, N, K{'/2' if int4 else ''}] weights (K contiguous: "
                    "see gemmgen.pack_moe_weights)", _describe(w))
    if e == 0:
        raise _fail("weight", "E >= 1 experts", _describe(w))
    k_multiple = K_MULTIPLE_INT4 if int4 else K_MULTIPLE
    if k == 0 or k % k_multiple:
        raise _fail("x", f"K a positive multiple of {k_multiple} (each expert's rows start a "
                    "16-byte aligned TMA box" + (", int4 weight rows too" if int4 else "") + ")",
                    _describe(x))
    if n == 0 or n % N_MULTIPLE:
        raise _fail("weight", f"N a positive multiple of {N_MULTIPLE} (SwiGLU halves it; the "
                    "intermediate's rows are 16-byte aligned)", _describe(w))
    per_group = int4 and isinstance(w_scale, torch.Tensor) and w_scale.dim() == 3
    if per_group:
        problem = group_size_problem(k, w_scale.shape[1])
        if (w_scale.dtype != torch.float32 or (w_scale.shape[0], w_scale.shape[2]) != (e, n)
                or not w_scale.is_contiguous() or problem):
            raise _fail("weight_scale", f"a contiguous torch.float32 tensor [E={e}, K/group, "
                        f"N={n}]" + (f": {problem}" if problem else ""), _describe(w_scale))
    elif (not isinstance(w_scale, torch.Tensor) or w_scale.dtype != torch.float32
            or tuple(w_scale.shape) != (e, n) or not w_scale.is_contiguous()):
        raise _fail("weight_scale", f"a contiguous torch.float32 tensor [E={e}, N={n}] (or a "
                    "list of E [N] tensors" + ("; A8W4 also [E, K/group, N]" if int4 else "") + ")",
                    _describe(w_scale))
    if (not isinstance(x_scale, torch.Tensor) or x_scale.dtype != torch.float32
            or tuple(x_scale.shape) != (m,) or not x_scale.is_contiguous()):
        raise _fail("x_scale", f"a contiguous torch.float32 tensor [M={m}]", _describe(x_scale))
    if (not isinstance(group_list, torch.Tensor) or group_list.dtype != torch.int64
            or tuple(group_list.shape) != (e,) or not group_list.is_contiguous()):
        raise _fail("group_list", f"a contiguous torch.int64 tensor [E={e}] (one entry per "
                    "expert of weight)", _describe(group_list))
    if group_list_type not in GROUP_LIST_TYPES:
        raise _fail("group_list_type", "'count' or 'cumsum'", repr(group_list_type))
    if (not isinstance(q, torch.Tensor) or q.dtype != x.dtype or tuple(q.shape) != (m, n // 2)
            or not q.is_contiguous()):
        raise _fail("q", f"a contiguous {x.dtype} tensor [M={m}, N/2={n // 2}]", _describe(q))
    if (not isinstance(q_scale, torch.Tensor) or q_scale.dtype != torch.float32
            or tuple(q_scale.shape) != (m,) or not q_scale.is_contiguous()):
        raise _fail("q_scale", f"a contiguous torch.float32 tensor [M={m}]", _describe(q_scale))
    for name, t in (("weight", w), ("weight_scale", w_scale), ("x_scale", x_scale),
                    ("group_list", group_list), ("q", q), ("q_scale", q_scale)):
        if t.get_device() != device:
            raise _fail(name, f"a tensor on cuda:{device} like x", _describe(t))
    k_max = K_MAX_A8W4 if int4 else K_MAX_INT8
    if x.dtype == torch.int8 and k > k_max:
        raise _fail("x", f"K <= {k_max} for int8 x (|x·w| <= 2^{10 if int4 else 14} per product: a longer K "
                    "could overflow the int32 accumulator)", _describe(x))
    if max(m, n, k) > 2**31 - 1 or e > 2**31 - 1:
        raise _fail("x", "M, N and K below 2^31 (the kernels take int sizes)", _describe(x))


def _kernel_for(kernel: Optional[str], x: torch.Tensor, m: int, e: int, n: int, k: int,
                weight_bits: int, per_group: bool) -> tuple[Kernel, RuntimeKnobs, Optional[bool]]:
    """The forced kernel (checked against the call) with its manifest knobs, or dispatch's
    choice of kernel and knobs (memoized per problem); and how long it holds (launch.choice)."""
    key, values = FAMILY.dispatch_request(OP, x_dtype=x.dtype, m=m, experts=e, n=n, k=k,
                                          weight_bits=weight_bits, per_group=per_group)
    if kernel is None:
        device = x.get_device()
        arches = launch.arches_for(device, None, _fail, tensor="x")
        return launch.choice(OP, device, arches, key, values)
    chosen = launch.forced_kernel(kernel, None, _fail)
    if chosen.spec.dispatch_class != key:
        raise _fail("kernel", f"a {OP} kernel for {key[1]} x {key[2]} with {key[3]} scales",
                    f"{kernel} ({' '.join(chosen.spec.dispatch_class)})")
    return chosen, chosen.spec.knobs, True


def _gmm_swiglu_quant_out_impl(q, q_scale, x, w, w_scale, x_scale, group_list,
                               group_list_type: str, weight_bits: int = 8,
                               check: Optional[bool] = None,
                               kernel: Optional[str] = None,
                               knobs: Optional[RuntimeKnobs] = None) -> None:
    """The eager implementation. `check` reads the group list back (a sync) and raises on a bad
    one; `knobs` (the tuner's) overrides the kernel's run-time knobs."""
    check_arguments(q, q_scale, x, w, w_scale, x_scale, group_list, group_list_type, weight_bits)
    m, k = x.shape
    e, n = w.shape[0], w.shape[1]
    groups = w_scale.shape[1] if w_scale.dim() == 3 else 1
    per_group = groups > 1
    # None: check unless a CUDA graph is being captured (values cannot be read back then; a bad
    # list is clamped on the device). Decided here, at run time, not when torch.compile traces.
    if check is not False:   # check=False (the sync-free hot path) asks nothing of the device
        capturing = _capturing(x.get_device())
        if check and capturing:
            raise _fail("check", "False or None while a CUDA graph is captured (the group list "
                        "cannot be read back during capture)", "check=True")
        if not capturing:
            check_group_list(group_list, group_list_type, m, where=OP)
    if m == 0:
        if kernel is not None:
            _kernel_for(kernel, x, 1, e, n, k, weight_bits, per_group)  # still reject a wrong name
        return
    pointers = (x.data_ptr(), w.data_ptr(), w_scale.data_ptr(), q.data_ptr())
    x_ptr, w_ptr, w_scale_ptr, q_ptr = pointers
    if (x_ptr | w_ptr | w_scale_ptr | q_ptr) % _ALIGN:
        launch.refuse_unaligned(_fail, ("x", "weight", "weight_scale", "q"), pointers)
    device = x.get_device()
    # everything the argument struct holds but the pointers: the workspace (the group arrays,
    # a permuted copy of x) depends on no more
    memo_key = ((kernel, x.dtype, device, m, e, n, k, weight_bits, groups, group_list_type)
                if knobs is None else None)
    plan = launch.memoized_plan(_plans, memo_key)
    if plan is None:
        chosen, chosen_knobs, lasting = _kernel_for(kernel, x, m, e, n, k, weight_bits, per_group)
        launch.check_device(device, chosen, _fail, tensor="x")
        run_knobs = knobs or chosen_knobs
        plan = (chosen, _INTERMEDIATE[chosen.spec.c], chosen.spec.config.fused,
                RASTER_CODES[run_knobs.raster], run_knobs.swizzle, None, lasting)
    _, c_dtype, fused, raster, swizzle, _, _ = plan
    # the intermediate: C [M, N] (unfused) or S [M, N/2] (fused kernels), fp32 or bf16
    c = launch.new_output((m, n // 2 if fused else n), c_dtype, x.device)
    buffer = launch.args_buffer(MoeArgs)
    ARGS_LAYOUT.pack_into(buffer, 0, x_ptr, w_ptr, w_scale_ptr, x_scale.data_ptr(),
                          group_list.data_ptr(), c.data_ptr(), q_ptr, q_scale.data_ptr(), m, n, k, e,
                          GROUP_LIST_CODES[group_list_type], raster, swizzle,
                          k // groups if per_group else 0, LAYOUT_VERSION, launch.launch_flags())
    launch.launch_plan(_plans, memo_key, plan, buffer, device)
    launch.mark_written(q, q_scale)


# _gmm_swiglu_quant_out_impl's memo key -> (kernel, intermediate dtype, fused, raster code,
# swizzle, workspace bytes, lasting): what a call derives from dispatch's choice, once per
# problem (launch.plan_memo).
_plans = launch.plan_memo()


def _fake(q, q_scale, x, weight, weight_scale, x_scale, group_list, group_list_type,
          weight_bits=8, check=None, kernel_name=None) -> None:
    check_arguments(q, q_scale, x, weight, weight_scale, x_scale, group_list, group_list_type,
                    weight_bits)


# (q, q_scale) = grouped_matmul_swiglu_quant(...) into given tensors; `weight` and `weight_scale`
# packed by gemmgen.pack_moe_weights (MoeWeight.weight: [E, N, K] contiguous, or uint8
# [E, N, K/2] with weight_bits=4; MoeWeight.scale [E, N], or [E, K/group, N] per group with
# weight_bits=4; act and gate interleaved).
grouped_matmul_swiglu_quant_out = torch_ops.define_out_op(
    "grouped_matmul_swiglu_quant_out",
    "(Tensor(a!) q, Tensor(b!) q_scale, Tensor x, Tensor weight, Tensor weight_scale, "
    "Tensor x_scale, Tensor group_list, str group_list_type, SymInt weight_bits=8, "
    "bool? check=None, str? kernel_name=None) -> ()",
    _gmm_swiglu_quant_out_impl, _fake)


def _capturing(device: int) -> bool:
    """Whether `device`'s current stream is capturing a CUDA graph."""
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _per_group(weight_scale) -> bool:
    """Whether unpacked weight scales are per group: [E, G, N], or a list of E [G, N]."""
    if isinstance(weight_scale, torch.Tensor):
        return weight_scale.dim() == 3
    return (isinstance(weight_scale, (list, tuple)) and len(weight_scale) > 0
            and isinstance(weight_scale[0], torch.Tensor) and weight_scale[0].dim() == 2)


def grouped_matmul_swiglu_quant(x: torch.Tensor, weight, weight_scale, x_scale: torch.Tensor,
                                group_list: torch.Tensor, group_list_type: str = "count",
                                check: Optional[bool] = None, *,
                                weight_bits: Optional[int] = None, weight_assist_matrix=None,
                                kernel: Optional[str] = None
                                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The first half of a quantized MoE expert layer in one op: per-expert GEMM, dequant,
    SwiGLU and dynamic per-token quantization. Returns (q [M, N/2], q_scale float32 [M]).

    x: [M, K] torch.int8 or torch.float8_e4m3fn, rows grouped by expert (contiguous, in expert
    order), K a multiple of 16 (32 for A8W4). weight: a `gemmgen.MoeWeight` from
    `gemmgen.pack_moe_weights` (then weight_scale is None), or the expert weights as the
    contract states them, x's dtype [E, K, N] or a list of E [K, N] (packed, a copy, on every
    call: pack once), N a multiple of 8. weight_scale: float32 [E, N] (or a list of
    E [N]). x_scale: float32 [M]. group_list: int64 [E] on x's device, rows per expert
    ("count") or end offsets ("cumsum"), read on the device (and by the host only to check
    it: see `check`).

    A8W4: int8 x with int4 weights — a MoeWeight packed with weight_bits=4, or an int8 [E, K, N]
    weight holding -8..7 with weight_bits=4, or with weight_bits None and per-group scales
    (packed on this call, which reads the values back
    to check their range: a sync, so pack once for CUDA graphs). Weight scales per channel
    [E, N] or per group of K, [E, K/group, N] (or a list of E [K/group, N]), the group size a
    multiple of 128 dividing K (128, 256, ...): C = x_scale · Σ_g (X·W)_g ⊙ weight_scale[g], each
    group's int32 sum promoted to float32 (the family's own direct and wgmma kernels; dispatch
    picks among them).
    weight_assist_matrix (Ascend's 8 · weight_scale · Σ_k W, [E, N] float32 or a list of E [N]):
    accepted for API parity with A8W4 only, its dtype, shape and device checked; the kernels do
    not need it (they convert int4 to int8 in registers and multiply X·W directly), so its
    values are not read.

    check: read the group list back (a host sync) and raise ValueError on a bad one (negative
    count, decreasing end offset, more rows than M). None (default): check, except while a CUDA
    graph is captured (decided when the op runs, so torch.compile keeps it); False: never read
    it, for a sync-free hot path (a bad list is then clamped on the device: nothing is read or
    written out of bounds); True during capture is an error. Rows past the last group get
    q = 0 and q_scale = 0.

    Definition: gemmgen.reference.grouped_matmul_swiglu_quant. q is int8 with q_scale =
    max|S_row| / 127 (round to nearest, ties to even), or e4m3 with q_scale = max|S_row| / 448.
    Where the kernels round differently from the reference: C = w_scale · (x_scale · acc) is
    two float32 multiplies (int32 acc converted to float32 first), swish uses float32 expf, fp8
    accumulates in float32 promoted every 4 wgmmas (128 K), in the direct kernel's float32
    accumulators, or with a `fast_accum` config in the tensor cores' own accumulation over the
    whole K (as torch._scaled_mm with use_fast_accum: ~1% in q_scale at K 4096-7168), and a
    bf16-intermediate config rounds C to bf16 (shipped: fp8's large_fa_bf16 and large_fa_c2_bf16)
    or, fused, S (fp8's small_fused_fa_bf16 and wide_pp_fused_fa_bf16, the rules' picks past
    decode); every other config keeps both in float32. So q may differ from the reference by one
    step where S / q_scale lies within rounding distance of a tie, and q_scale by a few float32
    ulps (beside fast accumulation's error; a bf16 S adds up to 2^-8 relative).
    Non-finite values: a row whose S holds a NaN gets q_scale NaN, an infinite S q_scale +inf
    (q of that row unspecified); int8 K is limited to 131056 (A8W4: 2097120; int32 accumulation). kernel: force a kernel by name (default: dispatch picks by
    tokens per expert, E, N, K and rows: a tuned table's entry for the layer, else the rules).
    """
    if weight_bits is not None and (type(weight_bits) is not int or weight_bits not in (8, 4)):
        raise _fail("weight_bits", "None, 8 or 4", repr(weight_bits))
    if isinstance(weight, MoeWeight):
        if (not isinstance(weight.weight, torch.Tensor) or weight.weight.dim() != 3
                or not isinstance(weight.scale, torch.Tensor)):
            raise _fail("weight", "a MoeWeight holding a 3-D packed weight tensor and its scale "
                        "tensor (from gemmgen.pack_moe_weights)",
                        f"a MoeWeight of {_describe(weight.weight)} and {_describe(weight.scale)}")
        if weight.layout_version != LAYOUT_VERSION or weight.arch != "sm90a":
            raise _fail("weight", f"a MoeWeight packed for sm90a with layout version "
                        f"{LAYOUT_VERSION} (re-pack it with gemmgen.pack_moe_weights)",
                        f"arch {weight.arch!r}, layout version {weight.layout_version}")
        if weight_scale is not None:
            raise _fail("weight_scale", "None with a packed MoeWeight (it holds its scales)",
                        _describe(weight_scale))
        if weight_bits is not None and weight_bits != weight.bits:
            raise _fail("weight_bits", f"None or {weight.bits} (the packed weight's)",
                        repr(weight_bits))
        w, w_scale, bits = weight.weight, weight.scale, weight.bits
    else:
        # None: 4 where the scales are per group (A8W4's only) and x is int8, as
        # gemmgen.reference decides (fp8 x keeps 8 bits, and the refusal of its per-group scales)
        a8w4 = _per_group(weight_scale) and getattr(x, "dtype", None) == torch.int8
        bits = weight_bits if weight_bits is not None else (4 if a8w4 else 8)
        if bits == 4:
            packed = pack(OP, weight, weight_scale, 4)
            w, w_scale = packed.weight, packed.scale
        else:
            w = packed_weight(OP, weight)
            w_scale = packed_scale(OP, weight_scale, bits) if weight_scale is not None else None
    if isinstance(w_scale, torch.Tensor) and w_scale.dim() == 3:  # per group: refused early
        if bits != 4:
            raise _fail("weight_scale", PER_GROUP_8BIT_REFUSED, _describe(w_scale))
        problem = group_size_problem(w.shape[2] * 2, w_scale.shape[1]) if w.dim() == 3 else None
        if problem:
            raise _fail("weight_scale", f"a torch.float32 tensor [E, K/group, N]: {problem}",
                        _describe(w_scale))
    if weight_assist_matrix is not None:
        e, n = w.shape[0], w.shape[1]
        if bits != 4:
            raise _fail("weight_assist_matrix", "None: the assist matrix is A8W4's only "
                        "(weight_bits=4)", _describe(weight_assist_matrix))
        wam = _stack_weights(OP, weight_assist_matrix, "weight_assist_matrix")
        if (not isinstance(wam, torch.Tensor) or wam.dtype != torch.float32
                or tuple(wam.shape) != (e, n) or wam.device != w.device):
            raise _fail("weight_assist_matrix", f"None or a torch.float32 tensor [E={e}, N={n}] "
                        f"on {w.device}", _describe(wam))
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise _fail("x", "a 2-D tensor [M, K]", _describe(x))
    m = x.shape[0]
    n = w.shape[1] if w.dim() == 3 else 0
    q = launch.new_output((m, n // 2), x.dtype, x.device)
    q_scale = launch.new_output((m,), torch.float32, x.device)
    args = (q, q_scale, x, w, w_scale, x_scale, group_list, group_list_type, bits, check,
            kernel)
    if launch.through_custom_op(x):
        # (a missing weight_scale reaches the op's check, which says what it must be)
        launch.refuse_wrong_kinds(_fail, (("x_scale", x_scale), ("group_list", group_list)),
                                  (("weight_scale", w_scale),), kernel)
        if check is not None and not isinstance(check, bool):
            raise _fail("check", "None, True or False", repr(check))
        torch.ops.gemmgen.grouped_matmul_swiglu_quant_out(*args)
    else:
        _gmm_swiglu_quant_out_impl(*args)
    return q, q_scale
