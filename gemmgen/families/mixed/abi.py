"""The mixed-input family's C ABI from Python: the ctypes mirror of `gemmgen_mixed_mm_args`
(gemmgen/mixed/mixed_mm_args.h) and the byte layout the op packs it with."""

from __future__ import annotations

import ctypes
import struct


class MixedMmArgs(ctypes.Structure):
    """Mirror of `gemmgen_mixed_mm_args` (checked against the library's sizeof at load)."""

    _fields_ = [
        ("a", ctypes.c_void_p), ("w", ctypes.c_void_p), ("scale", ctypes.c_void_p),
        ("zero", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("d", ctypes.c_void_p),
        ("k_perm", ctypes.c_void_p),
        ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
        ("lda", ctypes.c_int64), ("ldd", ctypes.c_int64), ("group_size", ctypes.c_int64),
        ("raster_order", ctypes.c_int32), ("max_swizzle_size", ctypes.c_int32),
        ("split_k_slices", ctypes.c_int32), ("launch_flags", ctypes.c_int32),
        ("layout_version", ctypes.c_int32),
    ]


# 7 pointers, 6 int64, 5 int32, 4 bytes of padding (the struct's 8-byte alignment).
ARGS_LAYOUT = struct.Struct("=QQQQQQQqqqqqqiiiii4x")
assert ARGS_LAYOUT.size == ctypes.sizeof(MixedMmArgs)

RASTER_CODES = {"heuristic": 0, "along_m": 1, "along_n": 2}
