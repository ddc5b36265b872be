"""Manifest reading that every sm90a (CUTLASS 3.x) op family's schema shares: a config's name,
its stage count, cluster legality, the shared-memory budget and the run-time scheduler knobs
(raster order, swizzle). Each check returns or raises the same file:line errors whichever family
asks."""

from __future__ import annotations

import re
from typing import Any

from .kernel_config import RASTER_ORDERS, SWIZZLES, RuntimeKnobs

SMEM_LIMIT_BYTES = 232_448  # dynamic shared memory per block on sm90
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def config_name(reader, c) -> str | None:
    """The optional `name` of a `configs` entry: a lowercase identifier."""
    name = c.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME_RE.match(name)):
        raise reader.error(c, "name", f"expected a lowercase identifier, got {name!r}")
    return name


def stages(reader, c) -> int:
    """`stages`: 'auto' (0, CUTLASS carves the stages out of what the epilogue leaves) or 2..16."""
    value = c.get("stages", "auto")
    if value == "auto":
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 2 <= value <= 16:
        raise reader.error(c, "stages", f"expected 'auto' or an integer in [2, 16], got {value!r}")
    return value


def scheduler_knobs(reader, c) -> RuntimeKnobs:
    """The run-time knobs of a config: `raster` and `swizzle`."""
    return RuntimeKnobs(raster=reader.choice(c, "raster", RASTER_ORDERS, "heuristic"),
                        swizzle=reader.choice(c, "swizzle", SWIZZLES, 1))


def tile_mn_problems(tile: tuple[int, int, int], m_what: str = "", n_what: str = ""
                     ) -> list[tuple[str, str]]:
    """(key, message) for an illegal tile M (a multiple of the 64-row wgmma, up to 256) or tile
    N (a multiple of 8 up to 256); `m_what` / `n_what` say what the kernel's M / N run over."""
    tm, tn, _ = tile
    problems = []
    if tm % 64 or not 64 <= tm <= 256:
        problems.append(("tile", f"tile M{m_what} must be 64, 128, 192 or 256 (a wgmma is 64 "
                                 f"rows); got {tm}"))
    if tn % 8 or not 8 <= tn <= 256:
        problems.append(("tile", f"tile N{n_what} must be a multiple of 8 in [8, 256]; got {tn}"))
    return problems


def cooperative_problems(schedule: str, tile: tuple[int, int, int]) -> list[tuple[str, str]]:
    """The cooperative schedule splits tile M across two consumer warpgroups."""
    if schedule == "cooperative" and tile[0] % 128:
        return [("schedule", "cooperative splits tile M across two consumer warpgroups, so tile "
                             f"M must be a multiple of 128; got {tile[0]}")]
    return []


def cluster_problems(cluster: tuple[int, int, int]) -> list[tuple[str, str]]:
    """(key, message) for an illegal cluster shape: powers of two, K = 1, at most 16 CTAs."""
    problems = []
    for dim, value in zip("MNK", cluster):
        if value < 1 or value & (value - 1):
            problems.append(("cluster", f"cluster {dim} must be a power of two >= 1; got {value}"))
    if cluster[2] != 1 or cluster[0] * cluster[1] > 16:
        problems.append(("cluster", f"cluster K must be 1 and a cluster holds at most 16 CTAs; "
                                    f"got {'x'.join(map(str, cluster))}"))
    return problems


def smem_problem(tile: tuple[int, int, int], config_stages: int, stage_bytes: int,
                 epilogue_bytes: int, what: str = "") -> tuple[str, str] | None:
    """("stages", message) when `config_stages` (0: auto, counted as the minimum of 2) mainloop
    stages plus the epilogue exceed the sm90 shared-memory limit; else None."""
    count = config_stages or 2
    total = count * stage_bytes + epilogue_bytes
    if total <= SMEM_LIMIT_BYTES:
        return None
    stages_text = (f"{config_stages} stages" if config_stages
                   else "the minimum of 2 stages (stages: auto)")
    return ("stages", f"{stages_text} of tile {'x'.join(map(str, tile))}{what} need about "
                      f"{count} x {stage_bytes} + {epilogue_bytes} = {total} bytes of shared "
                      f"memory, over the sm90 limit of {SMEM_LIMIT_BYTES}")


def read_common(reader, c) -> dict[str, Any]:
    """name, stages and the knobs of an sm90 `configs` entry (already read as a mapping)."""
    return {"name": config_name(reader, c), "stages": stages(reader, c),
            "knobs": scheduler_knobs(reader, c)}
