"""Manifest rules shared by the families' "direct" kernels (schedule: direct): the mma.sync
weight-streaming kernels of the mixed-input family (direct_mixed_mm.cuh) and of the MoE family
(direct_grouped_gemm.cuh). One warp owns 16 output features and a range of K; a CTA is
tile M / 16 feature warps times `warps_k` warps that split K, over tile N tokens (8 an MMA tile),
streaming K in chunks of tile K through a per-warp ring of `stages` chunks."""

from __future__ import annotations

AUTO_STAGES = 4            # the ring depth of `stages: auto`
WARPS_K = (1, 2, 4, 8, 16)
TILE_M = (16, 32, 64, 128, 256)  # 16 features a warp: 1 to 16 feature warps
TILE_N = (8, 16, 32, 64)    # tokens: 1 to 8 MMA tiles of 8
MAX_THREADS = 512
MAX_STAGES = 8


class DirectTile:
    """What a family's tile config (a frozen dataclass with `schedule`, `stages` and `warps_k`)
    knows about schedule direct."""

    DIRECT_AUTO_STAGES = AUTO_STAGES

    @property
    def is_direct(self) -> bool:
        return self.schedule == "direct"

    @property
    def ring_stages(self) -> int:
        """The direct kernel's ring depth, "auto" resolved."""
        return self.stages or self.DIRECT_AUTO_STAGES


def warps(tile: tuple[int, int, int], warps_k: int, rows_per_warp: int = 16) -> int:
    """Warps of a direct CTA: one per `rows_per_warp` features, times the warps that split K."""
    return tile[0] // rows_per_warp * warps_k


def shape_problems(tile: tuple[int, int, int], warps_k: int, cluster: tuple[int, int, int],
                   stages: int, chunk_k: int | tuple[int, ...], auto_stages: int,
                   tile_n: tuple[int, ...] = TILE_N, rows_per_warp: int = 16
                   ) -> list[tuple[str, str]]:
    """(key, message) for every rule of the direct kernels' shape a config breaks: the tile (tile
    N one of `tile_n`, tile K `chunk_k` or one of them), the warps that split K, the thread count,
    no cluster, the ring depth (0 = auto)."""
    tm, tn, tk = tile
    chunks = (chunk_k,) if isinstance(chunk_k, int) else chunk_k
    problems = []
    if tm not in TILE_M or tn not in tile_n or tk not in chunks:
        problems.append(("tile", "the direct kernel's tile is [16·warps over features (16, 32, 64, "
                                 f"128 or 256), tokens ({', '.join(map(str, tile_n))}), "
                                 f"{' or '.join(map(str, chunks))}]; got {list(tile)}"))
    if warps_k not in WARPS_K:
        problems.append(("warps_k", "schedule direct needs warps_k (the warps that split K in a "
                                    f"CTA), one of {', '.join(map(str, WARPS_K))}; got "
                                    f"{warps_k or 'none'}"))
    elif tm in TILE_M and 32 * warps(tile, warps_k, rows_per_warp) > MAX_THREADS:
        problems.append(("warps_k", f"tile M {tm} x warps_k {warps_k} makes "
                                    f"{32 * warps(tile, warps_k, rows_per_warp)} threads a CTA; "
                                    f"at most {MAX_THREADS}"))
    if cluster != (1, 1, 1):
        problems.append(("cluster", "the direct kernel has no clusters: leave cluster out or "
                                    f"write [1, 1, 1]; got {list(cluster)}"))
    if stages and stages > MAX_STAGES:
        problems.append(("stages", f"the direct kernel's ring holds 2 to {MAX_STAGES} chunks "
                                   f"(auto: {auto_stages}); got {stages}"))
    return problems


WGMMA_STAGES = (3, 8)  # the families' wgmma kernels (mixed, MoE): a cp.async ring of 3 to 8 chunks


def wgmma_stages_problems(stages: int, auto_stages: int) -> list[tuple[str, str]]:
    """The ring depth of a family's wgmma kernel: 0 (auto_stages) or WGMMA_STAGES' range."""
    lo, hi = WGMMA_STAGES
    if stages and not lo <= stages <= hi:
        return [("stages", f"the wgmma kernel's ring holds {lo} to {hi} chunks (auto: "
                           f"{auto_stages}); got {stages}")]
    return []


def read_warps_k(reader, c) -> int:
    """`warps_k` of a config mapping (0 when absent: only schedule direct takes it)."""
    value = c.get("warps_k", 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise reader.error(c, "warps_k", f"expected an integer, one of "
                                         f"{', '.join(map(str, WARPS_K))}; got {value!r}")
    return value


def refuse_scheduler_knobs(reader, c, schedule: str = "direct") -> None:
    """A family's own kernel (schedule direct or wgmma) has no tile scheduler, so no raster or
    swizzle key."""
    for key in ("raster", "swizzle"):
        if key in c:
            raise reader.error(c, key, f"the {schedule} kernel has no tile scheduler, so no {key}: "
                                       "leave the key out")
