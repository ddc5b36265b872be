"""The MoE family's C ABI from Python: the ctypes mirror of `gemmgen_moe_args`
(gemmgen/moe/moe_args.h) and the byte layout the op packs it with."""

from __future__ import annotations

import ctypes
import struct


class MoeArgs(ctypes.Structure):
    """Mirror of `gemmgen_moe_args` (checked against the library's sizeof at load)."""

    _fields_ = [
        ("x", ctypes.c_void_p), ("w", ctypes.c_void_p), ("w_scale", ctypes.c_void_p),
        ("x_scale", ctypes.c_void_p), ("group_list", ctypes.c_void_p), ("c", ctypes.c_void_p),
        ("q", ctypes.c_void_p), ("q_scale", ctypes.c_void_p),
        ("m", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
        ("experts", ctypes.c_int64),
        ("group_list_type", ctypes.c_int32), ("raster_order", ctypes.c_int32),
        ("max_swizzle_size", ctypes.c_int32), ("group_size", ctypes.c_int32),
        ("layout_version", ctypes.c_int32), ("launch_flags", ctypes.c_int32),
    ]


# 8 pointers, 4 int64, 6 int32.
ARGS_LAYOUT = struct.Struct("=QQQQQQQQqqqqiiiiii")
assert ARGS_LAYOUT.size == ctypes.sizeof(MoeArgs)

RASTER_CODES = {"heuristic": 0, "along_m": 1, "along_n": 2}
GROUP_LIST_CODES = {"count": 0, "cumsum": 1}
