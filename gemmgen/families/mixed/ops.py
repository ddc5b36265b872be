"""The mixed-input family's PyTorch op: argument checks, the torch custom op, and the launch.

`gemmgen.mixed_mm(a, packed, bias=None, out=None, *, kernel=None)` takes a `PackedWeight`; the
custom op `gemmgen::mixed_mm_out` takes its tensors and metadata (custom ops take tensors and
scalars only), writes into `out`, and so works under CUDA graphs and `torch.compile`.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...bindings import launch, torch_ops
from ...bindings.library import Kernel
from ...dtypes import dtype_name
from ...generator.kernel_config import RuntimeKnobs
from .abi import ARGS_LAYOUT, RASTER_CODES, MixedMmArgs
from .configs import G32_GROUP, KERNEL_FOR_WEIGHT_TYPE, group_size_fits, kernel_class
from .packing import (ARCH_LAYOUTS, LAYOUT_VERSION, PackedWeight, Sm90Layout,  # noqa: F401 (gemmgen.*)
                      pack_weights, same_layout, unpack_weights)
from .schema import TILE_K

_ACTIVATIONS = (torch.bfloat16, torch.float16)
_ALIGN = launch.ALIGN_BYTES
INT32_MAX = 2**31 - 1  # M, N, K: the C++ wrapper and CUTLASS's problem shapes take int
_fail = launch.ArgumentErrors("mixed_mm")
_describe = launch.describe


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def check_arguments(out: torch.Tensor, a: torch.Tensor, qweight: torch.Tensor,
                    scales: torch.Tensor, zeros: Optional[torch.Tensor],
                    bias: Optional[torch.Tensor], weight_type: str, group_size: int,
                    n: int, k: int, k_perm: Optional[torch.Tensor] = None) -> None:
    """Validate every argument (shapes, dtypes, layouts, alignment) before launch; works on fake
    tensors too, so torch.compile reports the same errors. (That `k_perm` is a permutation is
    the PackedWeight's check, at construction: the op reads it as it is.)"""
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise _fail("a", "a 2-D [M, K] tensor", _describe(a))
    if a.dtype not in _ACTIVATIONS:
        raise _fail("a", "dtype torch.bfloat16 or torch.float16", _describe(a))
    device = a.get_device()
    if device < 0 or not a.is_cuda:
        raise _fail("a", "a CUDA tensor", _describe(a))
    m, k_a = a.shape
    if k_a != k:
        raise _fail("a", f"K = {k} columns (the packed weight's K)", _describe(a))
    if max(m, n, k) > INT32_MAX:
        raise _fail("a", f"M, N and K <= {INT32_MAX} (2^31 - 1: the kernels take int sizes)",
                    f"M={m}, N={n}, K={k}")
    lda, inner = a.stride()
    if inner != 1 or (m > 1 and lda < k):
        raise _fail("a", "row-major [M, K] (stride(1) == 1)", _describe(a))
    if m > 1 and (lda * a.element_size()) % _ALIGN:
        raise _fail("a", f"a row stride that is a multiple of {_ALIGN // a.element_size()} "
                         "elements (16-byte TMA alignment)", _describe(a))
    if not isinstance(weight_type, str) or weight_type not in KERNEL_FOR_WEIGHT_TYPE:
        raise _fail("packed", f"a weight_type in {', '.join(KERNEL_FOR_WEIGHT_TYPE)}", repr(weight_type))
    if k <= 0 or n <= 0 or k % TILE_K or n % 8:
        raise _fail("packed", f"K a positive multiple of {TILE_K} and N a positive multiple of 8",
                    f"K={k}, N={n}")
    if not group_size_fits(group_size, k):
        raise _fail("packed", f"group_size {G32_GROUP}, a multiple of {TILE_K} dividing K={k}, "
                              f"or K (the kernels' tile K is {TILE_K})", group_size)
    want = Sm90Layout.qweight_spec(weight_type, n, k)
    if (not isinstance(qweight, torch.Tensor) or (qweight.dtype, tuple(qweight.shape)) != want
            or not qweight.is_contiguous()):
        raise _fail("packed.qweight", f"a contiguous {want[0]} tensor of shape {list(want[1])} "
                                      f"(packed layout version {LAYOUT_VERSION}: re-pack with "
                                      "gemmgen.pack_weights)", _describe(qweight))
    groups = k // group_size
    if not isinstance(scales, torch.Tensor):
        raise _fail("packed.scales", f"a [{groups}, {n}] tensor of the activation dtype", _describe(scales))
    for name, t in (("packed.scales", scales), ("packed.zeros", zeros)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise _fail(name, "None or a tensor", _describe(t))
        if t.dtype != a.dtype:
            raise _fail(name, f"dtype {a.dtype} (the activation dtype: pack the weight with "
                              "scales of the dtype the model runs in)", _describe(t))
        if tuple(t.shape) != (groups, n) or not t.is_contiguous():
            raise _fail(name, f"a contiguous [{groups}, {n}] tensor", _describe(t))
    if (zeros is not None) != (KERNEL_FOR_WEIGHT_TYPE[weight_type][1] == "scale_zero"):
        raise _fail("packed.zeros", "zeros exactly for weight_type uint4", _describe(zeros))
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.dtype != a.dtype:
        raise _fail("out", f"a 2-D {a.dtype} tensor (the activation dtype)", _describe(out))
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise _fail("bias", f"None or a {a.dtype} tensor of N={n} elements", _describe(bias))
    if k_perm is not None and (not isinstance(k_perm, torch.Tensor) or k_perm.dtype != torch.int32
                               or tuple(k_perm.shape) != (k,) or not k_perm.is_contiguous()):
        raise _fail("packed.k_perm", f"None or a contiguous torch.int32 tensor [K={k}]",
                    _describe(k_perm))
    for name, t in (("packed.qweight", qweight), ("packed.scales", scales), ("packed.zeros", zeros),
                    ("packed.k_perm", k_perm), ("bias", bias), ("out", out)):
        if t is not None and t.get_device() != device:
            raise _fail(name, f"a tensor on cuda:{device} like a", _describe(t))
    ldd, out_inner = out.stride()
    if tuple(out.shape) != (m, n) or out_inner != 1 or (m > 1 and ldd < n):
        raise _fail("out", f"row-major [M={m}, N={n}] with stride(1) == 1", _describe(out))
    if m > 1 and (ldd * out.element_size()) % _ALIGN:
        raise _fail("out", "a row stride that is a multiple of 8 elements", _describe(out))
    if bias is not None:
        _fail.vector("bias", bias, a.dtype, (n,), f"N={n} elements", device)


def _kernel_for(kernel: Optional[str], a: torch.Tensor, weight_type: str, group_size: int,
                m: int, n: int, k: int) -> tuple[Kernel, RuntimeKnobs, Optional[bool]]:
    """The forced kernel (checked against the call) with its manifest knobs, or dispatch's
    choice of kernel and knobs (memoized per problem); and how long it holds (launch.choice).
    Group 32 is a dispatch class of its own (the `_g32` schemes: configs.py says why)."""
    w, scheme = kernel_class(weight_type, group_size)
    key = ("mixed_mm", dtype_name(a.dtype), w, scheme)
    if kernel is None:
        device = a.get_device()
        arches = launch.arches_for(device, None, _fail)
        return launch.choice("mixed_mm", device, arches, key, (m, n, k))
    chosen = launch.forced_kernel(kernel, None, _fail)
    if chosen.spec.dispatch_class != key:
        raise _fail("kernel", f"a mixed_mm kernel for {key[1]} x {w} ({scheme})",
                    f"{kernel} ({' '.join(chosen.spec.dispatch_class)})")
    return chosen, chosen.spec.knobs, True


def _mixed_mm_out_impl(out, a, qweight, scales, zeros, bias, weight_type: str, group_size: int,
                       n: int, k: int, kernel: Optional[str] = None,
                       k_perm: Optional[torch.Tensor] = None, *,
                       knobs: Optional[RuntimeKnobs] = None) -> None:
    """The eager implementation. `knobs` (the tuner's) overrides the kernel's run-time knobs."""
    check_arguments(out, a, qweight, scales, zeros, bias, weight_type, group_size, n, k, k_perm)
    m = a.shape[0]
    if m == 0:
        if kernel is not None:
            _kernel_for(kernel, a, weight_type, group_size, 1, n, k)  # still reject a wrong name
        return
    pointers = (a.data_ptr(), qweight.data_ptr(), scales.data_ptr(), _ptr(zeros), _ptr(k_perm),
                out.data_ptr())
    a_ptr, q_ptr, scales_ptr, zeros_ptr, perm_ptr, d_ptr = pointers
    if (a_ptr | q_ptr | scales_ptr | zeros_ptr | perm_ptr | d_ptr) % _ALIGN:
        launch.refuse_unaligned(_fail, ("a", "packed.qweight", "packed.scales", "packed.zeros",
                                        "packed.k_perm", "out"), pointers)
    device = a.get_device()
    lda = a.stride(0) if m > 1 else k
    ldd = out.stride(0) if m > 1 else n
    # everything the argument struct holds but the pointers, and which pointers are null: the
    # workspace (act-order's gathered copy of a) depends on no more
    memo_key = (kernel, weight_type, a.dtype, device, m, n, k, lda, ldd, group_size,
                zeros_ptr == 0, bias is None, perm_ptr == 0) if knobs is None else None
    plan = launch.memoized_plan(_plans, memo_key)
    if plan is None:
        chosen, chosen_knobs, lasting = _kernel_for(kernel, a, weight_type, group_size, m, n, k)
        launch.check_device(device, chosen, _fail)
        run_knobs = knobs or chosen_knobs
        plan = (chosen, RASTER_CODES[run_knobs.raster], run_knobs.swizzle, run_knobs.split_k_slices,
                None, lasting)
    _, raster, swizzle, slices, _, _ = plan
    buffer = launch.args_buffer(MixedMmArgs)
    ARGS_LAYOUT.pack_into(buffer, 0, a_ptr, q_ptr, scales_ptr, zeros_ptr,
                          0 if bias is None else bias.data_ptr(), d_ptr, perm_ptr, m, n, k, lda, ldd,
                          group_size, raster, swizzle, slices, launch.launch_flags(), LAYOUT_VERSION)
    launch.launch_plan(_plans, memo_key, plan, buffer, device)
    launch.mark_written(out)


# _mixed_mm_out_impl's memo key -> (kernel, raster code, swizzle, K slices, workspace bytes,
# lasting): what a call derives from dispatch's choice, once per problem (launch.plan_memo).
_plans = launch.plan_memo()


def _mixed_mm_out_fake(out, a, qweight, scales, zeros, bias, weight_type, group_size, n, k,
                       kernel_name=None, k_perm=None) -> None:
    check_arguments(out, a, qweight, scales, zeros, bias, weight_type, group_size, n, k, k_perm)


# out = a @ dequant(packed weight) (+ bias); see gemmgen.mixed_mm.
# NOTES: the argument is `kernel_name`, not `kernel`: inductor's fallback lowering passes a
# defaulted argument by keyword, and `kernel` collides with FallbackKernel.create's own.
mixed_mm_out = torch_ops.define_out_op(
    "mixed_mm_out",
    "(Tensor(a!) out, Tensor a, Tensor qweight, Tensor scales, Tensor? zeros, Tensor? bias, "
    "str weight_type, SymInt group_size, SymInt n, SymInt k, str? kernel_name=None, "
    "Tensor? k_perm=None) -> ()",
    _mixed_mm_out_impl, _mixed_mm_out_fake)


def mixed_mm(a: torch.Tensor, packed: PackedWeight, bias: Optional[torch.Tensor] = None,
             out: Optional[torch.Tensor] = None, *, kernel: Optional[str] = None) -> torch.Tensor:
    """out[M, N] = a[M, K] @ dequant(packed)[K, N] (+ bias[N]), in a's dtype.

    a: [M, K] bfloat16 or float16, row-major. packed: a `gemmgen.PackedWeight` (from
    `gemmgen.pack_weights`, `PackedWeight.from_gptq`, `.from_awq` or `.from_compressed_tensors`;
    sm90a and sm80 share one layout) whose scales have
    a's dtype. bias: [N] in a's dtype. out: optional [M, N] row-major output. kernel: force a
    kernel by name (default: dispatch picks by M, N, K). An act-order weight (`packed.k_perm`,
    GPTQ desc_act): the kernel's entry point first gathers a's columns into the packed K order,
    in a kernel of its own before the GEMM, in stream order (gemmgen/mixed/gather_k.cuh).
    """
    if not isinstance(packed, PackedWeight):
        raise _fail("packed", "a gemmgen.PackedWeight (see gemmgen.pack_weights)", _describe(packed))
    if packed.layout_version != LAYOUT_VERSION or not same_layout(packed.arch, "sm90a"):
        raise _fail("packed", f"a weight packed with layout version {LAYOUT_VERSION} (arch "
                              f"{' or '.join(ARCH_LAYOUTS)}; re-pack it with "
                              "gemmgen.pack_weights(..., arch=None))",
                    f"arch {packed.arch!r}, layout version {packed.layout_version}")
    if not isinstance(a, torch.Tensor) or a.dim() != 2:
        raise _fail("a", "a 2-D [M, K] tensor", _describe(a))
    if out is None:
        out = launch.new_output((a.shape[0], packed.n), a.dtype, a.device)
    args = (out, a, packed.qweight, packed.scales, packed.zeros, bias, packed.weight_type,
            packed.group_size, packed.n, packed.k, kernel, packed.k_perm)
    if launch.through_custom_op(a):
        launch.refuse_wrong_kinds(_fail, (("out", out),), (("bias", bias),), kernel)
        torch.ops.gemmgen.mixed_mm_out(*args)
    else:
        _mixed_mm_out_impl(*args)
    return out
