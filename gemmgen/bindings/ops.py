"""The public PyTorch ops: argument checks, the torch custom op, and the launch through ctypes.

`gemmgen::scaled_mm_out` is one custom op for all four epilogues (which optional tensors are
given selects the epilogue); it writes into `out`, so `torch.compile(fullgraph=True)` sees an
allocation plus a mutating op, and CUDA graphs capture the launch on the current stream.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from .. import dispatch
from ..errors import KernelLaunchError
from .library import RASTER_CODES, Kernel, ScaledMmArgs, all_kernels

_IN_DTYPES = (torch.int8, torch.float8_e4m3fn)
_OUT_DTYPES = (torch.bfloat16, torch.float16)
_ALIGN_BYTES = 16  # TMA: base addresses and leading strides in multiples of 16 bytes


def _fail(argument: str, expected: str, got: object) -> ValueError:
    return ValueError(f"gemmgen.scaled_mm: argument '{argument}': expected {expected}; got {got}")


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype} tensor of shape {tuple(t.shape)}, strides {tuple(t.stride())} on {t.device}"


def _epilogue(bias, azp_adj, azp) -> str:
    if azp_adj is None:
        if azp is not None:
            raise _fail("azp", "None unless azp_adj is given (azp ⊗ azp_adj)", "a tensor")
        return "ScaledEpilogue" if bias is None else "ScaledEpilogueBias"
    return "ScaledEpilogueAzp" if azp is None else "ScaledEpilogueAzpPerToken"


def _check_vector(name: str, t: Optional[torch.Tensor], dtype: torch.dtype, sizes: tuple[int, ...],
                  what: str, device: torch.device) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise _fail(name, f"a {dtype} tensor", type(t).__name__)
    if t.dtype != dtype or t.numel() not in sizes or t.device != device:
        raise _fail(name, f"{dtype} on {device} with {what}", _describe(t))
    if t.numel() > 1 and not t.is_contiguous():
        raise _fail(name, "a contiguous tensor", _describe(t))


def check_arguments(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                    scale_b: torch.Tensor, bias: Optional[torch.Tensor],
                    azp_adj: Optional[torch.Tensor], azp: Optional[torch.Tensor]) -> str:
    """Validate every argument (shapes, dtypes, layouts, alignment); returns the epilogue name.

    Works on fake tensors too (no data access), so torch.compile reports the same errors.
    """
    for name, t in (("a", a), ("b", b), ("out", out)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise _fail(name, "a 2-D tensor", _describe(t) if isinstance(t, torch.Tensor) else type(t).__name__)
    if a.dtype not in _IN_DTYPES:
        raise _fail("a", "dtype torch.int8 or torch.float8_e4m3fn", _describe(a))
    if b.dtype != a.dtype:
        raise _fail("b", f"the dtype of a ({a.dtype})", _describe(b))
    m, k = a.shape
    if b.shape[0] != k:
        raise _fail("b", f"shape [K={k}, N] (column-major; pass an [N, K] weight as w.t())", _describe(b))
    n = b.shape[1]
    if a.device.type != "cuda":
        raise _fail("a", "a CUDA tensor", _describe(a))
    for name, t in (("b", b), ("out", out)):
        if t.device != a.device:
            raise _fail(name, f"a tensor on {a.device} like a", _describe(t))
    if a.stride(1) != 1 or (m > 1 and a.stride(0) < k):
        raise _fail("a", "row-major [M, K] (stride(1) == 1)", _describe(a))
    if b.stride(0) != 1 or (n > 1 and b.stride(1) < k):
        raise _fail("b", "column-major [K, N] (stride(0) == 1), e.g. w.t() of a row-major [N, K] weight",
                    _describe(b))
    if k == 0 or n == 0:
        raise _fail("b", "K > 0 and N > 0", _describe(b))
    elem = a.element_size()
    if (k * elem) % _ALIGN_BYTES:
        raise _fail("a", f"K ({k}) a multiple of {_ALIGN_BYTES // elem} (16-byte TMA alignment)", _describe(a))
    if m > 1 and (a.stride(0) * elem) % _ALIGN_BYTES:
        raise _fail("a", f"row stride a multiple of {_ALIGN_BYTES // elem} elements", _describe(a))
    if n > 1 and (b.stride(1) * elem) % _ALIGN_BYTES:
        raise _fail("b", f"column stride a multiple of {_ALIGN_BYTES // elem} elements", _describe(b))
    if out.dtype not in _OUT_DTYPES:
        raise _fail("out", "dtype torch.bfloat16 or torch.float16", _describe(out))
    out_elem = out.element_size()
    if tuple(out.shape) != (m, n) or out.stride(1) != 1 or (m > 1 and out.stride(0) < n):
        raise _fail("out", f"row-major [M={m}, N={n}] with stride(1) == 1", _describe(out))
    if (n * out_elem) % _ALIGN_BYTES or (m > 1 and (out.stride(0) * out_elem) % _ALIGN_BYTES):
        raise _fail("out", f"N and the row stride multiples of {_ALIGN_BYTES // out_elem} "
                           "(16-byte TMA alignment)", _describe(out))
    _check_vector("scale_a", scale_a, torch.float32, (1, m), f"1 (per-tensor) or M={m} (per-token) elements", a.device)
    _check_vector("scale_b", scale_b, torch.float32, (1, n), f"1 (per-tensor) or N={n} (per-channel) elements", a.device)
    if scale_a is None or scale_b is None:
        raise _fail("scale_a" if scale_a is None else "scale_b", "a float32 tensor", None)
    _check_vector("bias", bias, out.dtype, (n,), f"N={n} elements (per-channel, output dtype)", a.device)
    _check_vector("azp_adj", azp_adj, torch.int32, (n,), f"N={n} elements", a.device)
    _check_vector("azp", azp, torch.int32, (m,), f"M={m} elements (per-token zero points)", a.device)
    if a.dtype != torch.int8 and azp_adj is not None:
        raise _fail("a", "int8 activations for the azp epilogues", _describe(a))
    return _epilogue(bias, azp_adj, azp)


def _kernel_for(kernel: Optional[str], a: torch.Tensor, out: torch.Tensor, epilogue: str,
                m: int, n: int, k: int) -> Kernel:
    if kernel is None:
        return dispatch.choose("scaled_mm_azp" if "Azp" in epilogue else "scaled_mm",
                               a_dtype=a.dtype, out_dtype=out.dtype, epilogue=epilogue,
                               m=m, n=n, k=k).kernel
    chosen = all_kernels().get(kernel)
    if chosen is None:
        raise _fail("kernel", "the name of a built kernel (see gemmgen.list_kernels())", repr(kernel))
    spec = chosen.spec
    want = (dispatch.dtype_name(a.dtype), dispatch.dtype_name(out.dtype), epilogue)
    if (spec.a, spec.d, spec.epilogue) != want:
        raise _fail("kernel", f"a kernel for {want[0]} -> {want[1]} with {want[2]}",
                    f"{kernel} ({spec.a} -> {spec.d}, {spec.epilogue})")
    return chosen


_checked_devices: set[int] = set()


def _check_device(device: torch.device, kernel: Kernel) -> None:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _checked_devices:
        return
    capability = torch.cuda.get_device_capability(index)
    if kernel.library.arch == "sm90a" and capability != (9, 0):
        raise _fail("a", f"a tensor on an sm90 (Hopper) GPU for library {kernel.library.name} "
                         f"({kernel.library.arch})", f"a device of compute capability {capability}")
    _checked_devices.add(index)


def _ptr(t: Optional[torch.Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _launch(chosen: Kernel, args: ScaledMmArgs, device: torch.device) -> int:
    pointer = ctypes.byref(args)
    size = chosen.workspace_size(pointer)
    # Workspace (stream-K partials, tile counters) comes from torch's caching allocator, which
    # also makes it graph-safe under CUDA graph capture.
    workspace = torch.empty(size, dtype=torch.uint8, device=device) if size else None
    stream = torch.cuda.current_stream(device).cuda_stream
    return chosen.run(pointer, _ptr(workspace), size, stream)


def _scaled_mm_out_impl(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                        scale_b: torch.Tensor, bias: Optional[torch.Tensor],
                        azp_adj: Optional[torch.Tensor], azp: Optional[torch.Tensor],
                        kernel: Optional[str]) -> None:
    epilogue = check_arguments(out, a, b, scale_a, scale_b, bias, azp_adj, azp)
    m, k = a.shape
    n = b.shape[1]
    if m == 0:
        return
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t.data_ptr() % _ALIGN_BYTES:
            raise _fail(name, "a 16-byte aligned data pointer", f"address {t.data_ptr():#x}")
    chosen = _kernel_for(kernel, a, out, epilogue, m, n, k)
    _check_device(a.device, chosen)
    knobs = chosen.spec.knobs
    args = ScaledMmArgs(a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k,
                        a.stride(0), b.stride(1), out.stride(0),
                        scale_a.data_ptr(), scale_b.data_ptr(), _ptr(bias), _ptr(azp_adj), _ptr(azp),
                        scale_a.numel() > 1, scale_b.numel() > 1,
                        RASTER_CODES[knobs.raster], knobs.swizzle)
    if a.device.index == torch.cuda.current_device():
        status = _launch(chosen, args, a.device)
    else:
        with torch.cuda.device(a.device):
            status = _launch(chosen, args, a.device)
    if status != 0:
        raise KernelLaunchError(f"gemmgen kernel failed (status {status}): {chosen.library.last_error()}")


@torch.library.custom_op("gemmgen::scaled_mm_out", mutates_args=("out",), device_types="cuda")
def scaled_mm_out(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                  scale_b: torch.Tensor, bias: Optional[torch.Tensor], azp_adj: Optional[torch.Tensor],
                  azp: Optional[torch.Tensor], kernel: Optional[str]) -> None:
    """out = epilogue(a · b); see gemmgen.scaled_mm / gemmgen.scaled_mm_azp."""
    _scaled_mm_out_impl(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel)


def _call(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel) -> None:
    # NOTES: eager calls skip the custom-op dispatcher (tens of µs of Python per call, the whole
    # budget of a small-M GEMM); under torch.compile the op is traced as the opaque custom op.
    if torch.compiler.is_compiling():
        torch.ops.gemmgen.scaled_mm_out(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel)
    else:
        _scaled_mm_out_impl(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel)


@scaled_mm_out.register_fake
def _scaled_mm_out_fake(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel) -> None:
    check_arguments(out, a, b, scale_a, scale_b, bias, azp_adj, azp)


def _output(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, out: Optional[torch.Tensor]) -> torch.Tensor:
    if out_dtype not in _OUT_DTYPES:
        raise _fail("out_dtype", "torch.bfloat16 or torch.float16", out_dtype)
    if out is None:
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.dim() != 2 or b.dim() != 2:
            raise _fail("a" if not isinstance(a, torch.Tensor) or a.dim() != 2 else "b", "a 2-D tensor",
                        type(a).__name__ if not isinstance(a, torch.Tensor) else tuple(a.shape))
        return torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    if out.dtype != out_dtype:
        raise _fail("out", f"dtype {out_dtype} (out_dtype)", _describe(out))
    return out


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, bias: Optional[torch.Tensor] = None,
              out: Optional[torch.Tensor] = None, *, kernel: Optional[str] = None) -> torch.Tensor:
    """D = scale_a · scale_b · (a @ b) [+ bias], computed by a fused CUTLASS kernel.

    a: [M, K] int8 or float8_e4m3fn, row-major. b: [K, N] same dtype, column-major (pass an
    [N, K] weight as `w.t()`). scale_a: float32, 1 or M values; scale_b: float32, 1 or N values.
    bias: [N] in out_dtype. out: optional [M, N] row-major output. kernel: force a kernel by name
    (default: the dispatch table picks).
    """
    out = _output(a, b, out_dtype, out)
    _call(out, a, b, scale_a, scale_b, bias, None, None, kernel)
    return out


def scaled_mm_azp(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  out_dtype: torch.dtype, azp_adj: torch.Tensor, azp: Optional[torch.Tensor] = None,
                  bias: Optional[torch.Tensor] = None, out: Optional[torch.Tensor] = None, *,
                  kernel: Optional[str] = None) -> torch.Tensor:
    """Asymmetric int8 activations: D = scale_a · scale_b · (a @ b − zp) [+ bias].

    Without `azp` (per-tensor zero point): zp[m, n] = azp_adj[n], where azp_adj is
    azp · Σ_k b[k, n] precomputed ("azp_with_adj"). With `azp` [M] int32 (per-token):
    zp[m, n] = azp[m] · azp_adj[n], where azp_adj[n] = Σ_k b[k, n]. bias is optional (0 if None).
    """
    if azp_adj is None:
        raise _fail("azp_adj", "an int32 tensor of N elements", None)
    out = _output(a, b, out_dtype, out)
    _call(out, a, b, scale_a, scale_b, bias, azp_adj, azp, kernel)
    return out


def list_kernels(op: Optional[str] = None) -> list[Kernel]:
    """Every built kernel (name, config, origin), sorted by name."""
    return dispatch.kernels(op)
