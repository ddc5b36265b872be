"""The mixed-input family's manifest schema and legality rules (sm90a CUTLASS 3.x kernels and
the direct kernel, the only one of an sm80 library), checked before anything compiles (file:line
errors).

    - op: mixed_mm
      dtypes: [{a: [bf16, fp16], w: [int4, int8]}]   # activations (= output), stored weight
      schemes: [scale, scale_zero]                      # scale_zero: int4 only (AWQ-style uint4)
                                                        # scale_g32, scale_zero_g32: group 32
      configs:
        - {name: decode, tile: [128, 16, 64], cluster: [1, 1, 1], schedule: warpspecialized,
           stages: auto, tile_scheduler: persistent, raster: heuristic, swizzle: 1}
        - {name: stream, tile: [16, 8, 64], schedule: direct, warps_k: 8, stages: 4}
        - {name: mid, tile: [128, 64, 64], schedule: wgmma, stages: 4}

`tile` is in the kernel's terms: M runs over the weight's N (output features), N over tokens.
"""

from __future__ import annotations

from typing import Any

from ...generator import direct_schema, sm90_schema
from ...generator.kernel_config import ConfigEntry
from ...generator.yaml_lines import FAILED, Collector, LocatedDict
from .configs import (ACTIVATION_DTYPES, SCHEDULES, SCHEMES, TILE_SCHEDULERS, WEIGHT_ELEMENTS,
                      MixedTileConfig, scheme_group_k, scheme_has_zero)

FAMILY_KEYS = frozenset({"dtypes", "schemes"})
REQUIRED_FAMILY_KEYS = frozenset({"dtypes", "schemes"})
CONFIG_KEYS = frozenset({"name", "tile", "cluster", "schedule", "stages", "tile_scheduler",
                         "raster", "swizzle", "warps_k", "ctas_per_sm", "rows_per_warp"})
# The direct kernel's tokens a CTA: 1, 2 or 4 at decode (the ring holds only those rows; the
# MMA's other rows are zero), else 1 to 8 MMA tiles of 8
DIRECT_TILE_N = (1, 2, 4) + direct_schema.TILE_N
# The fewest registers a thread `ctas_per_sm` may leave the direct kernel (it spills below)
MIN_REGISTERS = 40
# Dynamic shared memory per block an sm80 library may use: the least of the GPUs it runs on
# (8.6 and 8.9 allow 101,376 bytes; the A100 166,912; Hopper 232,448).
SM80_SMEM_LIMIT_BYTES = 101_376
TILE_K = 64  # 128 bytes of 16-bit activations: one swizzle atom; group sizes are multiples of it
# The direct kernel's K a ring slot holds (tile K): one or two steps of 64 (the MMAs' pass); 128
# halves the loop's overhead a weight byte. Any group size and K of the family work with either.
DIRECT_TILE_K = (TILE_K, 2 * TILE_K)
_BITS = {"int4": 4, "int8": 8}
# The wgmma kernel's tile: features a CTA (one or two warpgroups of 64) and tokens (the N of a
# bf16/fp16 wgmma that CUTLASS's base set has)
WGMMA_TILE_M = (64, 128)
WGMMA_TILE_N = (16, 32, 64, 96, 128, 192, 256)
WGMMA_SM_SMEM_BYTES = 233_472  # an sm90 SM's shared memory (228 KB)

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
            if scheme_has_zero(scheme) and w != "int4":
                continue  # zero points serve the 4-bit AWQ-style weights only
            variants.append((a, w, scheme))
    for scheme in schemes:
        if scheme_has_zero(scheme) and not any(w == "int4" for _, w in pairs):
            raise reader.error(fam, "schemes", f"{scheme} (zero points) serves int4 weights only; "
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


def direct_smem_bytes(config: MixedTileConfig, w: str, scheme: str = "scale") -> int:
    """The direct kernel's dynamic shared memory: a ring per warp of its weight rows (with group
    32, also their two groups' factors a 64-K step) and one per K group (warps_k of them) of the
    CTA's tokens, each of `stages` chunks of tile K (mirrors DirectMixedMm::kSmemBytes; the
    reduction buffer is smaller)."""
    _, tn, tk = config.tile
    rows = config.tile[0] * config.warps_k  # the CTA's weight rows
    weights = rows * tk * _BITS[w] // 8
    factors = 0
    if scheme_group_k(scheme) < TILE_K:  # a step's groups' factors, 2 bytes a row each
        factors = rows * (tk // TILE_K) * (TILE_K // scheme_group_k(scheme)) * 2 * \
            (2 if scheme_has_zero(scheme) else 1)
    return config.ring_stages * (weights + factors + config.warps_k * tn * tk * 2)


def read_ctas_per_sm(reader, c) -> int:
    """`ctas_per_sm` of a config mapping (0 when absent: no register cap)."""
    value = c.get("ctas_per_sm", 0)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise reader.error(c, "ctas_per_sm", "expected a positive integer (the CTAs an SM must "
                                             f"hold at once); got {value!r}")
    return value


def read_rows_per_warp(reader, c) -> int:
    """`rows_per_warp` of a config mapping (16 when absent)."""
    value = c.get("rows_per_warp", 16)
    if value not in (16, 32) or isinstance(value, bool):
        raise reader.error(c, "rows_per_warp", "expected 16 or 32 (the features a direct warp "
                                               f"owns: one or two MMA tiles); got {value!r}")
    return value


def occupancy_problems(config: MixedTileConfig) -> list[tuple[str, str]]:
    """`ctas_per_sm` must leave each thread at least MIN_REGISTERS registers and the SM its
    2048 threads (the compiler would spill everything or ignore it)."""
    if not config.ctas_per_sm:
        return []
    threads = 32 * direct_schema.warps(config.tile, config.warps_k, config.rows_per_warp)
    registers = 65536 // (config.ctas_per_sm * threads)
    if config.ctas_per_sm * threads > 2048 or registers < MIN_REGISTERS:
        return [("ctas_per_sm", f"{config.ctas_per_sm} CTAs of {threads} threads an SM "
                                f"leave {registers} registers a thread (at least {MIN_REGISTERS}, "
                                "and at most 2048 threads an SM)")]
    return []


def check_direct(config: MixedTileConfig, variants: tuple[Variant, ...], arch: str
                 ) -> list[tuple[str, str]]:
    problems = direct_schema.shape_problems(config.tile, config.warps_k, config.cluster,
                                            config.stages, DIRECT_TILE_K,
                                            MixedTileConfig.DIRECT_AUTO_STAGES, DIRECT_TILE_N,
                                            config.rows_per_warp)
    if not problems and config.tile[0] % config.rows_per_warp != 0:
        problems.append(("rows_per_warp", f"tile M {config.tile[0]} is not a whole number of "
                                          f"warps of {config.rows_per_warp} features"))
    problems += occupancy_problems(config) if not problems else []
    if config.tile_scheduler != "persistent":
        problems.append(("tile_scheduler", "the direct kernel has no tile scheduler: leave "
                                           f"tile_scheduler out; got {config.tile_scheduler!r}"))
    if not problems:
        limit = SM80_SMEM_LIMIT_BYTES if arch == "sm80" else sm90_schema.SMEM_LIMIT_BYTES
        for w, scheme in sorted({(w, scheme) for _, w, scheme in variants}):
            smem = direct_smem_bytes(config, w, scheme)
            if smem > limit:
                problems.append(("stages", f"{config.ring_stages} stages of the direct tile "
                                           f"{'x'.join(map(str, config.tile))} x warps_k "
                                           f"{config.warps_k} ({w}, {scheme}) need {smem} bytes "
                                           f"of shared memory, over the {arch} limit of {limit}"))
                break
    return problems


def wgmma_smem_bytes(config: MixedTileConfig, scheme: str) -> int:
    """The wgmma kernel's dynamic shared memory (mirrors WgmmaMixedMm::kSmemBytes): a ring of
    `stages` chunks of the CTA's tokens, int4 weight rows and group factors (scales, and zero
    terms with zero points, of two groups a chunk with group 32; the partial sums of the K split
    reuse it), and 1024 bytes to align it to the swizzle's period."""
    tm, tn, tk = config.tile
    factors = tm * 2 * (2 if scheme_has_zero(scheme) else 1) * (tk // scheme_group_k(scheme))
    ring = config.wgmma_stages * (tn * tk * 2 + tm * tk // 2 + factors)
    partial = tn // 2 * (2 * tm) * 4
    return max(ring, partial) + 1024


def direct_only_key_problems(config: MixedTileConfig) -> list[tuple[str, str]]:
    """The direct kernel's keys set on a config of another schedule (the wgmma kernel also takes
    ctas_per_sm)."""
    keys = (("warps_k", 0), ("rows_per_warp", 16)) + (() if config.is_wgmma else (("ctas_per_sm", 0),))
    return [(key, f"{key} belongs to schedule direct{' or wgmma' if key == 'ctas_per_sm' else ''}; "
                  f"got schedule {config.schedule!r}")
            for key, unset in keys if getattr(config, key) != unset]


def check_wgmma(config: MixedTileConfig, variants: tuple[Variant, ...], arch: str
                ) -> list[tuple[str, str]]:
    tm, tn, tk = config.tile
    problems = []
    if arch != "sm90a":
        problems.append(("schedule", f"the wgmma kernel needs sm90a; this library is {arch}"))
    if tm not in WGMMA_TILE_M or tn not in WGMMA_TILE_N or tk != TILE_K:
        problems.append(("tile", "the wgmma kernel's tile is [64 or 128 features (one or two "
                                 "warpgroups), tokens (" + ", ".join(map(str, WGMMA_TILE_N)) +
                                 f": a wgmma's N), {TILE_K}]; got {list(config.tile)}"))
    problems += direct_schema.wgmma_stages_problems(config.stages,
                                                    MixedTileConfig.WGMMA_AUTO_STAGES)
    if config.cluster != (1, 1, 1):
        problems.append(("cluster", "the wgmma kernel chooses its K split's cluster at launch: "
                                    f"leave cluster out or write [1, 1, 1]; got "
                                    f"{list(config.cluster)}"))
    if config.tile_scheduler != "persistent":
        problems.append(("tile_scheduler", "the wgmma kernel has no tile scheduler: leave "
                                           f"tile_scheduler out; got {config.tile_scheduler!r}"))
    problems += direct_only_key_problems(config)
    if config.ctas_per_sm not in (0, 1, 2):
        problems.append(("ctas_per_sm", "the wgmma kernel holds 1 or 2 CTAs an SM (2 caps each "
                                        f"thread at 65536 / (2 · threads) registers); got "
                                        f"{config.ctas_per_sm}"))
    if any(w != "int4" for _, w, _ in variants):
        problems.append(("schedule", "the wgmma kernel reads int4 weights only; this family "
                                     "has int8 weights"))
    for scheme in sorted({scheme for _, _, scheme in variants}) if not problems else ():
        smem = wgmma_smem_bytes(config, scheme)
        ctas = max(config.ctas_per_sm, 1)
        # an SM's 228 KB hold `ctas` CTAs' dynamic shared memory and 1 KB of reserve each
        limit = sm90_schema.SMEM_LIMIT_BYTES if ctas == 1 else WGMMA_SM_SMEM_BYTES // ctas - 1024
        if smem > limit:
            problems.append(("stages", f"{config.wgmma_stages} stages of the wgmma tile "
                                       f"{'x'.join(map(str, config.tile))} ({scheme}) need {smem} "
                                       f"bytes of shared memory, over the limit of {limit}"
                                       + (f" ({ctas} CTAs an SM)" if ctas > 1 else "")))
            break
    return problems


def check_config(config: MixedTileConfig, variants: tuple[Variant, ...], arch: str = "sm90a"
                 ) -> list[tuple[str, str]]:
    if config.is_direct:
        return check_direct(config, variants, arch)
    if config.is_wgmma:
        return check_wgmma(config, variants, arch)
    if arch == "sm80":
        return [("schedule", "an sm80 mixed library has the direct kernel only (schedule: "
                             f"direct); got {config.schedule!r}")]
    if misplaced := direct_only_key_problems(config):
        return misplaced[:1]
    for _, _, scheme in variants:
        if scheme_group_k(scheme) < TILE_K:
            return [("schedule", f"scheme {scheme} (group {scheme_group_k(scheme)}) needs schedule "
                                 "direct or wgmma: CUTLASS's mixed-input collective applies one "
                                 f"group's factors to a whole tile K of {TILE_K}; got schedule "
                                 f"{config.schedule!r}")]
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
                                            *estimate_smem(config, w, scheme_has_zero(scheme)),
                                            what=f" ({w}, {scheme})")
            if smem:
                problems.append(smem)
                break
    return problems


def read_config(reader, node: Any, index: int, variants: tuple[Variant, ...] | None,
                line: int, arch: str = "sm90a") -> ConfigEntry:
    """One `configs` entry. `variants` None (the family's dtypes or schemes have errors): every
    check but the shared-memory estimate, which depends on the weight type and scheme. `cluster`
    may be left out: [1, 1, 1]."""
    c = reader.mapping(node, f"configs[{index}]", CONFIG_KEYS, ("tile", "schedule"), line=line)
    common = sm90_schema.read_common(reader, c)
    config = MixedTileConfig(
        tile=reader.triple(c, "tile"), cluster=reader.triple(c, "cluster", [1, 1, 1]),
        schedule=reader.choice(c, "schedule", SCHEDULES), stages=common["stages"],
        tile_scheduler=reader.choice(c, "tile_scheduler", TILE_SCHEDULERS, "persistent"),
        warps_k=direct_schema.read_warps_k(reader, c), ctas_per_sm=read_ctas_per_sm(reader, c),
        rows_per_warp=read_rows_per_warp(reader, c))
    for key, message in check_config(config, variants if variants is not None else (), arch):
        raise reader.error(c, key, message)
    if config.is_own:
        direct_schema.refuse_scheduler_knobs(reader, c, config.schedule)
    return ConfigEntry(common["name"], config, common["knobs"], line)


def config_fields(entry: ConfigEntry) -> dict[str, Any]:
    cfg, knobs = entry.config, entry.knobs
    fields = {"tile": list(cfg.tile), "cluster": list(cfg.cluster), "schedule": cfg.schedule,
              "stages": cfg.stages if cfg.stages else "auto", "tile_scheduler": cfg.tile_scheduler,
              "raster": knobs.raster, "swizzle": knobs.swizzle}
    if cfg.is_direct:  # every key, defaults too: a dispatch `use` may spell them
        fields.update(warps_k=cfg.warps_k, ctas_per_sm=cfg.ctas_per_sm,
                      rows_per_warp=cfg.rows_per_warp)
    elif cfg.is_wgmma:
        fields.update(ctas_per_sm=cfg.ctas_per_sm)
    return fields
