"""Imports quantized checkpoint tensors (GPTQ v1, AWQ GEMM, compressed-tensors pack-quantized) into
`PackedWeight`s: unpack each
format to logical integers, decide the weight type, and hand over to `pack_weights` (so every
check of packing.py applies). The result is on the device of the checkpoint's qweight.

GPTQ (AutoGPTQ / GPTQModel "v1" checkpoint format, `bits` 4 or 8, p = 32 / bits values per int32):
- qweight int32 [K/p, N], packed along K: value k of column n is in row k // p, bits
  (k % p) * bits upward (low bits first);
- qzeros int32 [G, N/p], packed along N the same way, storing zero - 1 (v1's offset of 1);
- scales float16 [G, N]; g_idx int32 [K] or None (group of each k); G = K / group_size.
dequant = scale * (q - zero). All zeros 8 (4-bit) / 128 (8-bit) is GPTQ's symmetric
quantization -> `uint4b8` / `uint8b128` without zeros; other zeros -> `uint4` with zeros (4-bit)
or a ValueError (8-bit: the kernels have no 8-bit type with zero points). Act-order checkpoints
(`desc_act`: g_idx other than k // group_size, every group group_size features) are packed
with their K in group order and gather the activations in the op (packing.py, "Act-order");
scales and zeros stay indexed by group.

AWQ (AutoAWQ GEMM format, 4-bit):
- qweight int32 [K, N/8], packed along N with AWQ's interleave: nibble slot i (bits 4i..4i+3)
  of word j holds column 8j + AWQ_ORDER[i], AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]; so column
  8j + c is in slot AWQ_REVERSE_ORDER[c], AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7];
- qzeros int32 [G, N/8], packed the same way, the zero itself (no offset);
- scales float16 [G, N]. Result: `uint4` with zeros. (AutoAWQ's GEMV / Marlin formats differ.)

compressed-tensors "pack-quantized" (llm-compressor's W4A16 / W8A16 int checkpoints, `bits` 4 or 8,
p = 32 / bits values per int32; tensors named weight_packed, weight_scale, weight_zero_point,
weight_g_idx, weight_shape):
- weight_packed int32 [N, K/p], packed along K like nn.Linear.weight: value k of row n is in word
  k // p, bits (k % p) * bits upward, stored as q + 2^(bits-1) (q signed, -8..7 or -128..127);
- weight_scale [N, G] (per-channel: [N, 1]) in the model's dtype;
- weight_zero_point (asymmetric only): the signed zero points [N, G], int32 packed along N ([N/p,
  G], the same offset) or unpacked int8 [N, G];
- weight_g_idx int32 [K] or absent (actorder "group": the group of each k, as GPTQ's g_idx).
dequant = scale * (q - zero_point). Symmetric -> `uint4b8` / `uint8b128` (the stored unsigned
values, whose offset is the type's); asymmetric 4-bit -> `uint4` with zero + 8; asymmetric 8-bit
refused (no such kernel type).
"""

from __future__ import annotations

from typing import Optional

import torch

from .packing import _SCALE_DTYPES, PackedWeight, _describe, _error, pack_weights

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _int32_2d(where: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 2 or t.numel() == 0:
        raise _error(where, name, "a non-empty 2-D torch.int32 tensor (packed checkpoint words)",
                     _describe(t))
    return t


def _bits(where: str, name: str, bits) -> int:
    if type(bits) is not int or bits not in (4, 8):
        raise _error(where, name, "4 or 8 (the mixed-input kernels' weight widths)", repr(bits))
    return bits


def _scales_gn(where: str, scales, n: int) -> torch.Tensor:
    """A GPTQ / AWQ checkpoint's scales: 2-D [G, N]."""
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2 or scales.shape[1] != n:
        raise _error(where, "scales", f"a 2-D tensor [K/group_size, N={n}]", _describe(scales))
    return scales


def _same_device(where: str, reference: torch.Tensor, **tensors) -> None:
    """Tensors on the reference's device (other types are left to their own checks)."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device != reference.device:
            raise _error(where, name, f"a tensor on {reference.device} like qweight", _describe(t))


def _g_idx(where: str, name: str, g_idx, k: int) -> Optional[torch.Tensor]:
    if g_idx is not None and (not isinstance(g_idx, torch.Tensor) or g_idx.dim() != 1
                              or g_idx.shape[0] != k or g_idx.is_floating_point()
                              or g_idx.is_complex()):
        raise _error(where, name, f"None or an integer tensor [K={k}]", _describe(g_idx))
    return g_idx


def _slots(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [..., W] -> int32 [..., W, 32/bits]: slot i = bits i*bits .. (i+1)*bits - 1."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    return (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)


def _pack(where: str, q, scales, zeros, weight_type, group_size, arch, g_idx=None,
          dtype=None) -> PackedWeight:
    """pack_weights, with its errors said to come from importing this checkpoint. `dtype`: the
    activation dtype the weight will serve (the scales are rounded to it once; uint4's packed
    zero term is computed from the rounded scales, so the zeros stay exact); None: the scales'."""
    if dtype is not None:
        if dtype not in _SCALE_DTYPES:  # the activation dtypes
            raise _error(where, "dtype", "None (the checkpoint scales' dtype), torch.float16 or "
                         "torch.bfloat16 (the activation dtype the weight will serve)", repr(dtype))
        if isinstance(scales, torch.Tensor) and scales.is_floating_point():
            scales = scales.to(dtype)
    try:
        return pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group_size,
                            g_idx=g_idx, arch=arch)
    except ValueError as error:
        raise ValueError(f"gemmgen.{where}: the checkpoint does not fit the mixed-input kernels "
                         f"(as {weight_type}, group size {group_size}, N={q.shape[0]}, "
                         f"K={q.shape[1]}): {error}") from error


def _group_size(where: str, k: int, groups: int, group_size, g_idx: Optional[torch.Tensor],
                scales_name: str, g_idx_name: str) -> int:
    """The checkpoint's group size: `group_size` if given, else the features of group 0 in g_idx
    where that agrees with the G groups of the scales, else K / G. A checkpoint stores
    ceil(K / group_size) groups, so G alone is ambiguous where the group size does not divide K
    (K = 384 in groups of 256: 2 rows, read as 192); g_idx or group_size settle it, and a group
    size that does not divide K is refused (the kernels take whole groups). A g_idx that agrees
    with no group size is left to pack_weights, which names the group whose size is off."""
    name = source = None
    if group_size == -1 and type(group_size) is int:  # quantize_config.json's per-channel
        group_size = k
    if group_size is not None:
        if type(group_size) is not int or group_size <= 0:
            raise _error(where, "group_size", "None, -1 (per-channel) or a positive int (the "
                         "checkpoint's group size)", repr(group_size))
        name, source = "group_size", f"group size {group_size}"
        if -(-k // group_size) != groups:
            raise _error(where, scales_name, f"ceil(K={k} / group_size={group_size}) = "
                         f"{-(-k // group_size)} groups", f"{groups} groups")
    elif g_idx is not None:
        in_first = int((g_idx == 0).sum())     # groups are numbered from 0, group_size features each
        if in_first > 0 and -(-k // in_first) == groups:
            group_size, name = in_first, g_idx_name
            source = f"group size {in_first} (the input features of group 0)"
    if group_size is None:
        if groups <= 0 or k % groups:
            raise _error(where, scales_name, f"K/group_size groups, a group count that divides "
                         f"K={k} (or pass group_size=)", f"{groups} groups")
        return k // groups
    if k % group_size:
        raise _error(where, name, f"a group size that divides K={k} (the kernels take whole "
                     "groups)", source)
    return group_size


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              g_idx: Optional[torch.Tensor] = None, bits: int = 4, *,
              group_size: Optional[int] = None, arch: Optional[str] = None,
              dtype: Optional[torch.dtype] = None) -> PackedWeight:
    """A GPTQ v1 checkpoint's tensors (format: module docstring) as a PackedWeight. The group
    size comes from `group_size` (quantize_config.json's), else g_idx, else K / scales' rows.
    `dtype`: the activation dtype it will serve (e.g. torch.bfloat16 for a bf16 model with the
    checkpoint's float16 scales); None: the scales' own."""
    where = "from_gptq"
    bits = _bits(where, "bits", bits)
    per_word = 32 // bits
    qweight = _int32_2d(where, "qweight", qweight)
    qzeros = _int32_2d(where, "qzeros", qzeros)
    k, n = qweight.shape[0] * per_word, qweight.shape[1]
    scales = _scales_gn(where, scales, n)
    g_idx = _g_idx(where, "g_idx", g_idx, k)
    _same_device(where, qweight, qzeros=qzeros, scales=scales, g_idx=g_idx)
    group_size = _group_size(where, k, scales.shape[0], group_size, g_idx, "scales", "g_idx")
    groups = k // group_size
    if tuple(qzeros.shape) != (groups, n // per_word) or n % per_word:
        raise _error(where, "qzeros", f"shape [K/group_size={groups}, N*bits/32={n * bits / 32:g}] "
                     f"(qweight {tuple(qweight.shape)} -> K={k}, N={n})", _describe(qzeros))

    # [K/p, N] -> [K/p, N, p] -> [K/p, p, N] -> [K, N]: row r slot i is k = r*p + i.
    q = _slots(qweight, bits).permute(0, 2, 1).reshape(k, n)
    zero = _slots(qzeros, bits).reshape(groups, n) + 1                 # v1: stored = zero - 1
    symmetric = 1 << (bits - 1)
    if bool((zero == symmetric).all()):
        weight_type = "uint4b8" if bits == 4 else "uint8b128"
        return _pack(where, q.t(), scales.t(), None, weight_type, group_size, arch, g_idx, dtype)
    if bits == 8:
        raise _error(where, "qzeros", "every zero point 128 (symmetric 8-bit GPTQ): the "
                     "mixed-input kernels do not support 8-bit weights with zero points "
                     "(asymmetric 8-bit)",
                     f"zero points in {int(zero.min())}..{int(zero.max())}")
    if bool((zero > 15).any()):
        raise _error(where, "qzeros", "zero points 0..15 (stored zero - 1): a v1 checkpoint stores "
                     "zero 0 as -1, which wraps to 15 and reads back as 16", "a zero point 16")
    return _pack(where, q.t(), scales.t(), zero.t(), "uint4", group_size, arch, g_idx, dtype)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *,
             group_size: Optional[int] = None, arch: Optional[str] = None,
             dtype: Optional[torch.dtype] = None) -> PackedWeight:
    """An AutoAWQ GEMM checkpoint's tensors (format: module docstring) as a uint4 PackedWeight
    (group size: `group_size` if given, else K / scales' rows; `dtype` as from_gptq's)."""
    where = "from_awq"
    qweight = _int32_2d(where, "qweight", qweight)
    qzeros = _int32_2d(where, "qzeros", qzeros)
    k, n = qweight.shape[0], qweight.shape[1] * 8
    scales = _scales_gn(where, scales, n)
    _same_device(where, qweight, qzeros=qzeros, scales=scales)
    group_size = _group_size(where, k, scales.shape[0], group_size, None, "scales", "")
    groups = k // group_size
    if tuple(qzeros.shape) != (groups, n // 8):
        raise _error(where, "qzeros", f"shape [K/group_size={groups}, N/8={n // 8}] (qweight "
                     f"{tuple(qweight.shape)} -> K={k}, N={n})", _describe(qzeros))
    reverse = torch.tensor(AWQ_REVERSE_ORDER, device=qweight.device)

    def unpack(words: torch.Tensor) -> torch.Tensor:     # [R, N/8] -> [R, N] in column order
        slots = _slots(words, 4)                         # [R, N/8, 8], slot order
        return slots.index_select(-1, reverse).reshape(words.shape[0], n)

    q, zero = unpack(qweight), unpack(qzeros)
    return _pack(where, q.t(), scales.t(), zero.t(), "uint4", group_size, arch, dtype=dtype)


def from_compressed_tensors(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                            weight_zero_point: Optional[torch.Tensor] = None,
                            weight_g_idx: Optional[torch.Tensor] = None, *, num_bits: int = 4,
                            weight_shape=None, group_size: Optional[int] = None,
                            arch: Optional[str] = None,
                            dtype: Optional[torch.dtype] = None) -> PackedWeight:
    """A compressed-tensors pack-quantized layer's tensors (format: module docstring) as a
    PackedWeight (group size: `group_size`, else weight_g_idx, else K / weight_scale's columns;
    `dtype` as from_gptq's)."""
    where = "from_compressed_tensors"
    num_bits = _bits(where, "num_bits", num_bits)
    per_word = 32 // num_bits
    weight_packed = _int32_2d(where, "weight_packed", weight_packed)
    n, k = weight_packed.shape[0], weight_packed.shape[1] * per_word
    if weight_shape is not None:
        shape = tuple(int(v) for v in (weight_shape.tolist() if isinstance(weight_shape, torch.Tensor)
                                       else weight_shape))
        if shape != (n, k):
            raise _error(where, "weight_shape", f"[N={n}, K={k}] (weight_packed "
                         f"{tuple(weight_packed.shape)}, {num_bits}-bit: K a multiple of "
                         f"{per_word} is all the kernels take)", repr(list(shape)))
    if (not isinstance(weight_scale, torch.Tensor) or weight_scale.dim() != 2
            or weight_scale.shape[0] != n):
        raise _error(where, "weight_scale", f"a 2-D tensor [N={n}, K/group_size]",
                     _describe(weight_scale))
    weight_g_idx = _g_idx(where, "weight_g_idx", weight_g_idx, k)
    _same_device(where, weight_packed, weight_scale=weight_scale,
                 weight_zero_point=weight_zero_point, weight_g_idx=weight_g_idx)
    group_size = _group_size(where, k, weight_scale.shape[1], group_size, weight_g_idx,
                             "weight_scale", "weight_g_idx")
    groups = k // group_size
    offset = 1 << (num_bits - 1)
    q = _slots(weight_packed, num_bits).reshape(n, k)           # q + offset, 0 .. 2^bits - 1
    zero = weight_zero_point
    if zero is not None:
        if isinstance(zero, torch.Tensor) and zero.dtype == torch.int32 and zero.dim() == 2 \
                and tuple(zero.shape) == (-(-n // per_word), groups):
            zero = _slots(zero.t(), num_bits).reshape(groups, -1)[:, :n].t() - offset   # signed
        elif not (isinstance(zero, torch.Tensor) and zero.dtype == torch.int8
                  and tuple(zero.shape) == (n, groups)):
            raise _error(where, "weight_zero_point", f"None (symmetric), int32 [N*bits/32="
                         f"{-(-n // per_word)}, K/group_size={groups}] (packed along N) or int8 "
                         f"[N={n}, K/group_size={groups}]", _describe(zero))
        if not bool(zero.any()):  # zero points all 0: symmetric, served without them
            zero = None
    if zero is None:
        weight_type = "uint4b8" if num_bits == 4 else "uint8b128"
        return _pack(where, q, weight_scale, None, weight_type, group_size, arch, weight_g_idx,
                     dtype)
    if num_bits == 8:
        raise _error(where, "weight_zero_point", "None (symmetric 8-bit): the mixed-input "
                     "kernels do not support 8-bit weights with zero points (asymmetric 8-bit)",
                     _describe(weight_zero_point))
    zero = zero.to(torch.int32) + offset                            # 0..15, like q
    return _pack(where, q, weight_scale, zero, "uint4", group_size, arch, weight_g_idx, dtype)
