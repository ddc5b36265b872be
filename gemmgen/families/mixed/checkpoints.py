"""Imports quantized checkpoint tensors (GPTQ v1, AWQ GEMM) into `PackedWeight`s: unpack each
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
"""

from __future__ import annotations

from typing import Optional

import torch

from .packing import PackedWeight, _describe, _error, pack_weights

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def _int32_2d(where: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 2:
        raise _error(where, name, "a 2-D torch.int32 tensor (packed checkpoint words)",
                     _describe(t))
    return t


def _same_device(where: str, reference: torch.Tensor, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != reference.device:
            raise _error(where, name, f"a tensor on {reference.device} like qweight", _describe(t))


def _slots(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [..., W] -> int32 [..., W, 32/bits]: slot i = bits i*bits .. (i+1)*bits - 1."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=words.device)
    return (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)


def _pack(where: str, q, scales, zeros, weight_type, group_size, arch, g_idx=None) -> PackedWeight:
    """pack_weights, with its errors said to come from importing this checkpoint."""
    try:
        return pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group_size,
                            g_idx=g_idx, arch=arch)
    except ValueError as error:
        raise ValueError(f"gemmgen.{where}: the checkpoint does not fit the mixed-input kernels "
                         f"(as {weight_type}, group size {group_size}, N={q.shape[0]}, "
                         f"K={q.shape[1]}): {error}") from error


def _group_size(where: str, k: int, scales: torch.Tensor, n: int) -> int:
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2 or scales.shape[1] != n:
        raise _error(where, "scales", f"a 2-D tensor [K/group_size, N={n}]", _describe(scales))
    groups = scales.shape[0]
    if groups <= 0 or k % groups:
        raise _error(where, "scales", f"[K/group_size, N] with a row count that divides K={k}",
                     _describe(scales))
    return k // groups


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              g_idx: Optional[torch.Tensor] = None, bits: int = 4, *,
              arch: Optional[str] = None) -> PackedWeight:
    """A GPTQ v1 checkpoint's tensors (format: module docstring) as a PackedWeight."""
    where = "from_gptq"
    if bits not in (4, 8) or isinstance(bits, bool):
        raise _error(where, "bits", "4 or 8 (the mixed-input kernels' weight widths)", repr(bits))
    per_word = 32 // bits
    qweight = _int32_2d(where, "qweight", qweight)
    qzeros = _int32_2d(where, "qzeros", qzeros)
    k, n = qweight.shape[0] * per_word, qweight.shape[1]
    group_size = _group_size(where, k, scales, n)
    groups = k // group_size
    if tuple(qzeros.shape) != (groups, n // per_word) or n % per_word:
        raise _error(where, "qzeros", f"shape [K/group_size={groups}, N*bits/32={n * bits / 32:g}] "
                     f"(qweight {tuple(qweight.shape)} -> K={k}, N={n})", _describe(qzeros))
    _same_device(where, qweight, qzeros=qzeros, scales=scales, g_idx=g_idx)
    if g_idx is not None and (not isinstance(g_idx, torch.Tensor) or g_idx.dim() != 1
                              or g_idx.shape[0] != k or g_idx.is_floating_point()
                              or g_idx.is_complex()):
        raise _error(where, "g_idx", f"None or an integer tensor [K={k}]", _describe(g_idx))

    # [K/p, N] -> [K/p, N, p] -> [K/p, p, N] -> [K, N]: row r slot i is k = r*p + i.
    q = _slots(qweight, bits).permute(0, 2, 1).reshape(k, n)
    zero = _slots(qzeros, bits).reshape(groups, n) + 1                 # v1: stored = zero - 1
    symmetric = 1 << (bits - 1)
    if bool((zero == symmetric).all()):
        weight_type = "uint4b8" if bits == 4 else "uint8b128"
        return _pack(where, q.t(), scales.t(), None, weight_type, group_size, arch, g_idx)
    if bits == 8:
        raise _error(where, "qzeros", "every zero point 128 (symmetric 8-bit GPTQ): the "
                     "mixed-input kernels do not support 8-bit weights with zero points "
                     "(asymmetric 8-bit)",
                     f"zero points in {int(zero.min())}..{int(zero.max())}")
    if bool((zero > 15).any()):
        raise _error(where, "qzeros", "zero points 0..15 (stored zero - 1): a v1 checkpoint stores "
                     "zero 0 as -1, which wraps to 15 and reads back as 16", "a zero point 16")
    return _pack(where, q.t(), scales.t(), zero.t(), "uint4", group_size, arch, g_idx)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *,
             arch: Optional[str] = None) -> PackedWeight:
    """An AutoAWQ GEMM checkpoint's tensors (format: module docstring) as a uint4 PackedWeight."""
    where = "from_awq"
    qweight = _int32_2d(where, "qweight", qweight)
    qzeros = _int32_2d(where, "qzeros", qzeros)
    k, n = qweight.shape[0], qweight.shape[1] * 8
    group_size = _group_size(where, k, scales, n)
    groups = k // group_size
    if tuple(qzeros.shape) != (groups, n // 8):
        raise _error(where, "qzeros", f"shape [K/group_size={groups}, N/8={n // 8}] (qweight "
                     f"{tuple(qweight.shape)} -> K={k}, N={n})", _describe(qzeros))
    _same_device(where, qweight, qzeros=qzeros, scales=scales)
    reverse = torch.tensor(AWQ_REVERSE_ORDER, device=qweight.device)

    def unpack(words: torch.Tensor) -> torch.Tensor:     # [R, N/8] -> [R, N] in column order
        slots = _slots(words, 4)                         # [R, N/8, 8], slot order
        return slots.index_select(-1, reverse).reshape(words.shape[0], n)

    q, zero = unpack(qweight), unpack(qzeros)
    return _pack(where, q.t(), scales.t(), zero.t(), "uint4", group_size, arch)
