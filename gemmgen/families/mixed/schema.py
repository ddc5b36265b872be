"""The mixed-input family's manifest schema and sm90a legality rules, checked before anything
compiles (file:line errors).

    - op: mixed_mm
      dtypes: [{a: [bf16, fp16], w: [int4, int8]}]   # activations (= output), stored weight
      schemes: [scale, scale_zero]                      # scale_zero: int4 only (AWQ-style uint4)
      configs:
        - {name: decode, tile: [128, 16, 64], cluster: [1, 1, 1], schedule: warpspecialized,
           stages: auto, tile_scheduler: persistent, raster: heuristic, swizzle: 1}

`tile` is in the kernel's terms: M runs over the weight's N (output features), N over tokens.
"""

from __future__ import annotations

from typing import Any

from ...generator import sm90_schema
from ...generator.kernel_config import ConfigEntry
from ...generator.yaml_lines import FAILED, Collector, LocatedDict
from .configs import (ACTIVATION_DTYPES, SCHEDULES, SCHEMES, TILE_SCHEDULERS, WEIGHT_ELEMENTS,
                      MixedTileConfig)

FAMILY_KEYS = frozenset({"dtypes", "schemes"})
REQUIRED_FAMILY_KEYS = frozenset({"dtypes", "schemes"})
CONFIG_KEYS = frozenset({"name", "tile", "cluster", "schedule", "stages", "tile_scheduler",
                         "raster", "swizzle"})
TILE_K = 64  # 128 bytes of 16-bit activations: one swizzle atom; group sizes are multiples of it
_BITS = {"int4": 4, "int8": 8}

Variant = tuple[str, str, str]  # (a, w, scheme)


def _names(reader, node: LocatedDict, key: str, allowed: tuple[str, ...]) -> list[str]:
    values = reader.sequence(node, key, allow_scalar=True)
    for value in values:
        if value not in allowed:
            raise reader.error(node, key, f"unknown value {value!r}; expected one of "
                                          f"{', '.join(allowed)}")
    return list(values)


def _read_dtypes(reader, entry: Any, i: int, line: int) -> list[tuple[str, str]]:
    """The (a, w) pairs of `dtypes` entry `i`."""
    d = reader.mapping(entry, f"dtypes[{i}]", ("a", "w"), ("a", "w"), line=line)
    activations = _names(reader, d, "a", ACTIVATION_DTYPES)
    weights = _names(reader, d, "w", WEIGHT_ELEMENTS)
    return [(a, w) for a in activations for w in weights]


def read_variants(reader, fam: LocatedDict) -> tuple[Variant, ...]:
    """The family's (a, w, scheme) variants. Each `dtypes` entry and `schemes` is checked on its
    own (all their errors are reported together); how they combine only once all are valid."""
    problems = Collector()
    pairs: list[tuple[str, str]] = []
    dtypes = problems.attempt(reader.sequence, fam, "dtypes")
    for i, entry in enumerate(dtypes if dtypes is not FAILED else ()):
        with problems.unit():
            pairs.extend(_read_dtypes(reader, entry, i, dtypes.line_of(i)))
    schemes = problems.attempt(_names, reader, fam, "schemes", SCHEMES)
    problems.raise_if_any()
    variants = []
    for a, w in pairs:
        for scheme in schemes:
            if scheme == "scale_zero" and w != "int4":
                continue  # zero points serve the 4-bit AWQ-style weights only
            variants.append((a, w, scheme))
    if "scale_zero" in schemes and not any(w == "int4" for _, w in pairs):
        raise reader.error(fam, "schemes", "scale_zero (zero points) serves int4 weights only; "
                                           "no dtypes entry has w: int4")
    if len(set(variants)) != len(variants):
        raise reader.error(fam, "dtypes", "the same (a, w, scheme) combination is listed twice")
    return tuple(variants)


def estimate_smem(config: MixedTileConfig, w: str, with_zero: bool) -> tuple[int, int]:
    """(bytes per mainloop stage, bytes for the epilogue), an upper-side estimate."""
    tm, tn, tk = config.tile
    scale_bytes = tm * 2 * (2 if with_zero else 1)
    stage = tm * tk * _BITS[w] // 8 + tn * tk * 2 + scale_bytes + 16
    epi_m = min(tm, 128 if config.schedule == "cooperative" else 64)
    epilogue = 2 * epi_m * min(tn, 32) * 2 + tm * 2 + 1024
    return stage, epilogue


def check_config(config: MixedTileConfig, variants: tuple[Variant, ...]) -> list[tuple[str, str]]:
    tk = config.tile[2]
    problems = sm90_schema.tile_mn_problems(config.tile, " (over the weight's N)", " (over tokens)")
    if tk != TILE_K:
        problems.append(("tile", f"tile K must be {TILE_K} for 16-bit activations (one 128-byte "
                                 "swizzle atom; group sizes are multiples of it); got " f"{tk}"))
    problems += sm90_schema.cluster_problems(config.cluster)
    problems += sm90_schema.cooperative_problems(config.schedule, config.tile)
    if config.tile_scheduler == "streamk" and config.schedule != "cooperative":
        problems.append(("tile_scheduler", "stream-K needs the cooperative schedule; got "
                                           f"schedule {config.schedule!r}"))
    if not problems:
        for _, w, scheme in variants:
            smem = sm90_schema.smem_problem(config.tile, config.stages,
                                            *estimate_smem(config, w, scheme == "scale_zero"),
                                            what=f" ({w}, {scheme})")
            if smem:
                problems.append(smem)
                break
    return problems


def read_config(reader, node: Any, index: int, variants: tuple[Variant, ...] | None,
                line: int) -> ConfigEntry:
    """One `configs` entry. `variants` None (the family's dtypes or schemes have errors): every
    check but the shared-memory estimate, which depends on the weight type and scheme."""
    c = reader.mapping(node, f"configs[{index}]", CONFIG_KEYS, ("tile", "cluster", "schedule"),
                       line=line)
    common = sm90_schema.read_common(reader, c)
    config = MixedTileConfig(
        tile=reader.triple(c, "tile"), cluster=reader.triple(c, "cluster"),
        schedule=reader.choice(c, "schedule", SCHEDULES), stages=common["stages"],
        tile_scheduler=reader.choice(c, "tile_scheduler", TILE_SCHEDULERS, "persistent"))
    for key, message in check_config(config, variants if variants is not None else ()):
        raise reader.error(c, key, message)
    return ConfigEntry(common["name"], config, common["knobs"], line)


def config_fields(entry: ConfigEntry) -> dict[str, Any]:
    cfg, knobs = entry.config, entry.knobs
    return {"tile": list(cfg.tile), "cluster": list(cfg.cluster), "schedule": cfg.schedule,
            "stages": cfg.stages if cfg.stages else "auto", "tile_scheduler": cfg.tile_scheduler,
            "raster": knobs.raster, "swizzle": knobs.swizzle}
