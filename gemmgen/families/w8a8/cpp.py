"""C++ spellings of the W8A8 config vocabulary, used by the family's kernel templates."""

from __future__ import annotations

from collections.abc import Sequence

from .configs import ScaledMmSpec as KernelSpec


class Cpp:
    """C++ spellings of the config vocabulary, used by the kernel template."""

    _ELEMENT = {"int8": "int8_t", "e4m3": "cutlass::float_e4m3_t", "bf16": "cutlass::bfloat16_t",
                "fp16": "cutlass::half_t"}
    _KERNEL = {"warpspecialized": "KernelTmaWarpSpecialized",
               "pingpong": "KernelTmaWarpSpecializedPingpong",
               "cooperative": "KernelTmaWarpSpecializedCooperative"}
    _EPILOGUE = {"tma_warpspecialized": "TmaWarpSpecialized",
                 "tma_warpspecialized_cooperative": "TmaWarpSpecializedCooperative"}
    _SCHEDULER = {"persistent": "PersistentScheduler", "streamk": "StreamKScheduler"}

    def element(self, dtype: str) -> str:
        return self._ELEMENT[dtype]

    def shape(self, dims: Sequence[int]) -> str:
        return ", ".join(f"_{d}" for d in dims)

    def kernel_schedule(self, k: KernelSpec) -> str:
        # NOTES: fp8 uses the FastAccum mainloop (no periodic promotion to fp32), as cuBLAS and
        # vLLM do for scaled fp8 GEMMs; int8 accumulates exactly in int32 either way.
        suffix = "FP8FastAccum" if k.a == "e4m3" else ""
        return f"cutlass::gemm::{self._KERNEL[k.config.schedule]}{suffix}"

    def epilogue_schedule(self, k: KernelSpec) -> str:
        return f"cutlass::epilogue::{self._EPILOGUE[k.config.epilogue_schedule]}"

    def tile_scheduler(self, k: KernelSpec) -> str:
        return f"cutlass::gemm::{self._SCHEDULER[k.config.tile_scheduler]}"

    def gemm_shape(self, dims: Sequence[int]) -> str:
        return f"cutlass::gemm::GemmShape<{', '.join(map(str, dims))}>"

    def split_k(self, k: KernelSpec) -> str:
        return {"none": "kNone", "serial": "kSerial", "parallel": "kParallel"}[k.config.split_k]

    def threadblock_swizzle(self, k: KernelSpec) -> str:
        if k.config.swizzle == "streamk":
            return "cutlass::gemm::threadblock::ThreadblockSwizzleStreamK"
        return f"cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{k.config.swizzle}>"
