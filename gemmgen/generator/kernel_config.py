"""Typed, frozen kernel configs and the one function that names a kernel.

A `KernelSpec` is everything that shapes one compiled kernel (dtypes, epilogue, tile config)
plus where it came from; `RuntimeKnobs` are the per-call scheduler settings (raster order,
swizzle) that CUTLASS 3.x takes at run time, so they never multiply the binaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
RASTER_ORDERS = ("heuristic", "along_m", "along_n")
SWIZZLES = (1, 2, 4, 8)
SM80_SWIZZLES = (1, 2, 4, 8, "streamk")  # compile time in CUTLASS 2.x
SPLIT_K_MODES = ("none", "serial", "parallel")

_SHORT_DTYPE = {"int8": "i8", "e4m3": "e4m3", "bf16": "bf16", "fp16": "f16"}
_SHORT_EPILOGUE = {"ScaledEpilogue": "scaled", "ScaledEpilogueBias": "scaled_bias",
                   "ScaledEpilogueAzp": "azp", "ScaledEpilogueAzpPerToken": "azp_pertoken"}
_SHORT_SCHEDULE = {"warpspecialized": "ws", "pingpong": "pp", "cooperative": "coop"}


@dataclass(frozen=True)
class Origin:
    """Where a kernel was declared: manifest file, line of its config, family and config label.

    `label` (without the line) heads generated sources, so moving a config within the manifest
    does not change the sources and trigger a rebuild.
    """

    file: str
    line: int
    family: str
    config: str

    @property
    def label(self) -> str:
        return f"{self.file}, family {self.family!r}, config {self.config!r}"

    def __str__(self) -> str:
        return f"{self.file}:{self.line} (family {self.family!r}, config {self.config!r})"


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


@dataclass(frozen=True)
class RuntimeKnobs:
    """Scheduler settings passed at every call; the default ones of a config live here."""

    raster: str = "heuristic"
    swizzle: int = 1
    split_k_slices: int = 1  # default K slices of a kernel built with split-K


@dataclass(frozen=True)
class KernelSpec:
    """One kernel to generate, compile and bind."""

    library: str
    arch: str
    op: str
    a: str
    d: str
    epilogue: str
    config: TileConfig | Sm80TileConfig
    knobs: RuntimeKnobs = field(default_factory=RuntimeKnobs, compare=False)
    origin: Origin | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return kernel_name(self)

    @property
    def acc(self) -> str:
        return ACC_FOR[self.a]


def kernel_name(spec: KernelSpec) -> str:
    """The one naming function: symbols, file names, overrides and listings all use it.

    Grammar: ``{arch}_{op}_{a}_{d}_{epilogue}_{tile config}``, e.g.
    ``sm90a_scaled_mm_i8_bf16_scaled_bias_t128x128x128_c2x1x1_pp_sauto``.
    """
    return "_".join([spec.arch, spec.op, _SHORT_DTYPE[spec.a], _SHORT_DTYPE[spec.d],
                     _SHORT_EPILOGUE[spec.epilogue], spec.config.terse])
