"""CUTLASS 3.x (sm90a) legality rules for a tile config, checked before anything compiles.

Each check returns (manifest key, message) pairs so the manifest loader can point at the line.
The rules follow CUTLASS's own generator and builders; where a rule is an estimate (shared
memory), the estimate errs on the safe side and the message shows the arithmetic.
"""

from __future__ import annotations

from .configs import TileConfig

SMEM_LIMIT_BYTES = 232_448  # 227 KiB of dynamic shared memory per block on H100/H200
_BARRIER_BYTES_PER_STAGE = 16
_MAX_CLUSTER_CTAS = 16
DEFAULT_EPILOGUE_SCHEDULE = {"warpspecialized": "tma_warpspecialized",
                             "pingpong": "tma_warpspecialized",
                             "cooperative": "tma_warpspecialized_cooperative"}

Problem = tuple[str, str]


def check_tile(config: TileConfig) -> list[Problem]:
    """Tile and cluster shapes that wgmma, TMA and the builders accept for 8-bit operands."""
    problems: list[Problem] = []
    tm, tn, tk = config.tile
    if tm % 64 or not 64 <= tm <= 256:
        problems.append(("tile", f"tile M must be 64, 128, 192 or 256 (a wgmma is 64 rows); got {tm}"))
    if tn % 16 or not 16 <= tn <= 256:
        problems.append(("tile", f"tile N must be a multiple of 16 in [16, 256]; got {tn}"))
    if tk % 64 or not 64 <= tk <= 256:
        problems.append(("tile", "tile K must be 64, 128, 192 or 256 for 8-bit operands "
                                 f"(whole 64-byte swizzle atoms); got {tk}"))
    cm, cn, ck = config.cluster
    for dim, value in zip("MNK", config.cluster):
        if value < 1 or value & (value - 1):
            problems.append(("cluster", f"cluster {dim} must be a power of two >= 1; got {value}"))
    if ck != 1:
        problems.append(("cluster", f"cluster K must be 1 on sm90; got {ck}"))
    if cm * cn * ck > _MAX_CLUSTER_CTAS:
        problems.append(("cluster", f"a cluster holds at most {_MAX_CLUSTER_CTAS} CTAs; "
                                    f"got {cm}x{cn}x{ck} = {cm * cn * ck}"))
    return problems


def check_schedules(config: TileConfig) -> list[Problem]:
    """Kernel schedule ↔ epilogue schedule ↔ tile scheduler pairings CUTLASS accepts."""
    problems: list[Problem] = []
    if config.schedule == "cooperative" and config.tile[0] % 128:
        problems.append(("schedule", "cooperative splits tile M across two consumer warpgroups, "
                                     f"so tile M must be a multiple of 128; got {config.tile[0]}"))
    expected = DEFAULT_EPILOGUE_SCHEDULE[config.schedule]
    if config.epilogue_schedule != expected:
        problems.append(("epilogue_schedule",
                         f"schedule {config.schedule!r} pairs with epilogue schedule {expected!r}; "
                         f"got {config.epilogue_schedule!r}"))
    if config.tile_scheduler == "streamk" and config.schedule != "cooperative":
        problems.append(("tile_scheduler", "stream-K needs the cooperative schedule; "
                                           f"got schedule {config.schedule!r}"))
    return problems


def estimate_smem(config: TileConfig, out_bytes: int) -> tuple[int, int]:
    """(bytes per mainloop stage, bytes reserved for the epilogue), an upper-side estimate."""
    tm, tn, tk = config.tile
    stage = (tm * tk + tn * tk) * 1 + _BARRIER_BYTES_PER_STAGE
    epi_m = min(tm, 128 if config.schedule == "cooperative" else 64)
    epi_n = min(tn, 32)
    row_broadcasts = 4 * tn * 4  # up to four per-column vectors staged in shared memory
    epilogue = 2 * epi_m * epi_n * out_bytes + row_broadcasts + 1024
    return stage, epilogue


def check_smem(config: TileConfig, out_bytes: int) -> list[Problem]:
    """Explicit stages must fit; `auto` must leave room for at least two stages."""
    stage, epilogue = estimate_smem(config, out_bytes)
    stages = config.stages or 2
    total = stages * stage + epilogue
    if total <= SMEM_LIMIT_BYTES:
        return []
    what = f"{config.stages} stages" if config.stages else "the minimum of 2 stages (stages: auto)"
    return [("stages", f"{what} of tile {'x'.join(map(str, config.tile))} need about "
                       f"{stages} x {stage} + {epilogue} (epilogue) = {total} bytes of shared memory, "
                       f"over the sm90 limit of {SMEM_LIMIT_BYTES}; use fewer stages or a smaller tile")]


def check_config(config: TileConfig, out_bytes: int) -> list[Problem]:
    return check_tile(config) + check_schedules(config) + check_smem(config, out_bytes)
