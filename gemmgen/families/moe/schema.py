"""The MoE family's manifest schema and sm90a legality rules, checked before anything compiles
(file:line errors).

    - op: grouped_matmul_swiglu_quant
      dtypes: [int8, e4m3]            # x, weights and q (e4m3: q_scale = max|S| / 448)
      configs:
        - {name: decode, tile: [128, 16, 128], cluster: [1, 1, 1], schedule: pingpong,
           swap_ab: true, intermediate: fp32, stages: auto, raster: heuristic, swizzle: 1}

With `swap_ab: true` the tile is in the kernel's terms C_iᵀ = W_i · X_iᵀ: tile M runs over the
weight's N, tile N over an expert's tokens (a narrow tile N serves decode).
"""

from __future__ import annotations

from typing import Any

from ...generator import sm90_schema
from ...generator.kernel_config import ConfigEntry
from .configs import ELEMENTS, INTERMEDIATES, SCHEDULES, MoeTileConfig

FAMILY_KEYS = frozenset({"dtypes"})
REQUIRED_FAMILY_KEYS = frozenset({"dtypes"})
CONFIG_KEYS = frozenset({"name", "tile", "cluster", "schedule", "stages", "swap_ab",
                         "intermediate", "raster", "swizzle"})
TILE_K = 128  # 128 bytes of 8-bit elements: one swizzle atom
_C_BYTES = {"fp32": 4, "bf16": 2}


def read_variants(reader, fam) -> tuple[tuple[str], ...]:
    """The family's (x,) variants from `dtypes`: a list (or one) of int8, e4m3."""
    values = reader.sequence(fam, "dtypes", allow_scalar=True)
    for value in values:
        if value not in ELEMENTS:
            raise reader.error(fam, "dtypes", f"unknown value {value!r}; expected one of "
                                              f"{', '.join(ELEMENTS)}")
    if len(set(values)) != len(values):
        raise reader.error(fam, "dtypes", "the same element type is listed twice")
    return tuple((v,) for v in values)


def estimate_smem(config: MoeTileConfig) -> tuple[int, int]:
    """(bytes per mainloop stage, bytes for the epilogue), an upper-side estimate."""
    tm, tn, tk = config.tile
    stage = (tm + tn) * tk + 32
    epi_m = min(tm, 128 if config.schedule == "cooperative" else 64)
    epilogue = 2 * epi_m * min(tn, 32) * _C_BYTES[config.intermediate] + tn * 4 + 1024
    return stage, epilogue


def check_config(config: MoeTileConfig) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    tm, tn, tk = config.tile
    if tm % 64 or not 64 <= tm <= 256:
        problems.append(("tile", "tile M must be 64, 128, 192 or 256 (a wgmma is 64 rows); got "
                                 f"{tm}"))
    if tn % 8 or not 8 <= tn <= 256:
        problems.append(("tile", f"tile N must be a multiple of 8 in [8, 256]; got {tn}"))
    if tk % TILE_K or not TILE_K <= tk <= 256:
        problems.append(("tile", f"tile K must be {TILE_K} or 256 for 8-bit operands (128-byte "
                                 f"swizzle atoms); got {tk}"))
    problems += sm90_schema.cluster_problems(config.cluster)
    if config.schedule == "cooperative" and tm % 128:
        problems.append(("schedule", "cooperative splits tile M across two consumer warpgroups, "
                                     f"so tile M must be a multiple of 128; got {tm}"))
    if not problems:
        smem = sm90_schema.smem_problem(config.tile, config.stages, *estimate_smem(config))
        problems += [smem] if smem else []
    return problems


def read_config(reader, node: Any, index: int, line: int) -> ConfigEntry:
    """One `configs` entry (the element type does not change what is legal)."""
    c = reader.mapping(node, f"configs[{index}]", CONFIG_KEYS, ("tile", "cluster", "schedule"),
                       line=line)
    common = sm90_schema.read_common(reader, c)
    swap_ab = c.get("swap_ab", False)
    if not isinstance(swap_ab, bool):
        raise reader.error(c, "swap_ab", f"expected true or false, got {swap_ab!r}")
    config = MoeTileConfig(
        tile=reader.triple(c, "tile"), cluster=reader.triple(c, "cluster"),
        schedule=reader.choice(c, "schedule", SCHEDULES), stages=common["stages"],
        swap_ab=swap_ab, intermediate=reader.choice(c, "intermediate", INTERMEDIATES, "fp32"))
    for key, message in check_config(config):
        raise reader.error(c, key, message)
    return ConfigEntry(common["name"], config, common["knobs"], line)


def config_fields(entry: ConfigEntry) -> dict[str, Any]:
    cfg, knobs = entry.config, entry.knobs
    return {"tile": list(cfg.tile), "cluster": list(cfg.cluster), "schedule": cfg.schedule,
            "stages": cfg.stages if cfg.stages else "auto", "swap_ab": cfg.swap_ab,
            "intermediate": cfg.intermediate, "raster": knobs.raster, "swizzle": knobs.swizzle}
