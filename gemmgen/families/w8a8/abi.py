"""The W8A8 family's C ABI from Python: the ctypes mirror of `gemmgen_scaled_mm_args`
(gemmgen/w8a8/scaled_mm_args.h), the byte layout the ops pack it with, and the knob codes."""

from __future__ import annotations

import ctypes
import struct


class ScaledMmArgs(ctypes.Structure):
    """Mirror of `gemmgen_scaled_mm_args` (checked against the library's sizeof at load)."""

    _fields_ = [
        ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("d", ctypes.c_void_p),
        ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
        ("lda", ctypes.c_int64), ("ldb", ctypes.c_int64), ("ldd", ctypes.c_int64),
        ("scale_a", ctypes.c_void_p), ("scale_b", ctypes.c_void_p), ("bias", ctypes.c_void_p),
        ("azp_adj", ctypes.c_void_p), ("azp", ctypes.c_void_p),
        ("scale_a_per_token", ctypes.c_int32), ("scale_b_per_channel", ctypes.c_int32),
        ("raster_order", ctypes.c_int32), ("max_swizzle_size", ctypes.c_int32),
        ("split_k_slices", ctypes.c_int32), ("launch_flags", ctypes.c_int32),
    ]


# Byte layout of gemmgen_scaled_mm_args: 14 pointers / int64, then 6 int32 (the ops pack it into
# a reused buffer, cheaper than filling a ctypes.Structure field by field).
ARGS_LAYOUT = struct.Struct("=QQQqqqqqqQQQQQiiiiii")
assert ARGS_LAYOUT.size == ctypes.sizeof(ScaledMmArgs)

RASTER_CODES = {"heuristic": 0, "along_m": 1, "along_n": 2}
