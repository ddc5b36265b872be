"""CUTLASS 2.x (sm80) legality rules for a tile config, checked before anything compiles.

Each check returns (manifest key, message) pairs, like sm90_rules, so errors point at a line.
"""

from __future__ import annotations

from .configs import Sm80TileConfig

# Dynamic shared memory per block: 163 KiB on A100 (sm80); 99 KiB on sm86/sm89 parts.
SMEM_LIMIT_BYTES = 166_912
SMEM_LIMIT_SM86_BYTES = 101_376
INSTRUCTION_FOR = {"int8": (16, 8, 32)}
_MAX_WARPS = 16

Problem = tuple[str, str]


def shared_memory_bytes(config: Sm80TileConfig, operand_bytes: int = 1) -> int:
    """Mainloop staging: stages × (A tile + B tile); the epilogue reuses that memory."""
    tm, tn, tk = config.tile
    return config.stages * (tm * tk + tn * tk) * operand_bytes


def check_config(config: Sm80TileConfig, a_dtype: str) -> list[Problem]:
    problems: list[Problem] = []
    tm, tn, tk = config.tile
    wm, wn, wk = config.warp
    im, in_, ik = config.instruction
    expected = INSTRUCTION_FOR.get(a_dtype)
    if expected is None:
        problems.append(("dtypes", f"sm80 kernels take int8 operands; got a={a_dtype}"))
        return problems
    if config.instruction != expected:
        problems.append(("instruction", f"{a_dtype} tensor-core MMA on sm80 is "
                                        f"{'x'.join(map(str, expected))}; got {'x'.join(map(str, config.instruction))}"))
        return problems  # the checks below divide by the instruction shape
    for dim, t, w in zip("MNK", config.tile, config.warp):
        if w <= 0 or t % w:
            problems.append(("warp", f"warp {dim} ({w}) must divide the threadblock tile {dim} ({t})"))
    if wm % im or wn % in_ or wk % ik:
        problems.append(("warp", f"warp tile {wm}x{wn}x{wk} must be a multiple of the instruction "
                                 f"{im}x{in_}x{ik}"))
    if tk % 32 or not 32 <= tk <= 256:
        problems.append(("tile", f"tile K must be a multiple of 32 in [32, 256] for int8; got {tk}"))
    if tm % 16 or tn % 16 or not (16 <= tm <= 256 and 16 <= tn <= 256):
        problems.append(("tile", f"tile M and N must be multiples of 16 in [16, 256]; got {tm}x{tn}"))
    if not problems:
        warps = (tm // wm) * (tn // wn) * (tk // wk)  # sliced-K warps count too
        if warps > _MAX_WARPS:
            problems.append(("warp", f"{tm}x{tn}x{tk} / {wm}x{wn}x{wk} gives {warps} warps "
                                     f"({32 * warps} threads); at most {_MAX_WARPS}"))
    if config.split_k != "none" and config.swizzle == "streamk":
        problems.append(("split_k", "split-K and the stream-K swizzle both divide K; pick one "
                                    "(stream-K balances the split itself)"))
    smem = shared_memory_bytes(config)
    if smem > SMEM_LIMIT_BYTES:
        problems.append(("stages", f"{config.stages} stages of tile {tm}x{tn}x{tk} need "
                                   f"{config.stages} x {(tm + tn) * tk} = {smem} bytes of shared memory, over "
                                   f"the sm80 limit of {SMEM_LIMIT_BYTES}; use fewer stages or a smaller tile"))
    return problems
