"""Packs logical integer weights into the layout the mixed-input (weight-only) GEMM kernels read,
and back: `pack_weights`, `unpack_weights`, `dequantize`, and the `PackedWeight` that carries a
packed weight with its metadata. The layout is defined once here (`Sm90Layout`).

The semantics (what a packed weight means, whatever the layout)::

    out[M, N] = a[M, K] @ dequant(w)[K, N] (+ bias[N])
    dequant(w)[k, n] = scale[g, n] * (q[n, k] - offset)      symmetric types, g = k // group_size
    dequant(w)[k, n] = scale[g, n] * (q[n, k] - zero[g, n])  uint4 (asymmetric, AWQ-style)

    weight_type  q range    offset  zeros
    int4         -8..7      0       -
    uint4b8      0..15      8       -        (GPTQ symmetric 4-bit)
    uint4        0..15      -       0..15    (AWQ / GPTQ asymmetric 4-bit)
    int8         -128..127  0       -
    uint8b128    0..255     128     -        (GPTQ symmetric 8-bit)

Per-channel quantization is one group spanning K (`group_size=None` or `group_size == K`; the
packed weight stores group_size = K).

Act-order (GPTQ `desc_act`): the groups are given by `g_idx` [K], the group of each input
feature k, instead of k // group_size; every group holds exactly group_size features (GPTQ
quantizes K in a permuted order and numbers the groups along it). `pack_weights(..., g_idx=)`
stores the weight with its K in group order, `k_perm = argsort(g_idx)` (stable: ascending k
within a group), so that kernel position j holds input feature k_perm[j] and its group is
j // group_size, as the kernels expect; `mixed_mm` passes k_perm (int32) to the kernel's entry
point, which gathers the activations' columns by it (gemmgen/mixed/gather_k.cuh) and runs the
GEMM unchanged. g_idx equal to k // group_size stores no permutation.

Packed layout, version 2 (N = output features, K = input features, G = K / group_size). Every
kernel of the family reads it: the CUTLASS 3.x sm90a kernels, the family's wgmma kernel and the
direct mma.sync kernel (in sm90a and sm80 libraries alike), so archs "sm90a" and "sm80" both name
this one layout:

- stored value (a signed int that the kernel converts to the activation dtype):
  int4 -> q; uint4b8 -> q - 8; uint4 -> q - 8; int8 -> q; uint8b128 -> q - 128.
  Every 4-bit type stores -8..7 and every 8-bit type -128..127.
- `qweight`, 4-bit types: torch.uint8 [K/64, ceil(N/16), 512], in the 16-bit MMA's fragment
  order (`fragment_order` below; CUTLASS's "shuffled" mixed-input layout, example 55's
  `compute_memory_reordering_atom` with four MMA atoms along K and the value order
  [0, 2, 4, 6, 1, 3, 5, 7]). Block [kb, rb] holds rows 16 rb .. 16 rb + 15 and k = 64 kb ..
  64 kb + 63 (rows past N are zero). In it, lane (g, q) of the MMA's A fragment (g = lane / 4,
  q = lane % 4) owns the 16 bytes at 16 * lane: rows g and g + 8, and per 16-k step j the k slots
  2q, 2q+1, 2q+8, 2q+9 (k = 64 kb + 16 j + slot). The 32-bit word j of those 16 bytes holds step
  j's eight values, nibble i (bits 4i..4i+3, each the two's-complement int4 of the stored value)
  holding fragment value [0, 2, 4, 6, 1, 3, 5, 7][i] of the step, where fragment value 2r + h is
  register r's half h: register 0 (row g, slots 2q, 2q+1), 1 (row g + 8, the same slots), 2 (row
  g, slots 2q+8, 2q+9), 3 (row g + 8, those). So a lane gets a 16-k step's four MMA registers
  from one word with a shift and a mask each (no byte permutes), and a row block's 64-k step
  from one 16-byte load. Element (n, k) is nibble 128 r0 + r1 + 4 k0 + 32 k1 + 2 k2 + 8 j of its
  block, with n = 16 rb + 8 r1 + r0 and k = 64 kb + 16 j + 8 k2 + 2 k1 + k0; nibble 2i is the
  low nibble of byte i.
- `qweight`, 8-bit types: torch.int8 [N, K], the stored value, K contiguous (unchanged from
  version 1).
- `scales`: [G, N] contiguous (N fastest), in the scale dtype (float16 or bfloat16: the dtype of
  the activations this weight serves).
- `zeros` (uint4 only, else None): [G, N] contiguous in the scale dtype, holding
  ``zp = scale * (8 - zero)`` (= -scale * (zero - 8)), computed in float32 and rounded once to
  the scale dtype. The kernel computes ``stored * scale + zp``; with stored = q - 8 that is
  ``scale * (q - 8) + scale * (8 - zero) = scale * (q - zero)``, exact up to the one rounding
  of zp (relative error <= 2^-11 for float16, 2^-8 for bfloat16, of |scale * (8 - zero)|).
  `unpack_weights` recovers the integer zero as ``round(8 - zp / scale)`` in float32: the
  rounding error of zp is at most 8 * 2^-8 = 1/32 of a step, far below 1/2, so the recovery is
  exact for every zero 0..15 and every finite non-zero scale whose zp does not overflow
  (subnormal scales included: zp is then an exact multiple of the same subnormal step).
  Scales that are 0 (zero unrecoverable) or make zp overflow are refused when packing uint4.

Alignment (checked by `pack_weights`): K a multiple of 64 (the kernels' tile K for 16-bit
activations and the 4-bit blocks' K; this also makes K even), N a multiple of 8 (16-byte TMA
alignment of the scales, zeros and the output rows in a 16-bit dtype), group_size a multiple of 64
that divides K, K itself, or 32 (GPTQ's group 32: kernels of their own, the `_g32` schemes; the
layout does not depend on the group size).

Version 1 (before) stored 4-bit weights [N, K/2] K-major, even k in the low nibble. The fragment
order made CUTLASS's mixed-input kernels 10-25% faster (benchmarks/RESULTS.md, session 16) and
lets the family's own kernels load a lane's weights with one wide load and convert them without
byte permutes. Weights packed with version 1 are refused: re-pack them from the logical values
(`pack_weights`) or the checkpoint (`PackedWeight.from_gptq` / `from_awq`).

Why no sm80-specific (TRT-LLM interleaved) layout: the fragment order is the mma.sync m16n8k16
A fragment's as well (wgmma's register A operand repeats it per warp), which is what the
interleave buys on sm80.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch

from ... import arch as arch_policy
from ... import state_dicts
from ...errors import argument_error, describe_argument
from .configs import G32_GROUP, group_size_fits

WEIGHT_TYPES = ("int4", "uint4b8", "uint4", "int8", "uint8b128")
LAYOUT_VERSION = 2
ARCH_LAYOUTS = ("sm90a", "sm80")

TILE_K = 64          # the sm90a kernels' tile K for 16-bit activations: K and group_size multiples
N_ALIGN = 8          # 16 bytes of a 16-bit dtype: TMA alignment of scales / zeros / output rows
BLOCK_ROWS = 16      # a 4-bit block: 16 rows (the MMA's M a warp) x 64 k, 512 bytes
BLOCK_BYTES = BLOCK_ROWS * TILE_K // 2

_SCALE_DTYPES = (torch.float16, torch.bfloat16)
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)

# weight_type -> (bits, lowest logical q, highest logical q, offset subtracted to store it)
_TYPES: dict[str, tuple[int, int, int, int]] = {
    "int4": (4, -8, 7, 0),
    "uint4b8": (4, 0, 15, 8),
    "uint4": (4, 0, 15, 8),       # stored = q - 8; the zero point goes into `zeros` as zp
    "int8": (8, -128, 127, 0),
    "uint8b128": (8, 0, 255, 128),
}
_ZERO_RANGE = (0, 15)           # uint4 zero points


_describe = describe_argument
_error = argument_error


def _dtype_list(dtypes) -> str:
    return ", ".join(str(d) for d in dtypes)


def bits_of(weight_type: str) -> int:
    """4 or 8: the width of one weight element of `weight_type`."""
    return _TYPES[weight_type][0]


def q_range(weight_type: str) -> tuple[int, int]:
    """The logical values q of `weight_type` may take (inclusive)."""
    _, low, high, _ = _TYPES[weight_type]
    return low, high


def default_arch(device=None) -> str:
    """The packed layout for the GPU that will run the kernels: the one place that decides it.

    `device`: the device of the weight; a CPU tensor (or None) asks about the current CUDA
    device, if any. Capability 9.0 -> "sm90a"; 8.x -> "sm80"; no GPU (or one without a layout
    here) -> "sm90a". Both name layout version 2 today (see the module docstring).
    """
    device = torch.device(device) if device is not None else None
    capability = None
    if device is not None and device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
    elif torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
    if capability is not None:
        best = arch_policy.best_arch_for(capability)
        if best in ARCH_LAYOUTS:
            return best
    return ARCH_LAYOUTS[0]


def _check_arch(where: str, arch, none_means_default: bool = True) -> str:
    if arch not in ARCH_LAYOUTS:
        default = " or None" if none_means_default else ""
        raise _error(where, "arch", f"one of {', '.join(ARCH_LAYOUTS)}{default}", repr(arch))
    return arch


def fragment_order(stored: torch.Tensor) -> torch.Tensor:
    """4-bit stored values [N, K] (any integer dtype, -8..7) -> the packed bytes of layout
    version 2, uint8 [K/64, ceil(N/16), 512] (the module docstring)."""
    n, k = stored.shape
    blocks = -(-n // BLOCK_ROWS)
    padded = torch.zeros((blocks * BLOCK_ROWS, k), dtype=torch.int16, device=stored.device)
    padded[:n] = stored.to(torch.int16)
    # n = 16 rb + 8 r1 + r0; k = 64 kb + 16 j + 8 k2 + 2 k1 + k0
    v = padded.reshape(blocks, 2, 8, k // TILE_K, 4, 2, 4, 2)  # rb r1 r0 kb j k2 k1 k0
    # nibble = 128 r0 + 32 k1 + 8 j + 4 k0 + 2 k2 + r1: most significant first
    nibbles = (v.permute(3, 0, 2, 6, 4, 7, 5, 1) & 0xF).reshape(k // TILE_K, blocks, 2 * BLOCK_BYTES)
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).to(torch.uint8).contiguous()


def from_fragment_order(qweight: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of `fragment_order`: the stored values, int32 [N, K] (sign-extended)."""
    k_blocks, blocks, _ = qweight.shape
    b = qweight.to(torch.int32)
    nibbles = torch.stack((b & 0xF, (b >> 4) & 0xF), dim=-1)          # byte i -> nibbles 2i, 2i+1
    v = nibbles.reshape(k_blocks, blocks, 8, 4, 4, 2, 2, 2)            # kb rb r0 k1 j k0 k2 r1
    v = v.permute(1, 7, 2, 0, 4, 6, 3, 5).reshape(blocks * BLOCK_ROWS, k_blocks * TILE_K)
    return ((v ^ 8) - 8)[:n]                                            # sign-extend int4


class Sm90Layout:
    """Layout version 2 (see the module docstring), for archs "sm90a" and "sm80": the one
    definition that `pack_weights` writes, `unpack_weights` reads, and the C++ kernels consume
    (gemmgen/mixed/sm90_mixed_mm.hpp spells the 4-bit block as a CuTe layout, the family's own
    kernels address it by hand)."""

    version = 2
    arch = "sm90a"

    @staticmethod
    def offset(weight_type: str) -> int:
        """What is subtracted from the logical q to store it (8 for uint4: its zero is in zp)."""
        return _TYPES[weight_type][3]

    @staticmethod
    def qweight_spec(weight_type: str, n: int, k: int) -> tuple[torch.dtype, tuple[int, ...]]:
        """(dtype, shape) of the packed qweight."""
        if bits_of(weight_type) == 8:
            return torch.int8, (n, k)
        return torch.uint8, (k // TILE_K, -(-n // BLOCK_ROWS), BLOCK_BYTES)

    @staticmethod
    def pack_q(q: torch.Tensor, weight_type: str) -> torch.Tensor:
        """Logical q [N, K] (values in range) -> qweight."""
        stored = q.to(torch.int16) - Sm90Layout.offset(weight_type)
        if bits_of(weight_type) == 8:
            return stored.to(torch.int8).contiguous()
        return fragment_order(stored)

    @staticmethod
    def unpack_q(qweight: torch.Tensor, weight_type: str, n: int) -> torch.Tensor:
        """qweight -> logical q, int32 [N, K]."""
        offset = Sm90Layout.offset(weight_type)
        if bits_of(weight_type) == 8:
            return qweight.to(torch.int32) + offset
        return from_fragment_order(qweight, n) + offset

    @staticmethod
    def zp_from_zero(zero: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """zp = scale * (8 - zero), in float32 and rounded once to scale's dtype (same shapes)."""
        return (scale.float() * (8 - zero.float())).to(scale.dtype)

    @staticmethod
    def zero_from_zp(zp: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """The integer zero point back from zp: round(8 - zp / scale) in float32, as int32."""
        return torch.round(8 - zp.float() / scale.float()).to(torch.int32)


_LAYOUTS = {"sm90a": Sm90Layout, "sm80": Sm90Layout}


def same_layout(arch_a: str, arch_b: str) -> bool:
    """Whether weights packed for `arch_a` can be read by kernels built for `arch_b`."""
    return arch_a in _LAYOUTS and _LAYOUTS.get(arch_a) is _LAYOUTS.get(arch_b)


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """A weight packed for the mixed-input GEMM: the tensors the kernel reads plus what they mean.

    A plain Python object (not a tensor subclass); equality is identity. Construction checks
    that tensors and metadata agree (shapes, dtypes, devices; no data is read but an act-order
    weight's k_perm, and that only in plain tensors, so it works on meta / fake tensors). Build
    one with `pack_weights`, `PackedWeight.from_gptq`, `.from_awq` or `.from_compressed_tensors`.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: Optional[torch.Tensor]
    weight_type: str
    group_size: int
    k: int
    n: int
    layout_version: int = LAYOUT_VERSION
    arch: str = "sm90a"
    # act-order: kernel position j of K holds input feature k_perm[j] (int32 [K], a permutation
    # of 0..K-1, on qweight's device: the kernels' gather reads it); None: the identity
    k_perm: Optional[torch.Tensor] = None

    def __post_init__(self):
        where = "PackedWeight"
        if self.weight_type not in WEIGHT_TYPES:
            raise _error(where, "weight_type", f"one of {', '.join(WEIGHT_TYPES)}",
                         repr(self.weight_type))
        _check_arch(where, self.arch, none_means_default=False)
        if self.layout_version != LAYOUT_VERSION:
            raise _error(where, "layout_version", f"{LAYOUT_VERSION} (the layout this gemmgen "
                         "reads and writes)", repr(self.layout_version))
        for name in ("k", "n", "group_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise _error(where, name, "a positive int", repr(value))
        k, n, g = self.k, self.n, self.group_size
        if k % TILE_K:
            raise _error(where, "k", f"a multiple of {TILE_K} (the packed blocks' K)", k)
        if k % g:
            raise _error(where, "group_size", f"a divisor of k={k}", g)
        dtype, shape = _LAYOUTS[self.arch].qweight_spec(self.weight_type, n, k)
        tensors = (("qweight", self.qweight), ("scales", self.scales), ("zeros", self.zeros))
        for name, t in tensors:
            if t is not None and not isinstance(t, torch.Tensor):
                raise _error(where, name, "a torch.Tensor", _describe(t))
        q = self.qweight
        if q is None or q.dtype != dtype or tuple(q.shape) != shape or not q.is_contiguous():
            raise _error(where, "qweight", f"a contiguous {dtype} tensor of shape {list(shape)} "
                         f"({self.weight_type}, n={n}, k={k})", _describe(q))
        s = self.scales
        if (s is None or s.dtype not in _SCALE_DTYPES or tuple(s.shape) != (k // g, n)
                or not s.is_contiguous()):
            raise _error(where, "scales", f"a contiguous float16 or bfloat16 tensor of shape "
                         f"[K/group_size={k // g}, N={n}]", _describe(s))
        z = self.zeros
        if self.weight_type == "uint4":
            if (z is None or z.dtype != s.dtype or tuple(z.shape) != (k // g, n)
                    or not z.is_contiguous()):
                raise _error(where, "zeros", f"a contiguous {s.dtype} tensor of shape "
                             f"[{k // g}, {n}] (zp = scale * (8 - zero)) for uint4", _describe(z))
        elif z is not None:
            raise _error(where, "zeros", f"None for {self.weight_type} (only uint4 has zero "
                         "points)", _describe(z))
        for name, t in tensors[1:]:
            if t is not None and t.device != q.device:
                raise _error(where, name, f"a tensor on {q.device} like qweight", _describe(t))
        if self.k_perm is not None:
            _check_k_perm(where, self.k_perm, k, q.device)

    @property
    def bits(self) -> int:
        """4 or 8."""
        return bits_of(self.weight_type)

    @property
    def has_zeros(self) -> bool:
        return self.zeros is not None

    @property
    def scale_dtype(self) -> torch.dtype:
        """The dtype of the scales: the activation (and output) dtype this weight serves."""
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def num_groups(self) -> int:
        return self.k // self.group_size

    @property
    def act_order(self) -> bool:
        """Whether K is stored in another order than the input features' (GPTQ desc_act)."""
        return self.k_perm is not None

    @property
    def g_idx(self) -> torch.Tensor:
        """The group of each input feature k, int64 [K] (k // group_size without act-order)."""
        groups = torch.arange(self.k, device=self.device) // self.group_size
        if self.k_perm is None:
            return groups
        return torch.empty_like(groups).index_copy_(0, self.k_perm.long(), groups)

    def to(self, device, non_blocking: bool = False) -> "PackedWeight":
        """The same packed weight with every tensor on `device` (self if already there)."""
        device = torch.device(device)
        if self.qweight.device == device:
            return self

        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return dataclasses.replace(self, qweight=move(self.qweight), scales=move(self.scales),
                                   zeros=move(self.zeros), k_perm=move(self.k_perm))

    @classmethod
    def from_gptq(cls, qweight, qzeros, scales, g_idx=None, bits: int = 4, *,
                  group_size: Optional[int] = None, arch: Optional[str] = None,
                  dtype: Optional[torch.dtype] = None) -> "PackedWeight":
        """An AutoGPTQ / GPTQModel v1 checkpoint tensor set (see checkpoints.from_gptq;
        `dtype`: the activation dtype it will serve, None: the scales')."""
        from .checkpoints import from_gptq
        return from_gptq(qweight, qzeros, scales, g_idx, bits, group_size=group_size, arch=arch,
                         dtype=dtype)

    @classmethod
    def from_awq(cls, qweight, qzeros, scales, *, group_size: Optional[int] = None,
                 arch: Optional[str] = None, dtype: Optional[torch.dtype] = None) -> "PackedWeight":
        """An AutoAWQ GEMM-format checkpoint tensor set (see checkpoints.from_awq)."""
        from .checkpoints import from_awq
        return from_awq(qweight, qzeros, scales, group_size=group_size, arch=arch, dtype=dtype)

    @classmethod
    def from_compressed_tensors(cls, weight_packed, weight_scale, weight_zero_point=None,
                                weight_g_idx=None, *, num_bits: int = 4, weight_shape=None,
                                group_size: Optional[int] = None, arch: Optional[str] = None,
                                dtype: Optional[torch.dtype] = None) -> "PackedWeight":
        """A compressed-tensors pack-quantized layer (llm-compressor W4A16 / W8A16; see
        checkpoints.from_compressed_tensors)."""
        from .checkpoints import from_compressed_tensors
        return from_compressed_tensors(weight_packed, weight_scale, weight_zero_point, weight_g_idx,
                                       num_bits=num_bits, weight_shape=weight_shape,
                                       group_size=group_size, arch=arch, dtype=dtype)

    def state_dict(self, prefix: str = "") -> dict:
        """What to save (gemmgen/state_dicts.py): the tensors qweight, scales, and zeros and
        k_perm where present, under `prefix` + their names, and the metadata as strings;
        `PackedWeight.from_state_dict(state, prefix)` reads it back."""
        tensors = {"qweight": self.qweight, "scales": self.scales, "zeros": self.zeros,
                   "k_perm": self.k_perm}
        return state_dicts.entries(prefix, "PackedWeight", tensors, weight_type=self.weight_type,
                                   group_size=self.group_size, k=self.k, n=self.n,
                                   layout_version=self.layout_version, arch=self.arch)

    @classmethod
    def from_state_dict(cls, state, prefix: str = "") -> "PackedWeight":
        """The PackedWeight that `state_dict(prefix)` saved (from torch.load(weights_only=True) or
        safetensors' tensors plus its metadata), on the tensors' device; checked like any."""
        read = state_dicts.StateReader(state, prefix, "PackedWeight", "PackedWeight.from_state_dict")
        return cls(qweight=read.tensor("qweight"), scales=read.tensor("scales"),
                   zeros=read.tensor("zeros", optional=True),
                   weight_type=read.string("weight_type", WEIGHT_TYPES),
                   group_size=read.integer("group_size"), k=read.integer("k"), n=read.integer("n"),
                   layout_version=read.integer("layout_version"), arch=read.string("arch"),
                   k_perm=read.tensor("k_perm", optional=True))

    def describe(self) -> str:
        """One line: type, shape, groups, zeros, scale dtype, layout, device."""
        group = "per-channel" if self.group_size == self.k else f"group {self.group_size}"
        zeros = ", zero points" if self.has_zeros else ""
        order = ", act-order" if self.act_order else ""
        scale = str(self.scale_dtype).removeprefix("torch.")
        return (f"PackedWeight {self.weight_type} [N={self.n}, K={self.k}], {group}{zeros}{order}, "
                f"{scale} scales, {self.arch} layout v{self.layout_version}, on {self.device}")

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


def _check_k_perm(where: str, k_perm, k: int, device: torch.device) -> None:
    """A PackedWeight's k_perm: int32 [K] on qweight's device, a permutation of 0..K-1 (read
    only for plain tensors with data: meta and fake tensors are checked by shape alone)."""
    if (not isinstance(k_perm, torch.Tensor) or k_perm.dtype != torch.int32 or k_perm.dim() != 1
            or k_perm.shape[0] != k or not k_perm.is_contiguous()):
        raise _error(where, "k_perm", f"None or a contiguous torch.int32 tensor [K={k}] (the "
                     "input feature at each kernel position of K)", _describe(k_perm))
    if k_perm.device != device:
        raise _error(where, "k_perm", f"a tensor on {device} like qweight", _describe(k_perm))
    # NOTES: the op's gather kernel reads a's columns at k_perm's values unchecked (an index out
    # of range would read out of bounds), so anything but a permutation is refused here.
    if type(k_perm) is torch.Tensor and not k_perm.is_meta:
        if not torch.equal(torch.sort(k_perm).values,
                           torch.arange(k, dtype=torch.int32, device=k_perm.device)):
            raise _error(where, "k_perm", f"a permutation of 0..{k - 1} (each once)",
                         "repeated or out-of-range values")


def _k_perm_from_g_idx(where: str, g_idx, k: int, group_size: int,
                       device: torch.device) -> Optional[torch.Tensor]:
    """pack_weights' `g_idx` (group of each input feature) -> the kernels' K order: None for
    k // group_size, else argsort(g_idx), stable; every group must hold group_size features."""
    if g_idx is None:
        return None
    groups = k // group_size
    if (not isinstance(g_idx, torch.Tensor) or g_idx.dtype not in _INT_DTYPES or g_idx.dim() != 1
            or g_idx.shape[0] != k):
        raise _error(where, "g_idx", f"None or an integer tensor [K={k}] (the group of each input "
                     "feature, GPTQ act-order)", _describe(g_idx))
    if g_idx.device != device:
        raise _error(where, "g_idx", f"a tensor on {device} like q", _describe(g_idx))
    g_idx = g_idx.to(torch.int64)
    _check_range(where, "g_idx", g_idx, 0, groups - 1, f"group index (K/group_size={groups} groups)")
    counts = torch.bincount(g_idx, minlength=groups)
    if not bool((counts == group_size).all()):
        group = int(torch.nonzero(counts != group_size)[0, 0])
        raise _error(where, "g_idx", f"every group 0..{groups - 1} given exactly group_size="
                     f"{group_size} input features (as GPTQ's act-order numbers them)",
                     f"group {group} with {int(counts[group])}")
    k_perm = torch.argsort(g_idx, stable=True)
    if torch.equal(k_perm, torch.arange(k, device=device)):
        return None
    return k_perm.to(torch.int32)


def _check_range(where: str, name: str, t: torch.Tensor, low: int, high: int, what: str) -> None:
    lo, hi = int(t.min()), int(t.max())
    if lo < low or hi > high:
        raise _error(where, name, f"{what} values in {low}..{high}", f"values in {lo}..{hi}")


def pack_weights(q: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor] = None, *,
                 weight_type: str, group_size: Optional[int], g_idx: Optional[torch.Tensor] = None,
                 arch: Optional[str] = None) -> PackedWeight:
    """Pack a logical integer weight for the mixed-input GEMM (layout: see the module docstring).

    q: [N, K] like nn.Linear.weight, an integer dtype holding the logical values of
       `weight_type` (e.g. 0..15 for uint4b8).
    scales: [N, K/group_size] (per-channel: also [N]), float16 or bfloat16; this dtype is the
       activation dtype the packed weight serves.
    zeros: [N, K/group_size] (per-channel: also [N]) integer zero points 0..15, uint4 only
       (required there, refused for every other type).
    group_size: a multiple of 64 that divides K, 32 (GPTQ group 32), or K / None (per-channel).
    g_idx: None, or the group of each input feature, an integer tensor [K] (GPTQ act-order:
       every group exactly group_size features); zeros and scales are indexed by it.
    arch: the packed layout; None: `default_arch(q.device)`.

    Returns a PackedWeight on q's device. Every bad argument raises ValueError naming it.
    """
    where = "pack_weights"
    if weight_type not in WEIGHT_TYPES:
        raise _error(where, "weight_type", f"one of {', '.join(WEIGHT_TYPES)}", repr(weight_type))
    if not isinstance(q, torch.Tensor) or q.dim() != 2:
        raise _error(where, "q", "a 2-D integer tensor [N, K] (like nn.Linear.weight)",
                     _describe(q))
    arch = _check_arch(where, default_arch(q.device) if arch is None else arch)
    if q.dtype not in _INT_DTYPES:
        raise _error(where, "q", f"an integer dtype ({_dtype_list(_INT_DTYPES)})", _describe(q))
    n, k = q.shape
    if k <= 0 or k % TILE_K:
        raise _error(where, "q", f"K (dim 1) a positive multiple of {TILE_K} (the sm90a kernels' "
                     "tile K)", _describe(q))
    if n <= 0 or n % N_ALIGN:
        raise _error(where, "q", f"N (dim 0) a positive multiple of {N_ALIGN} (16-byte TMA "
                     "alignment of the 16-bit scales and output rows)", _describe(q))
    if group_size is None:
        group_size = k
    if (not isinstance(group_size, int) or isinstance(group_size, bool)
            or not group_size_fits(group_size, k)):
        raise _error(where, "group_size", f"{G32_GROUP}, a multiple of {TILE_K} (the sm90a "
                     f"kernels' tile K for 16-bit activations) that divides K={k}, or K itself "
                     "(per-channel)", repr(group_size))
    groups = k // group_size

    def grouped(name: str, t, dtypes, what: str) -> torch.Tensor:
        """[N, G] (or [N] when per-channel) -> [N, G]; checks type, dtype, shape, device."""
        if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:
            raise _error(where, name, f"{what} tensor ({_dtype_list(dtypes)})", _describe(t))
        if t.dim() == 1 and groups == 1 and t.shape[0] == n:
            t = t.reshape(n, 1)
        if tuple(t.shape) != (n, groups):
            per_channel = " or [N]" if groups == 1 else ""
            raise _error(where, name, f"shape [N={n}, K/group_size={groups}]{per_channel}",
                         _describe(t))
        if t.device != q.device:
            raise _error(where, name, f"a tensor on {q.device} like q", _describe(t))
        return t

    scales = grouped("scales", scales, _SCALE_DTYPES, "a float16 or bfloat16")
    if weight_type == "uint4":
        if zeros is None:
            raise _error(where, "zeros", "integer zero points [N, K/group_size] for uint4", "None")
        zeros = grouped("zeros", zeros, _INT_DTYPES, "an integer")
    elif zeros is not None:
        raise _error(where, "zeros", f"None for {weight_type} (symmetric: its offset is fixed; "
                     "only uint4 takes zero points)", _describe(zeros))

    k_perm = _k_perm_from_g_idx(where, g_idx, k, group_size, q.device)
    low, high = q_range(weight_type)
    _check_range(where, "q", q, low, high, weight_type)
    if not bool(torch.isfinite(scales).all()):
        raise _error(where, "scales", "finite values", "NaN or Inf")
    layout = _LAYOUTS[arch]
    scales_gn = scales.t().contiguous()
    zp = None
    if zeros is not None:
        _check_range(where, "zeros", zeros, *_ZERO_RANGE, "uint4 zero-point")
        if bool((scales == 0).any()):
            raise _error(where, "scales", "non-zero values for uint4 (a zero point cannot be "
                         "recovered from zp = scale * (8 - zero) when scale is 0)", "a 0")
        zp = layout.zp_from_zero(zeros.t(), scales_gn).contiguous()
        if not bool(torch.isfinite(zp).all()):
            big = float(scales.float().abs().max())
            raise _error(where, "scales", f"|scale * (8 - zero)| within {scales.dtype}'s range "
                         "(zp = scale * (8 - zero) is stored in the scale dtype)",
                         f"max |scale| {big:g}, which overflows")
    if k_perm is not None:  # K in group order: kernel position j is input feature k_perm[j]
        q = q.index_select(1, k_perm)
    packed = PackedWeight(qweight=layout.pack_q(q, weight_type), scales=scales_gn, zeros=zp,
                          weight_type=weight_type, group_size=group_size, k=k, n=n,
                          layout_version=layout.version, arch=arch, k_perm=k_perm)
    if packed.qweight.is_cuda:
        # The packing kernels finish before any later kernel runs: the family's kernels read
        # packed weights before their programmatic-dependent-launch wait (a packed weight is a
        # constant), which makes only a finished kernel's writes safe to read. (The checks above
        # synchronize already; packing is a load-time step.)
        torch.cuda.current_stream(packed.qweight.device).synchronize()
    return packed


def unpack_weights(packed: PackedWeight
                   ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The exact inverse of `pack_weights`: (q, scales, zeros) on the packed weight's device.

    q: int32 [N, K] logical values, in input-feature order; scales: [N, K/group_size] in the
    scale dtype; zeros: int32 [N, K/group_size] (uint4) or None. With act-order, q's columns
    belong to the groups `packed.g_idx` (pass it to `pack_weights` as g_idx to pack them again).
    """
    if not isinstance(packed, PackedWeight):
        raise _error("unpack_weights", "packed", "a PackedWeight", _describe(packed))
    if packed.layout_version != LAYOUT_VERSION:  # e.g. unpickled from an older gemmgen
        raise _error("unpack_weights", "packed", f"a weight packed with layout version "
                     f"{LAYOUT_VERSION} (re-pack it from the logical values or the checkpoint)",
                     f"layout version {packed.layout_version}")
    layout = _LAYOUTS[packed.arch]
    q = layout.unpack_q(packed.qweight, packed.weight_type, packed.n)
    if packed.k_perm is not None:  # back to input-feature order
        q = torch.empty_like(q).index_copy_(1, packed.k_perm.long(), q)
    zeros = None
    if packed.zeros is not None:
        zeros = layout.zero_from_zp(packed.zeros, packed.scales).t().contiguous()
    return q, packed.scales.t().contiguous(), zeros


def dequantize(packed: PackedWeight) -> torch.Tensor:
    """The dequantized weight, float32 [K, N] (transposed: the B operand of a @ w).

    scale[g, n] * (q - offset) or scale[g, n] * (q - zero[g, n]) with g = g_idx[k] (k //
    group_size without act-order), from `unpack_weights`, rows in input-feature order; exact in
    float32 (a 16-bit scale times an integer of at most 9 bits).
    """
    if not isinstance(packed, PackedWeight):
        raise _error("dequantize", "packed", "a PackedWeight", _describe(packed))
    q, scales, zeros = unpack_weights(packed)
    g_idx = packed.g_idx
    if zeros is not None:
        q = q - zeros.index_select(1, g_idx)
    else:
        q = q - _TYPES[packed.weight_type][3]
    w = q.float() * scales.float().index_select(1, g_idx)
    return w.t().contiguous()
