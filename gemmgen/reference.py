"""The plain torch definitions of gemmgen's ops that the GPU tests compare against: CPU or GPU,
no gemmgen kernels, high precision (float64 accumulation), as little code as the math needs.

- `mixed_mm(a, packed, bias=None)`: the mixed-input GEMM, a @ dequant(w) (+ bias), float32 result.
- `scaled_mm(a, b, scale_a, scale_b, out_dtype, bias=None, azp_adj=None, azp=None)`: the W8A8
  scaled GEMM with its four epilogues (README's epilogue table), float64 result.

Neither rounds to the op's output dtype: a test compares the kernel's output (converted up) with
the reference under a tolerance that accounts for that rounding.
"""

from __future__ import annotations

from typing import Optional

import torch

from .families.mixed.packing import PackedWeight, dequantize


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
        raise _fail("mixed_mm", "packed", "a PackedWeight", type(packed).__name__)
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
    """The W8A8 scaled GEMM in float64 [M, N] (the arguments of gemmgen.scaled_mm[_azp]):

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
