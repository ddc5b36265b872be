"""The MoE family's packed weight layout (layout version 1, sm90a) and its packer.

The op takes the expert weights as the contract states them, [E, K, N] (or a list of E [K, N]),
but 8-bit wgmma reads both operands K-major, so the kernels want each expert's weight as [N, K]
with K contiguous: `pack_moe_weights` stores the stacked weight as one contiguous [E, N, K]
tensor, once, beside its [E, N] float32 scales. `MoeWeight.logical_weight()` gives the
[E, K, N] view back (no copy), the form `gemmgen.reference.grouped_matmul_swiglu_quant` takes.

A weight that already is K-major — an [E, K, N] view of a contiguous [E, N, K] tensor, such as
`w.transpose(1, 2)` of nn.Linear-style [E, N, K] weights — needs no packing: the op uses it as is.

A8W4 (`weight_bits=4`): the int4 values -8..7, given in an int8 [E, K, N] tensor (the reference's
form), are stored two per byte as a uint8 [E, N, K/2] tensor, element k in the low nibble when k
is even (two's complement nibbles: CUTLASS's int4b_t packing). `logical_weight()` unpacks them.
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
    bits: int = 8  # 4: int4 values packed two per byte (A8W4)

    @property
    def experts(self) -> int:
        return self.weight.shape[0]

    @property
    def n(self) -> int:
        return self.weight.shape[1]

    @property
    def k(self) -> int:
        return self.weight.shape[2] * (2 if self.bits == 4 else 1)

    def logical_weight(self) -> torch.Tensor:
        """The [E, K, N] weight of the op's contract: a view (8-bit), or the int4 values
        unpacked into a new int8 tensor (A8W4)."""
        if self.bits == 4:
            return unpack_int4(self.weight).transpose(1, 2)
        return self.weight.transpose(1, 2)

    def to(self, device) -> "MoeWeight":
        return MoeWeight(self.weight.to(device), self.scale.to(device), self.layout_version,
                         self.arch, self.bits)


def pack_int4(w_nk: torch.Tensor) -> torch.Tensor:
    """int8 values -8..7 [..., K] (K even) -> uint8 [..., K/2], even k in the low nibble."""
    low = w_nk[..., 0::2].to(torch.int16) & 0xF
    high = w_nk[..., 1::2].to(torch.int16) & 0xF
    return (low | (high << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: uint8 [..., K/2] -> int8 [..., K]."""
    b = packed.to(torch.int16)
    low, high = b & 0xF, (b >> 4) & 0xF
    both = torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return torch.where(both >= 8, both - 16, both).to(torch.int8)


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


PER_GROUP_REFUSED = ("per-channel scales [E, N]: per-group [E, K/group, N] scales are not built "
                     "yet (the sm90 kernels apply the weight scale per output channel in the "
                     "epilogue; per-group A8W4 needs the int32 accumulators promoted per group)")


def packed_scale(where: str, weight_scale: Weights) -> torch.Tensor:
    """The [E, N] float32 contiguous form of stacked [E, N] scales or a list of E [N]."""
    s = _stack_weights(where, weight_scale, "weight_scale")
    if s.dim() == 3:
        raise argument_error(where, "weight_scale", PER_GROUP_REFUSED, describe_argument(s))
    if s.dtype != torch.float32 or s.dim() != 2:
        raise argument_error(where, "weight_scale", "a torch.float32 tensor [E, N] (or a list "
                             "of E [N] tensors)", describe_argument(s))
    return s.contiguous()


def pack_moe_weights(weight: Weights, weight_scale: Weights, *,
                     weight_bits: int = 8) -> MoeWeight:
    """Pack expert weights once for `gemmgen.grouped_matmul_swiglu_quant`.

    weight: int8 or float8_e4m3fn [E, K, N] (or a list of E [K, N]); weight_scale: float32
    [E, N] (or a list of E [N]), on the same device. weight_bits=4 (A8W4): weight holds int4
    values -8..7 in an int8 tensor (checked: this reads the values), K even; per-channel scales
    only (per-group [E, K/group, N] scales are refused: see the op). Returns a `MoeWeight`:
    [E, N, K] contiguous, or uint8 [E, N, K/2] for int4. Runs on CPU or GPU tensors."""
    return pack("pack_moe_weights", weight, weight_scale, weight_bits)


def pack(where: str, weight: Weights, weight_scale: Weights, weight_bits: int) -> MoeWeight:
    """pack_moe_weights, with errors prefixed by `where` (the op packing an unpacked weight)."""
    if type(weight_bits) is not int or weight_bits not in (8, 4):
        raise argument_error(where, "weight_bits", "8 or 4", repr(weight_bits))
    w = packed_weight(where, weight)
    s = packed_scale(where, weight_scale)
    e, n, k = w.shape
    if tuple(s.shape) != (e, n) or s.device != w.device:
        raise argument_error(where, "weight_scale", f"a torch.float32 tensor [E={e}, N={n}] on "
                             f"{w.device} (one scale per expert and output column)",
                             describe_argument(s))
    if weight_bits == 4:
        if w.dtype != torch.int8 or k % 2:
            raise argument_error(where, "weight", "int4 values in a torch.int8 tensor [E, K, N] "
                                 "with K even (weight_bits=4)", describe_argument(weight))
        if w.numel():
            lo, hi = int(w.min()), int(w.max())
            if lo < -8 or hi > 7:
                raise argument_error(where, "weight", "int4 values -8..7 (weight_bits=4)",
                                     f"values in {lo}..{hi}")
        return MoeWeight(pack_int4(w).contiguous(), s, bits=4)
    return MoeWeight(w.contiguous(), s)
