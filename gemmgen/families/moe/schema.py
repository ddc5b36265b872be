"""The MoE family's manifest schema and sm90a legality rules, checked before anything compiles
(file:line errors).

    - op: grouped_matmul_swiglu_quant
      dtypes: [int8, e4m3, {x: int8, w: int4}]   # x (= q); w defaults to x; int4: A8W4
      configs:
        - {name: decode, tile: [128, 16, 128], cluster: [1, 1, 1], schedule: pingpong,
           swap_ab: true, intermediate: fp32, stages: auto, raster: heuristic, swizzle: 1}
        - {name: large_fused, tile: [128, 256, 128], cluster: [2, 1, 1],
           schedule: cooperative, fused: true}

`fused: true` does SwiGLU in the GEMM's epilogue (S stored in fp32, the row max reduced by
atomics, then a light quant pass) instead of writing C for a separate SwiGLU kernel; fused
configs are not swap-AB (act/gate pairs are adjacent columns of a tokens-by-N tile), their
intermediate is fp32, and the weight is not int4.

With `swap_ab: true` the tile is in the kernel's terms C_iᵀ = W_i · X_iᵀ: tile M runs over the
weight's N, tile N over an expert's tokens (a narrow tile N serves decode). int4 weights need
`swap_ab: true` (CUTLASS's mixed-input mainloop converts its A operand in registers).
"""

from __future__ import annotations

from typing import Any

from ...generator import sm90_schema
from ...generator.kernel_config import ConfigEntry
from .configs import ELEMENTS, INTERMEDIATES, PAIRS, SCHEDULES, WEIGHTS, MoeTileConfig

FAMILY_KEYS = frozenset({"dtypes"})
REQUIRED_FAMILY_KEYS = frozenset({"dtypes"})
CONFIG_KEYS = frozenset({"name", "tile", "cluster", "schedule", "stages", "swap_ab",
                         "intermediate", "raster", "swizzle", "fused"})
TILE_K = 128  # 128 bytes of 8-bit elements: one swizzle atom
_C_BYTES = {"fp32": 4, "bf16": 2}


def _pair(reader, fam, entry, i: int, line: int) -> tuple[str, str]:
    """One `dtypes` entry: a scalar x (w = x) or a mapping {x: ..., w: ...}."""
    if not isinstance(entry, dict):
        if entry not in ELEMENTS:
            raise reader.error(fam, "dtypes", f"unknown value {entry!r}; expected one of "
                                              f"{', '.join(ELEMENTS)} or a mapping {{x: int8, w: int4}}")
        return entry, entry
    d = reader.mapping(entry, f"dtypes[{i}]", ("x", "w"), ("x",), line=line)
    x = reader.choice(d, "x", ELEMENTS)
    w = reader.choice(d, "w", WEIGHTS, x)
    if (x, w) not in PAIRS:
        raise reader.error(d, "w", f"the kernels serve (x, w) = "
                                   f"{', '.join(f'({a}, {b})' for a, b in PAIRS)}; got ({x}, {w})")
    return x, w


def read_variants(reader, fam) -> tuple[tuple[str, str], ...]:
    """The family's (x, w) variants from `dtypes`: int8, e4m3 (w = x) or {x: int8, w: int4}."""
    values = reader.sequence(fam, "dtypes", allow_scalar=True)
    pairs = tuple(_pair(reader, fam, v, i, values.line_of(i) if hasattr(values, "line_of") else None)
                  for i, v in enumerate(values))
    if len(set(pairs)) != len(pairs):
        twice = next(p for p in pairs if pairs.count(p) > 1)
        raise reader.error(fam, "dtypes", f"(x, w) = ({twice[0]}, {twice[1]}) is listed twice")
    return pairs


def estimate_smem(config: MoeTileConfig) -> tuple[int, int]:
    """(bytes per mainloop stage, bytes for the epilogue), an upper-side estimate."""
    tm, tn, tk = config.tile
    stage = (tm + tn) * tk + 32
    epi_m = min(tm, 128 if config.schedule == "cooperative" else 64)
    epilogue = 2 * epi_m * min(tn, 32) * _C_BYTES[config.intermediate] + tn * 4 + 1024
    return stage, epilogue


def check_config(config: MoeTileConfig) -> list[tuple[str, str]]:
    tk = config.tile[2]
    problems = sm90_schema.tile_mn_problems(config.tile)
    if tk % TILE_K or not TILE_K <= tk <= 256:
        problems.append(("tile", f"tile K must be {TILE_K} or 256 for 8-bit operands (128-byte "
                                 f"swizzle atoms); got {tk}"))
    problems += sm90_schema.cluster_problems(config.cluster)
    problems += sm90_schema.cooperative_problems(config.schedule, config.tile)
    if not problems:
        smem = sm90_schema.smem_problem(config.tile, config.stages, *estimate_smem(config))
        problems += [smem] if smem else []
    return problems


def read_config(reader, node: Any, index: int, line: int,
                variants: tuple[tuple[str, str], ...] | None = None) -> ConfigEntry:
    """One `configs` entry; with int4 weights among `variants` (None: unknown), swap-AB only."""
    c = reader.mapping(node, f"configs[{index}]", CONFIG_KEYS, ("tile", "cluster", "schedule"),
                       line=line)
    common = sm90_schema.read_common(reader, c)
    swap_ab = c.get("swap_ab", False)
    if not isinstance(swap_ab, bool):
        raise reader.error(c, "swap_ab", f"expected true or false, got {swap_ab!r}")
    fused = c.get("fused", False)
    if not isinstance(fused, bool):
        raise reader.error(c, "fused", f"expected true or false, got {fused!r}")
    config = MoeTileConfig(
        tile=reader.triple(c, "tile"), cluster=reader.triple(c, "cluster"),
        schedule=reader.choice(c, "schedule", SCHEDULES), stages=common["stages"],
        swap_ab=swap_ab, intermediate=reader.choice(c, "intermediate", INTERMEDIATES, "fp32"),
        fused=fused)
    if fused and swap_ab:
        raise reader.error(c, "fused", "a fused config cannot be swap_ab: its epilogue pairs act "
                                       "and gate as adjacent columns of a tokens-by-N tile")
    if fused and config.intermediate != "fp32":
        raise reader.error(c, "intermediate", "fp32 for a fused config (it stores S in fp32, so "
                                              "that q matches the unfused kernels)")
    if fused and any(w == "int4" for _, w in variants or ()):
        raise reader.error(c, "fused", "not with int4 weights (A8W4 kernels are swap-AB only)")
    for key, message in check_config(config):
        raise reader.error(c, key, message)
    if not swap_ab and any(w == "int4" for _, w in variants or ()):
        raise reader.error(c, "swap_ab" if "swap_ab" in c else "tile",
                           "int4 weights (A8W4) need swap_ab: true: CUTLASS's mixed-input "
                           "mainloop converts its A operand in registers, so the weight must be A")
    return ConfigEntry(common["name"], config, common["knobs"], line)


def config_fields(entry: ConfigEntry) -> dict[str, Any]:
    cfg, knobs = entry.config, entry.knobs
    return {"tile": list(cfg.tile), "cluster": list(cfg.cluster), "schedule": cfg.schedule,
            "stages": cfg.stages if cfg.stages else "auto", "swap_ab": cfg.swap_ab,
            "intermediate": cfg.intermediate, "fused": cfg.fused, "raster": knobs.raster,
            "swizzle": knobs.swizzle}
