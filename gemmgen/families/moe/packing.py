"""The MoE family's packed weight layout (layout version 3, sm90a) and its packer.

The op takes the expert weights as the contract states them, [E, K, N] (or a list of E [K, N]),
but 8-bit wgmma reads both operands K-major, so the kernels want each expert's weight as [N, K]
with K contiguous: `pack_moe_weights` stores the stacked weight as one contiguous [E, N, K]
tensor, once, beside its [E, N] float32 scales. Its N rows (and the scales' columns) are the act
and gate columns interleaved: packed row 2j is logical column j (act), row 2j + 1 logical
column N/2 + j (gate), so one GEMM tile holds matching pairs and the fused kernels do SwiGLU in
their epilogue (the unfused kernels read C pair-wise too). `MoeWeight.logical_weight()` and
`logical_scale()` give the [E, K, N] and [E, N] forms back, the forms
`gemmgen.reference.grouped_matmul_swiglu_quant` takes. Layout version 1 (act and gate halves
not interleaved) is no longer read: re-pack.

A8W4 (`weight_bits=4`): the int4 values -8..7, given in an int8 [E, K, N] tensor (the reference's
form), are stored two per byte (two's complement nibbles) as a uint8 [E, N, K/2] tensor. Its
scales are per channel, [E, N], or per group of K, [E, K/group, N] with K/group > 1 (the family's
own direct and wgmma kernels, group sizes multiples of 128 dividing K), their N axis interleaved
like the weight's. The nibble order follows the kernels that read it:
- per channel (CUTLASS's kernels too): element k in the low nibble when k is even, as CUTLASS's
  int4b_t packs (`pack_int4`);
- per group (only the family's own kernels): the int8 MMA's fragment order (`pack_int4_mma_order`):
  in each 128-k chunk of a row (64 bytes), byte 16q + 4j + i holds k = 32j + 4q + i in its low
  nibble and k + 16 in its high one (q, j, i in 0..3). A lane (q = lane % 4) of an
  m16n8k32 / m64nNk32 int8 MMA reads its chunk's 16 bytes of a row at once, and each 32-bit word
  gives its two A registers of step j with a mask and a shift-and-mask: k = 32j + 4q + 0..3 and
  k + 16 .. + 19, the MMA's own k order (tokens stay in natural order).
`logical_weight()` unpacks either. Layout version 3 (per-group int4 in the MMA order; version 2
packed it like per channel) is the one read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

from ... import state_dicts
from ...errors import argument_error, describe_argument
from .grouping import _stack_weights

LAYOUT_VERSION = 3
ELEMENT_DTYPES = (torch.int8, torch.float8_e4m3fn)

Weights = Union[torch.Tensor, Sequence[torch.Tensor]]


@dataclass(frozen=True)
class MoeWeight:
    """Expert weights packed for the MoE kernels: `weight` [E, N, K] contiguous (K-major) of
    torch.int8 or torch.float8_e4m3fn (uint8 [E, N, K/2] for int4), `scale` [E, N] float32
    contiguous (int4 with per-group scales: [E, K/group, N]), act and gate columns interleaved
    (see the module); for `arch`'s kernels, in layout `layout_version`."""

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

    @property
    def group_size(self) -> int:
        """K elements per weight-scale group: 0 for per-channel scales."""
        return self.k // self.scale.shape[1] if self.scale.dim() == 3 and self.scale.shape[1] > 1 else 0

    @property
    def mma_order(self) -> bool:
        """int4 in the MMA fragment order (per-group scales; see the module)."""
        return self.bits == 4 and self.group_size > 0

    def logical_weight(self) -> torch.Tensor:
        """The [E, K, N] weight of the op's contract (a new tensor; int4 values unpacked into
        int8 for A8W4)."""
        if self.bits == 4:
            w = unpack_int4_mma_order(self.weight) if self.mma_order else unpack_int4(self.weight)
        else:
            w = self.weight
        return deinterleave_act_gate(w, 1).transpose(1, 2)

    def logical_scale(self) -> torch.Tensor:
        """The [E, N] (per-group: [E, K/group, N]) weight scale of the op's contract (a new
        tensor)."""
        return deinterleave_act_gate(self.scale, self.scale.dim() - 1)

    def to(self, device) -> "MoeWeight":
        return MoeWeight(self.weight.to(device), self.scale.to(device), self.layout_version,
                         self.arch, self.bits)

    def state_dict(self, prefix: str = "") -> dict:
        """What to save (gemmgen/state_dicts.py): the tensors weight and scale under `prefix` +
        their names, and the metadata as strings; `MoeWeight.from_state_dict` reads it back."""
        return state_dicts.entries(prefix, "MoeWeight", {"weight": self.weight, "scale": self.scale},
                                   layout_version=self.layout_version, arch=self.arch,
                                   bits=self.bits)

    @classmethod
    def from_state_dict(cls, state, prefix: str = "") -> "MoeWeight":
        """The MoeWeight that `state_dict(prefix)` saved, on the tensors' device. Another layout
        version, and tensors that disagree with `bits` or each other (dtype, rank, E, N, the
        scale groups), are refused naming the entry; the op checks the rest when called."""
        read = state_dicts.StateReader(state, prefix, "MoeWeight", "MoeWeight.from_state_dict")
        version, bits = read.integer("layout_version"), read.integer("bits")
        if version != LAYOUT_VERSION:
            raise read.error("layout_version", f"{LAYOUT_VERSION} (the layout this gemmgen reads: "
                         "re-pack the weights with gemmgen.pack_moe_weights)", repr(version))
        if bits not in (4, 8):
            raise read.error("bits", "4 or 8", repr(bits))
        arch = read.string("arch", ("sm90a",))
        weight, scale = read.tensor("weight"), read.tensor("scale")
        dtypes = (torch.uint8,) if bits == 4 else ELEMENT_DTYPES
        if weight.dtype not in dtypes or weight.dim() != 3 or not weight.is_contiguous():
            raise read.error("weight", f"a contiguous 3-D {' or '.join(map(str, dtypes))} tensor "
                         f"[E, N, K{'/2' if bits == 4 else ''}] (bits={bits})",
                         describe_argument(weight))
        e, n, k = weight.shape[0], weight.shape[1], weight.shape[2] * (2 if bits == 4 else 1)
        groups = scale.shape[1] if scale.dim() == 3 else 1
        if (scale.dtype != torch.float32 or scale.dim() not in (2, 3) or scale.shape[0] != e
                or scale.shape[-1] != n or groups < 1 or k % groups
                or (bits == 8 and groups > 1) or not scale.is_contiguous()):
            shapes = f"[E={e}, N={n}]" + (f" or [E, K/group, N] (K={k})" if bits == 4 else "")
            raise read.error("scale", f"a contiguous torch.float32 tensor {shapes}",
                         describe_argument(scale))
        if scale.device != weight.device:
            raise read.error("scale", f"a tensor on {weight.device} like the weight",
                         describe_argument(scale))
        return cls(weight, scale, version, arch, bits)


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


MMA_ORDER_CHUNK = 128  # k values a chunk of the MMA fragment order (the kernels' K chunk)


def pack_int4_mma_order(w_nk: torch.Tensor) -> torch.Tensor:
    """int8 values -8..7 [..., K] (K a multiple of 128) -> uint8 [..., K/2] in the MMA fragment
    order: in each 128-k chunk, byte 16q + 4j + i holds k = 32j + 4q + i (low nibble) and k + 16
    (high nibble)."""
    *lead, k = w_nk.shape
    d = len(lead)
    # k = 128c + 32j + 16h + 4q + i  ->  (c, q, j, i, h): h = 0 the low nibble, 1 the high one
    split = w_nk.reshape(*lead, k // MMA_ORDER_CHUNK, 4, 2, 4, 4)
    return pack_int4(split.permute(*range(d), d, d + 3, d + 1, d + 4, d + 2).reshape(*lead, k))


def unpack_int4_mma_order(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4_mma_order: uint8 [..., K/2] -> int8 [..., K]."""
    w = unpack_int4(packed)
    *lead, k = w.shape
    d = len(lead)
    split = w.reshape(*lead, k // MMA_ORDER_CHUNK, 4, 4, 4, 2)  # (c, q, j, i, h)
    return split.permute(*range(d), d, d + 2, d + 4, d + 1, d + 3).reshape(*lead, k)


def interleave_act_gate(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[..., N, ...] with act = [:N/2] and gate = [N/2:] along `dim` -> act and gate
    interleaved (index 2j: act j, 2j + 1: gate j); contiguous. N must be even."""
    n = t.shape[dim]
    act, gate = t.narrow(dim, 0, n // 2), t.narrow(dim, n // 2, n // 2)
    return torch.stack((act, gate), dim=dim + 1).flatten(dim, dim + 1).contiguous()


def deinterleave_act_gate(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of interleave_act_gate: act (even indices) then gate (odd), contiguous."""
    n = t.shape[dim]
    pairs = t.unflatten(dim, (n // 2, 2))
    return torch.cat((pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)), dim=dim).contiguous()


def _even_n(where: str, argument: str, t: torch.Tensor, n: int) -> None:
    if n % 2:
        raise argument_error(where, argument, "an even N (act and gate halves)", describe_argument(t))


def packed_weight(where: str, weight: Weights) -> torch.Tensor:
    """The packed [E, N, K] contiguous form (act and gate interleaved) of a stacked [E, K, N]
    weight or a list of E [K, N]: one copy."""
    w = _stack_weights(where, weight, "weight")
    if w.dim() != 3 or w.dtype not in ELEMENT_DTYPES:
        raise argument_error(where, "weight", "a torch.int8 or torch.float8_e4m3fn tensor "
                             "[E, K, N] (or a list of E [K, N] tensors)", describe_argument(w))
    _even_n(where, "weight", w, w.shape[2])
    return interleave_act_gate(w.transpose(1, 2), 1)


GROUP_MULTIPLE = 128  # the own kernels' K chunk: a group is a whole number of chunks
PER_GROUP_8BIT_REFUSED = ("per-channel scales [E, N] with 8-bit weights: per-group [E, K/group, N] "
                          "scales are A8W4's (weight_bits=4)")


def group_size_problem(k: int, groups: int) -> str | None:
    """Why per-group scales with `groups` groups cannot serve K (None: they can)."""
    if groups < 1 or k % groups:
        return f"a group count dividing K={k}; got {groups} groups"
    size = k // groups
    if groups > 1 and size % GROUP_MULTIPLE:
        return (f"group sizes that are multiples of {GROUP_MULTIPLE} (the direct kernels promote "
                f"each group's int32 sum per chunk of {GROUP_MULTIPLE} K: 128, 256, ...); got "
                f"K/{groups} = {size}")
    return None


def packed_scale(where: str, weight_scale: Weights, weight_bits: int = 8) -> torch.Tensor:
    """The float32 contiguous, N-interleaved form of stacked [E, N] scales or a list of E [N];
    with weight_bits=4 also of per-group [E, K/group, N] scales or a list of E [K/group, N]
    (one group: per channel, [E, N])."""
    s = _stack_weights(where, weight_scale, "weight_scale")
    if s.dim() == 3 and weight_bits != 4:
        raise argument_error(where, "weight_scale", PER_GROUP_8BIT_REFUSED, describe_argument(s))
    if s.dtype != torch.float32 or s.dim() not in (2, 3):
        raise argument_error(where, "weight_scale", "a torch.float32 tensor [E, N] (A8W4 also "
                             "[E, K/group, N]; or a list of E such tensors)", describe_argument(s))
    if s.dim() == 3 and s.shape[1] == 1:
        s = s[:, 0]  # one group: per channel
    _even_n(where, "weight_scale", s, s.shape[-1])
    return interleave_act_gate(s, s.dim() - 1)


def pack_moe_weights(weight: Weights, weight_scale: Weights, *,
                     weight_bits: int = 8) -> MoeWeight:
    """Pack expert weights once for `gemmgen.grouped_matmul_swiglu_quant`.

    weight: int8 or float8_e4m3fn [E, K, N] (or a list of E [K, N]); weight_scale: float32
    [E, N] (or a list of E [N]), on the same device. weight_bits=4 (A8W4): weight holds int4
    values -8..7 in an int8 tensor (checked: this reads the values), K even; weight_scale may
    also be per group, [E, K/group, N] (or a list of E [K/group, N]), the group size a multiple
    of 128 dividing K. N even. Returns a `MoeWeight`: [E, N, K] contiguous, or uint8
    [E, N, K/2] for int4, act and gate columns interleaved. Runs on CPU or GPU tensors."""
    return pack("pack_moe_weights", weight, weight_scale, weight_bits)


def pack(where: str, weight: Weights, weight_scale: Weights, weight_bits: int) -> MoeWeight:
    """pack_moe_weights, with errors prefixed by `where` (the op packing an unpacked weight)."""
    if type(weight_bits) is not int or weight_bits not in (8, 4):
        raise argument_error(where, "weight_bits", "8 or 4", repr(weight_bits))
    w = packed_weight(where, weight)
    s = packed_scale(where, weight_scale, weight_bits)
    e, n, k = w.shape
    if s.dim() == 3:
        problem = group_size_problem(k, s.shape[1])
        if s.shape[0] != e or s.shape[2] != n or s.device != w.device or problem:
            raise argument_error(where, "weight_scale", f"a torch.float32 tensor [E={e}, "
                                 f"K/group, N={n}] on {w.device}" + (f": {problem}" if problem else ""),
                                 describe_argument(weight_scale))
    elif tuple(s.shape) != (e, n) or s.device != w.device:
        raise argument_error(where, "weight_scale", f"a torch.float32 tensor [E={e}, N={n}] on "
                             f"{w.device} (one scale per expert and output column)",
                             describe_argument(s))
    if weight_bits == 4:
        if w.dtype != torch.int8 or k % 2:
            raise argument_error(where, "weight", "int4 values in a torch.int8 tensor [E, K, N] "
                                 "with K even (weight_bits=4)", describe_argument(weight))
        if w.is_meta:  # the values are checked below: they must exist
            raise argument_error(where, "weight", "int4 values -8..7 in a tensor with data "
                                 "(weight_bits=4 checks them), not a meta tensor",
                                 describe_argument(weight))
        if w.numel():
            lo, hi = int(w.min()), int(w.max())
            if lo < -8 or hi > 7:
                raise argument_error(where, "weight", "int4 values -8..7 (weight_bits=4)",
                                     f"values in {lo}..{hi}")
        per_group = s.dim() == 3 and s.shape[1] > 1  # K % 128 == 0 (group_size_problem)
        packed = pack_int4_mma_order(w) if per_group else pack_int4(w)
        return MoeWeight(packed.contiguous(), s, bits=4)
    return MoeWeight(w, s)
