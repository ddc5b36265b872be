"""The MoE family's packed weight layout (layout version 1, sm90a) and its packer.

The op takes the expert weights as the contract states them, [E, K, N] (or a list of E [K, N]),
but 8-bit wgmma reads both operands K-major, so the kernels want each expert's weight as [N, K]
with K contiguous: `pack_moe_weights` stores the stacked weight as one contiguous [E, N, K]
tensor, once, beside its [E, N] float32 scales. `MoeWeight.logical_weight()` gives the
[E, K, N] view back (no copy), the form `gemmgen.reference.grouped_matmul_swiglu_quant` takes.

A weight that already is K-major — an [E, K, N] view of a contiguous [E, N, K] tensor, such as
`w.transpose(1, 2)` of nn.Linear-style [E, N, K] weights — needs no packing: the op uses it as is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from ...errors import argument_error, describe_argument
from .grouping import _stack_weights

LAYOUT_VERSION = 1
ELEMENT_DTYPES = (torch.int8, torch.float8_e4m3fn)

Weights = Union[torch.Tensor, Sequence[torch.Tensor]]


@dataclass(frozen=True)
class MoeWeight:
    """Expert weights packed for the MoE kernels: `weight` [E, N, K] contiguous (K-major) of
    torch.int8 or torch.float8_e4m3fn, `scale` [E, N] float32 contiguous; for `arch`'s kernels,
    in layout `layout_version`."""

    weight: torch.Tensor
    scale: torch.Tensor
    layout_version: int = LAYOUT_VERSION
    arch: str = "sm90a"

    @property
    def experts(self) -> int:
        return self.weight.shape[0]

    @property
    def n(self) -> int:
        return self.weight.shape[1]

    @property
    def k(self) -> int:
        return self.weight.shape[2]

    def logical_weight(self) -> torch.Tensor:
        """The [E, K, N] weight of the op's contract (a view, no copy)."""
        return self.weight.transpose(1, 2)

    def to(self, device) -> "MoeWeight":
        return MoeWeight(self.weight.to(device), self.scale.to(device), self.layout_version,
                         self.arch)


def is_k_major(w: torch.Tensor) -> bool:
    """Whether an [E, K, N] tensor is a view of a contiguous [E, N, K] one (no packing needed)."""
    e, k, n = w.shape
    return w.transpose(1, 2).is_contiguous() or (e * k * n == 0)


def packed_weight(where: str, weight: Weights) -> torch.Tensor:
    """The [E, N, K] contiguous form of a stacked [E, K, N] weight or a list of E [K, N]: a view
    when the weight is already K-major, else one copy."""
    w = _stack_weights(where, weight, "weight")
    if w.dim() != 3 or w.dtype not in ELEMENT_DTYPES:
        raise argument_error(where, "weight", "a torch.int8 or torch.float8_e4m3fn tensor "
                             "[E, K, N] (or a list of E [K, N] tensors)", describe_argument(w))
    return w.transpose(1, 2) if is_k_major(w) else w.transpose(1, 2).contiguous()


def packed_scale(where: str, weight_scale: Weights) -> torch.Tensor:
    """The [E, N] float32 contiguous form of stacked [E, N] scales or a list of E [N]."""
    s = _stack_weights(where, weight_scale, "weight_scale")
    if s.dtype != torch.float32 or s.dim() != 2:
        raise argument_error(where, "weight_scale", "a torch.float32 tensor [E, N] (or a list "
                             "of E [N] tensors)", describe_argument(s))
    return s.contiguous()


def pack_moe_weights(weight: Weights, weight_scale: Weights) -> MoeWeight:
    """Pack expert weights once for `gemmgen.grouped_matmul_swiglu_quant`.

    weight: int8 or float8_e4m3fn [E, K, N] (or a list of E [K, N]); weight_scale: float32
    [E, N] (or a list of E [N]), on the same device. Returns a `MoeWeight` whose weight is
    [E, N, K] contiguous. Runs on CPU or GPU tensors (move it with `.to(device)`)."""
    where = "pack_moe_weights"
    w = packed_weight(where, weight)
    s = packed_scale(where, weight_scale)
    e, n, k = w.shape
    if tuple(s.shape) != (e, n) or s.device != w.device:
        raise argument_error(where, "weight_scale", f"a torch.float32 tensor [E={e}, N={n}] on "
                             f"{w.device} (one scale per expert and output column)",
                             describe_argument(s))
    return MoeWeight(w.contiguous(), s)
