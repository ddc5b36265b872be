"""C++ spellings of the mixed-input config vocabulary, used by the family's kernel template."""

from __future__ import annotations

from collections.abc import Sequence

from .configs import MixedMmSpec


class Cpp:
    _ELEMENT = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t", "int4": "cutlass::int4b_t",
                "int8": "int8_t"}
    _KERNEL = {"warpspecialized": "KernelTmaWarpSpecialized",
               "pingpong": "KernelTmaWarpSpecializedPingpong",
               "cooperative": "KernelTmaWarpSpecializedCooperative"}
    _EPILOGUE = {"warpspecialized": "TmaWarpSpecialized", "pingpong": "TmaWarpSpecialized",
                 "cooperative": "TmaWarpSpecializedCooperative"}
    _SCHEDULER = {"persistent": "PersistentScheduler", "streamk": "StreamKScheduler"}

    def element(self, dtype: str) -> str:
        return self._ELEMENT[dtype]

    def boolean(self, value: bool) -> str:
        return "true" if value else "false"

    def shape(self, dims: Sequence[int]) -> str:
        return ", ".join(f"_{d}" for d in dims)

    def kernel_schedule(self, k: MixedMmSpec) -> str:
        return f"cutlass::gemm::{self._KERNEL[k.config.schedule]}"

    def epilogue_schedule(self, k: MixedMmSpec) -> str:
        return f"cutlass::epilogue::{self._EPILOGUE[k.config.schedule]}"

    def direct_config(self, k: MixedMmSpec) -> str:
        """The direct kernel's config type: tile [16·warps_n, tokens, chunk K], warps_k, ring."""
        c = k.config
        return (f"gemmgen::mixed::direct::DirectConfig<{self.element(k.a)}, {self.element(k.w)}, "
                f"/*with_zero=*/{self.boolean(k.with_zero)}, "
                f"/*warps_n=*/{c.tile[0] // c.rows_per_warp}, /*warps_k=*/{c.warps_k}, "
                f"/*tokens=*/{c.tile[1]}, /*chunk_k=*/{c.tile[2]}, /*stages=*/{c.ring_stages}, "
                f"/*ctas_per_sm=*/{c.ctas_per_sm}, /*row_tiles=*/{c.rows_per_warp // 16}, "
                f"/*group_k=*/{k.group_k}>")

    def wgmma_config(self, k: MixedMmSpec) -> str:
        """The wgmma kernel's config type: warpgroups (64 features each), tokens, ring depth."""
        c = k.config
        return (f"gemmgen::mixed::wgmma::WgmmaConfig<{self.element(k.a)}, {self.element(k.w)}, "
                f"/*with_zero=*/{self.boolean(k.with_zero)}, "
                f"/*warpgroups=*/{c.tile[0] // 64}, /*tokens=*/{c.tile[1]}, "
                f"/*stages=*/{c.wgmma_stages}, /*group_k=*/{k.group_k}, "
                f"/*ctas_per_sm=*/{c.ctas_per_sm or 1}>")

    def tile_scheduler(self, k: MixedMmSpec) -> str:
        return f"cutlass::gemm::{self._SCHEDULER[k.config.tile_scheduler]}"
