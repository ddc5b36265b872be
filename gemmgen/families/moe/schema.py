"""The MoE family's manifest schema and sm90a legality rules, checked before anything compiles
(file:line errors).

    - op: grouped_matmul_swiglu_quant
      dtypes: [int8, e4m3, {x: int8, w: int4}]   # x (= q); w defaults to x; int4: A8W4
      configs:
        - {name: decode, tile: [128, 16, 128], cluster: [1, 1, 1], schedule: pingpong,
           swap_ab: true, intermediate: fp32, stages: auto, raster: heuristic, swizzle: 1}
        - {name: large_fused, tile: [128, 256, 128], cluster: [2, 1, 1],
           schedule: cooperative, fused: true}
        - {name: stream, tile: [64, 8, 128], schedule: direct, warps_k: 4, stages: 4}
        - {name: mid_wgmma, tile: [128, 64, 128], schedule: wgmma, stages: 4}   # A8W4 only

    - op: grouped_matmul_swiglu_quant
      dtypes: [{x: int8, w: int4, scales: group}]   # per-group weight scales [E, K/group, N]
      configs:
        - {name: stream, tile: [64, 8, 128], schedule: direct, warps_k: 4}

`fast_accum: true` (e4m3 families, CUTLASS schedules) takes CUTLASS's FP8FastAccum mainloop: the
tensor cores accumulate the whole K on their own, as cuBLAS's fp8 GEMMs (and the W8A8 family's)
do, instead of promoting to fp32 every four wgmmas, one 128-K tile (the default, more exact).

`fused: true` does SwiGLU in the GEMM's epilogue (S stored in the config's intermediate type,
fp32 or bf16, the row max reduced by atomics, then a light quant pass) instead of writing C for a
separate SwiGLU kernel; C stays float32 inside the epilogue, so `intermediate: bf16` rounds S,
not C. Fused CUTLASS configs are not swap-AB (act/gate pairs are adjacent columns of a
tokens-by-N tile) and their weight is not int4; A8W4 fuses with `schedule: wgmma`.

`schedule: direct` is the family's own mma.sync kernel (direct_grouped_gemm.cuh): int8
activations with int8 or int4 weights, or e4m3 ones (float32 accumulation), tile [16·warps over features (16 to 256), 8·MMA tiles
over an expert's rows (8 to 64), 128], `warps_k` warps splitting K, `stages` each warp's ring
depth (2 to 8, auto 4); no cluster, swap_ab, fused, raster or swizzle; fp32 intermediate. It is
one of the two kernels that take per-group weight scales (`scales: group`, A8W4).

`schedule: wgmma` is the family's own sm90a kernel for A8W4 (wgmma_grouped_gemm.cuh): int8
activations with int4 weights, per-channel or per-group scales, tile [64 or 128 features (one or
two warpgroups), an expert's rows a tile (the wgmma's N: a multiple of 16 up to 128; per group
at most 64, 80 with one warpgroup), 128], `stages` the ring depth (3 to 8, auto 4), `copy` what
fills the ring: `cp_async` (every thread's 16-byte copies, the default) or `tma` (thread 0 queues
a chunk's TMA boxes on an mbarrier: faster from hundreds of tokens an expert, slower at decode),
`fused: true` SwiGLU and the row maxima in its epilogue (S in fp32, then the quantize pass, as
the CUTLASS fused configs); no cluster, swap_ab, warps_k, raster or swizzle; fp32 intermediate.
A family with `scales: group` has direct and wgmma configs only.

With `swap_ab: true` the tile is in the kernel's terms C_iᵀ = W_i · X_iᵀ: tile M runs over the
weight's N, tile N over an expert's tokens (a narrow tile N serves decode). int4 weights need
`swap_ab: true` (CUTLASS's mixed-input mainloop converts its A operand in registers).

`raster` (the CUTLASS configs' tile order, a run-time knob) defaults to the order that walks an
expert's token tiles first, so that each weight tile is read from HBM once and its other token
tiles find it in L2: `along_m` for a config that is not swap-AB, `heuristic` for a swap-AB one.
CUTLASS's own heuristic cannot choose here: a grouped GEMM's problem sizes live on the device,
so it always walks along N, which for a non-swap tile means every feature tile of an expert
before its next token tile, and re-reads the expert's weights once per token tile when they
outgrow the L2 (Mixtral-8x7B at 4096 tokens: 117 MB of weights an expert, 8 token tiles of
128 rows).
Measured on the H200 (benchmarks/moe_raster.py; benchmarks/RESULTS.md, session 46), time along
N / time along M over 70-86 rows a kernel (seven layers, 64-4096 tokens, both routings): the
64x256 pingpong fused tiles 0.99-2.18x (geomean 1.23), the 64x128 fused ones 0.98-1.77x
(1.10-1.16), the 128-row tiles 0.89-1.38x (1.00-1.04; below 1 at one or two token tiles an
expert of the Qwen3 and DeepSeek-V3 layers, which the tuner sees: it times both orders); a
swap-AB tile along M 0.66-0.91x (there along N is the token order).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...generator import direct_schema, sm90_schema
from ...generator.kernel_config import ConfigEntry
from .configs import (COPIES, ELEMENTS, INTERMEDIATES, PAIRS, SCALES, SCHEDULES, WEIGHTS,
                      WGMMA_AUTO_STAGES, MoeTileConfig)

FAMILY_KEYS = frozenset({"dtypes"})
REQUIRED_FAMILY_KEYS = frozenset({"dtypes"})
CONFIG_KEYS = frozenset({"name", "tile", "cluster", "schedule", "stages", "swap_ab",
                         "intermediate", "raster", "swizzle", "fused", "warps_k", "fast_accum",
                         "copy"})
TILE_K = 128  # 128 bytes of 8-bit elements: one swizzle atom
_C_BYTES = {"fp32": 4, "bf16": 2}
TOKENS_FIRST = {False: "along_m", True: "heuristic"}  # the raster default, by swap_ab


Variant = tuple[str, str, str]  # (x, w, scales)


def _variant(reader, fam, entry, i: int, line: int) -> Variant:
    """One `dtypes` entry: a scalar x (w = x, per-channel scales) or a mapping
    {x: ..., w: ..., scales: channel | group}."""
    if not isinstance(entry, dict):
        if entry not in ELEMENTS:
            raise reader.error(fam, "dtypes", f"unknown value {entry!r}; expected one of "
                                              f"{', '.join(ELEMENTS)} or a mapping {{x: int8, w: int4}}")
        return entry, entry, "channel"
    d = reader.mapping(entry, f"dtypes[{i}]", ("x", "w", "scales"), ("x",), line=line)
    x = reader.choice(d, "x", ELEMENTS)
    w = reader.choice(d, "w", WEIGHTS, x)
    scales = reader.choice(d, "scales", SCALES, "channel")
    if (x, w) not in PAIRS:
        raise reader.error(d, "w", f"the kernels serve (x, w) = "
                                   f"{', '.join(f'({a}, {b})' for a, b in PAIRS)}; got ({x}, {w})")
    if scales == "group" and w != "int4":
        raise reader.error(d, "scales", "group for int4 weights (A8W4) only; 8-bit weights take "
                                        f"per-channel scales; got w: {w}")
    return x, w, scales


def read_variants(reader, fam) -> tuple[Variant, ...]:
    """The family's (x, w, scales) variants from `dtypes`: int8, e4m3 (w = x) or
    {x: int8, w: int4, scales: channel | group}."""
    values = reader.sequence(fam, "dtypes", allow_scalar=True)
    variants = tuple(_variant(reader, fam, v, i, values.line_of(i) if hasattr(values, "line_of")
                              else None) for i, v in enumerate(values))
    if len(set(variants)) != len(variants):
        twice = next(v for v in variants if variants.count(v) > 1)
        raise reader.error(fam, "dtypes", f"(x, w, scales) = ({', '.join(twice)}) is listed twice")
    return variants


def estimate_smem(config: MoeTileConfig) -> tuple[int, int]:
    """(bytes per mainloop stage, bytes for the epilogue), an upper-side estimate."""
    tm, tn, tk = config.tile
    stage = (tm + tn) * tk + 32
    epi_m = min(tm, 128 if config.schedule == "cooperative" else 64)
    epilogue = 2 * epi_m * min(tn, 32) * _C_BYTES[config.intermediate] + tn * 4 + 1024
    return stage, epilogue


def direct_smem_bytes(config: MoeTileConfig, w: str) -> int:
    """The direct kernel's shared memory: a ring per warp of 16 weight rows and one per K group
    (warps_k of them) of the tile's rows of x, each of `stages` chunks of 128 K (mirrors
    DirectGroupedGemm::kSmemBytes; the reduction buffer is smaller), plus an upper-side allowance
    for the static shared memory of its inline group-list scan (8 bytes a thread, CUB's few words
    a warp)."""
    _, tn, tk = config.tile
    warps = direct_schema.warps(config.tile, config.warps_k)
    weights = warps * 16 * tk * (4 if w == "int4" else 8) // 8
    scan = warps * 32 * 8 + 1024
    return config.ring_stages * (weights + config.warps_k * tn * tk) + scan


# Why `fast_accum` means nothing to the family's own kernels
_NO_FAST_ACCUM = {"direct": "it sums int8 exactly and e4m3 in float32 accumulators: there is nothing "
                            "to choose",
                  "wgmma": "it serves A8W4, whose int8 MMAs sum exactly"}


def own_kernel_problems(config: MoeTileConfig, operand: str) -> list[tuple[str, str]]:
    """What the family's own kernels (schedule direct or wgmma: `operand` names its MMA) refuse:
    swap_ab, fused (direct; the wgmma kernel fuses), an intermediate other than fp32."""
    problems = []
    fused_refused = config.fused and not config.is_wgmma
    for key, value, why in (("swap_ab", config.swap_ab, f"the weight is the {operand}'s A by design"),
                            ("fused", fused_refused, "SwiGLU runs in the pass after it; "
                                                     "schedule wgmma fuses"),
                            ("fast_accum", config.fast_accum, _NO_FAST_ACCUM[config.schedule])):
        if value:
            problems.append((key, f"not with schedule {config.schedule} ({why}): leave {key} out"))
    if config.intermediate != "fp32":
        problems.append(("intermediate", f"fp32 for schedule {config.schedule} (it writes C, or "
                                         "fused S, in fp32: int8 q rounds S to 127 steps)"))
    return problems


def check_direct(config: MoeTileConfig, variants: tuple[Variant, ...]) -> list[tuple[str, str]]:
    problems = direct_schema.shape_problems(config.tile, config.warps_k, config.cluster,
                                            config.stages, TILE_K, MoeTileConfig.DIRECT_AUTO_STAGES)
    problems += own_kernel_problems(config, "MMA")
    if not problems:
        for w in sorted({w for _, w, _ in variants}):
            smem = direct_smem_bytes(config, w)
            if smem > sm90_schema.SMEM_LIMIT_BYTES:
                problems.append(("stages", f"{config.ring_stages} stages of the direct tile "
                                           f"{'x'.join(map(str, config.tile))} x warps_k "
                                           f"{config.warps_k} ({w}) need {smem} bytes of shared "
                                           f"memory, over the sm90a limit of "
                                           f"{sm90_schema.SMEM_LIMIT_BYTES}"))
                break
    return problems


WGMMA_FEATURES = (64, 128)              # one or two warpgroups of 64 features
WGMMA_TOKENS = (16, 32, 48, 64, 80, 96, 112, 128)  # an expert's rows a tile: the int8 wgmma's N
WGMMA_TOKENS_PER_GROUP = 64             # per group: float32 sums beside the accumulators (two
WGMMA_TOKENS_PER_GROUP_ONE_WG = 80      # warpgroups, two CTAs an SM; one warpgroup, three)


def wgmma_smem_bytes(config: MoeTileConfig, per_group: bool) -> int:
    """The wgmma kernel's shared memory (mirrors WgmmaGroupedGemm::kSmemBytes): a ring of
    `stages` slots in three regions, each slot's tokens (128 bytes a row, rounded up to 1024
    bytes), weights (64 bytes a feature) and, per group, the features' scales (with TMA copies,
    + an 8-byte mbarrier); + 1024 for the ring's alignment; + the inline group-list scan's
    allowance (as direct_smem_bytes)."""
    tm, tn, tk = config.tile
    slot = (-(-(tn * tk) // 1024) * 1024 + tm * tk // 2 + (tm * 4 if per_group else 0)
            + (8 if config.copy == "tma" else 0))
    scan = 4096  # the static shared memory of the inline group-list scan (CUB), measured
    return config.wgmma_stages * slot + 1024 + scan


def check_wgmma(config: MoeTileConfig, variants: tuple[Variant, ...]) -> list[tuple[str, str]]:
    tm, tn, tk = config.tile
    problems = []
    per_group = any(scales == "group" for _, _, scales in variants)
    if tm not in WGMMA_FEATURES or tn not in WGMMA_TOKENS or tk != TILE_K:
        problems.append(("tile", "the wgmma kernel's tile is [64 or 128 features (one or two "
                                 f"warpgroups), tokens ({', '.join(map(str, WGMMA_TOKENS))}: the "
                                 f"int8 wgmma's N), {TILE_K}]; got {list(config.tile)}"))
    elif per_group and tn > (WGMMA_TOKENS_PER_GROUP_ONE_WG if tm == 64 else WGMMA_TOKENS_PER_GROUP):
        problems.append(("tile", f"with per-group scales the wgmma kernel's tile N is at most "
                                 f"{WGMMA_TOKENS_PER_GROUP} with two warpgroups (tile M 128: two "
                                 f"CTAs an SM) and {WGMMA_TOKENS_PER_GROUP_ONE_WG} with one (tile M "
                                 f"64: three CTAs an SM), a float32 sum beside each int32 "
                                 f"accumulator; got {list(config.tile)}"))
    problems += direct_schema.wgmma_stages_problems(config.stages, WGMMA_AUTO_STAGES)
    if config.cluster != (1, 1, 1):
        problems.append(("cluster", "the wgmma kernel has no clusters: leave cluster out or "
                                    f"write [1, 1, 1]; got {list(config.cluster)}"))
    problems += own_kernel_problems(config, "wgmma")
    if config.warps_k:
        problems.append(("warps_k", "warps_k belongs to schedule direct; the wgmma kernel's "
                                    "warpgroups split features, not K: leave warps_k out"))
    if any((x, w) != ("int8", "int4") for x, w, _ in variants):
        problems.append(("schedule", "the wgmma kernel serves A8W4 (x: int8, w: int4) only; this "
                                     "family lists " + ", ".join(sorted({f"({x}, {w})" for x, w, _
                                                                         in variants}))))
    if not problems:
        smem = wgmma_smem_bytes(config, per_group)
        if smem > sm90_schema.SMEM_LIMIT_BYTES:
            problems.append(("stages", f"{config.wgmma_stages} stages of the wgmma tile "
                                       f"{'x'.join(map(str, config.tile))} need {smem} bytes of "
                                       f"shared memory, over the sm90a limit of "
                                       f"{sm90_schema.SMEM_LIMIT_BYTES}"))
    return problems


def check_config(config: MoeTileConfig, variants: tuple[Variant, ...] = ()) -> list[tuple[str, str]]:
    if config.copy != "cp_async" and not config.is_wgmma:
        return [("copy", f"copy belongs to schedule wgmma (what fills its ring); got schedule "
                         f"{config.schedule!r}: leave copy out")]
    if config.is_direct:
        return check_direct(config, variants)
    if config.is_wgmma:
        return check_wgmma(config, variants)
    if config.warps_k:
        return [("warps_k", f"warps_k belongs to schedule direct; got schedule {config.schedule!r}")]
    if any(scales == "group" for _, _, scales in variants):
        return [("schedule", "direct or wgmma: per-group weight scales (scales: group) need the "
                             "family's own kernels; CUTLASS's epilogue applies one scale per "
                             "output channel")]
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
                variants: tuple[Variant, ...] | None = None) -> ConfigEntry:
    """One `configs` entry; with int4 weights among `variants` (None: unknown), swap-AB or
    direct only. `cluster` may be left out: [1, 1, 1]."""
    c = reader.mapping(node, f"configs[{index}]", CONFIG_KEYS, ("tile", "schedule"), line=line)
    common = sm90_schema.read_common(reader, c)
    swap_ab, fused, fast_accum = (reader.flag(c, key) for key in ("swap_ab", "fused", "fast_accum"))
    if fast_accum and variants is not None and any(x != "e4m3" for x, _, _ in variants):
        raise reader.error(c, "fast_accum", "e4m3 families only: int8 MMAs accumulate in int32, "
                                            "exactly; this family lists "
                           + ", ".join(sorted({x for x, _, _ in variants})))
    config = MoeTileConfig(
        tile=reader.triple(c, "tile"), cluster=reader.triple(c, "cluster", [1, 1, 1]),
        schedule=reader.choice(c, "schedule", SCHEDULES), stages=common["stages"],
        swap_ab=swap_ab, intermediate=reader.choice(c, "intermediate", INTERMEDIATES, "fp32"),
        fused=fused, warps_k=direct_schema.read_warps_k(reader, c), fast_accum=fast_accum,
        copy=reader.choice(c, "copy", COPIES, "cp_async"))
    int4 = any(w == "int4" for _, w, _ in variants or ())
    if config.is_own:
        for key, message in check_config(config, variants or ()):
            raise reader.error(c, key, message)
        direct_schema.refuse_scheduler_knobs(reader, c, config.schedule)
        return ConfigEntry(common["name"], config, common["knobs"], line)
    if fused and swap_ab:
        raise reader.error(c, "fused", "a fused config cannot be swap_ab: its epilogue pairs act "
                                       "and gate as adjacent columns of a tokens-by-N tile")
    if fused and int4:
        raise reader.error(c, "fused", "not with int4 weights on a CUTLASS schedule (its A8W4 "
                                       "kernels are swap-AB only); schedule wgmma fuses A8W4")
    if fused and config.tile[1] % 32:
        raise reader.error(c, "tile", "a fused config's tile N is a multiple of 32 (its epilogue "
                                      "takes the wgmma tile 32 columns at a time); "
                                      f"got {config.tile[1]}")
    for key, message in check_config(config, variants or ()):
        raise reader.error(c, key, message)
    if not swap_ab and int4:
        raise reader.error(c, "swap_ab" if "swap_ab" in c else "tile",
                           "int4 weights (A8W4) need swap_ab: true (or schedule: direct): "
                           "CUTLASS's mixed-input mainloop converts its A operand in registers, "
                           "so the weight must be A")
    knobs = common["knobs"]
    if "raster" not in c:
        knobs = dataclasses.replace(knobs, raster=TOKENS_FIRST[swap_ab])
    return ConfigEntry(common["name"], config, knobs, line)


def config_fields(entry: ConfigEntry) -> dict[str, Any]:
    """A config as the manifest spells it, defaults included (a dispatch `use` may spell them)."""
    cfg, knobs = entry.config, entry.knobs
    fields = {"tile": list(cfg.tile), "cluster": list(cfg.cluster), "schedule": cfg.schedule,
              "stages": cfg.stages if cfg.stages else "auto", "swap_ab": cfg.swap_ab,
              "intermediate": cfg.intermediate, "fused": cfg.fused,
              "fast_accum": cfg.fast_accum}
    if cfg.is_direct:
        fields["warps_k"] = cfg.warps_k
    if cfg.is_wgmma:
        fields["copy"] = cfg.copy
    if not cfg.is_own:  # CUTLASS's tile scheduler takes the run-time knobs
        fields.update(raster=knobs.raster, swizzle=knobs.swizzle)
    return fields
