"""The W8A8 family's typed, frozen configs, its kernel spec and the one function that names a kernel.

A `ScaledMmSpec` is everything that shapes one compiled W8A8 kernel (dtypes, epilogue, tile
config) plus where it came from; `RuntimeKnobs` (generic) are the per-call scheduler settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...generator.kernel_config import RASTER_ORDERS, SWIZZLES, KernelSpec, Origin, RuntimeKnobs  # noqa: F401

# Vocabulary shared by validation, naming, templates and bindings.
DTYPES_8BIT = ("int8", "e4m3")
OUT_DTYPES = ("bf16", "fp16")
ACC_FOR = {"int8": "int32", "e4m3": "fp32"}
EPILOGUES = ("ScaledEpilogue", "ScaledEpilogueBias", "ScaledEpilogueAzp",
             "ScaledEpilogueAzpPerToken")
AZP_EPILOGUES = ("ScaledEpilogueAzp", "ScaledEpilogueAzpPerToken")
SCHEDULES = ("warpspecialized", "pingpong", "cooperative")
EPILOGUE_SCHEDULES = ("tma_warpspecialized", "tma_warpspecialized_cooperative")
TILE_SCHEDULERS = ("persistent", "streamk")
SM80_SWIZZLES = (1, 2, 4, 8, "streamk")  # compile time in CUTLASS 2.x
SPLIT_K_MODES = ("none", "serial", "parallel")

_SHORT_DTYPE = {"int8": "i8", "e4m3": "e4m3", "bf16": "bf16", "fp16": "f16"}
_SHORT_EPILOGUE = {"ScaledEpilogue": "scaled", "ScaledEpilogueBias": "scaled_bias",
                   "ScaledEpilogueAzp": "azp", "ScaledEpilogueAzpPerToken": "azp_pertoken"}
_SHORT_SCHEDULE = {"warpspecialized": "ws", "pingpong": "pp", "cooperative": "coop"}


@dataclass(frozen=True)
class TileConfig:
    """Compile-time shape of one sm90 kernel: what makes two binaries different."""

    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    schedule: str
    epilogue_schedule: str
    stages: int  # 0 means "auto": as many as fit beside the epilogue's shared memory
    tile_scheduler: str
    swap_ab: bool

    @property
    def terse(self) -> str:
        """Name fragment, e.g. `t128x128x128_c2x1x1_pp_sauto` (+ `_streamk`, `_swapab`)."""
        parts = ["t" + "x".join(map(str, self.tile)), "c" + "x".join(map(str, self.cluster)),
                 _SHORT_SCHEDULE[self.schedule], f"s{self.stages}" if self.stages else "sauto"]
        if self.tile_scheduler != "persistent":
            parts.append(self.tile_scheduler)
        if self.swap_ab:
            parts.append("swapab")
        return "_".join(parts)


@dataclass(frozen=True)
class Sm80TileConfig:
    """Compile-time shape of one sm80 (CUTLASS 2.x) kernel."""

    tile: tuple[int, int, int]
    warp: tuple[int, int, int]
    instruction: tuple[int, int, int]
    stages: int
    swizzle: int | str  # GemmIdentityThreadblockSwizzle<N>, or "streamk"
    split_k: str = "none"  # also builds a split-K path: "serial" or "parallel"

    @property
    def swap_ab(self) -> bool:
        return False

    @property
    def terse(self) -> str:
        """Name fragment, e.g. `t128x128x64_w64x64x64_s5_sw1` (`_streamk`; `_skpar`, `_skser`)."""
        swizzle = "streamk" if self.swizzle == "streamk" else f"sw{self.swizzle}"
        parts = ["t" + "x".join(map(str, self.tile)), "w" + "x".join(map(str, self.warp)),
                 f"s{self.stages}", swizzle]
        if self.split_k != "none":
            parts.append("sk" + self.split_k[:3])
        return "_".join(parts)


def is_azp(epilogue: str) -> bool:
    """Whether an epilogue takes activation zero points (the op `scaled_mm_azp` serves it)."""
    return epilogue in AZP_EPILOGUES


def has_split_k(config: "TileConfig | Sm80TileConfig") -> bool:
    """Whether a kernel of this config also builds the sm80 split-K path."""
    return isinstance(config, Sm80TileConfig) and config.split_k != "none"


@dataclass(frozen=True, kw_only=True)
class ScaledMmSpec(KernelSpec):
    """One W8A8 scaled-GEMM kernel: a (= b) and d dtypes, the epilogue, the tile config."""

    family = "w8a8"
    class_fields = ("a", "d", "epilogue")

    a: str
    d: str
    epilogue: str

    @property
    def name(self) -> str:
        return kernel_name(self)

    @property
    def acc(self) -> str:
        return ACC_FOR[self.a]

    @property
    def unit_key(self) -> tuple:
        return (self.a, self.config.terse)

    @property
    def split_k(self) -> bool:
        return has_split_k(self.config)


def kernel_name(spec: ScaledMmSpec) -> str:
    """The one naming function of the family: symbols, file names, overrides and listings.

    Grammar: ``{arch}_{op}_{a}_{d}_{epilogue}_{tile config}``, e.g.
    ``sm90a_scaled_mm_i8_bf16_scaled_bias_t128x128x128_c2x1x1_pp_sauto`` (b is a's type, so it
    is not spelled).
    """
    return "_".join([spec.arch, spec.op, _SHORT_DTYPE[spec.a], _SHORT_DTYPE[spec.d],
                     _SHORT_EPILOGUE[spec.epilogue], spec.config.terse])
