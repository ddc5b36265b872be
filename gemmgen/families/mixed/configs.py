"""The mixed-input family's typed, frozen configs, its kernel spec and the one function that names
a kernel.

A kernel is fixed by its activation dtype `a` (bf16/fp16: also the MMA, scale and output type),
its stored weight type `w` (int4 or int8) and its dequant `scheme` (`scale`: stored·scale, or
`scale_zero`: stored·scale + zero, for groups of a multiple of 64 or per-channel; `scale_g32`,
`scale_zero_g32`: the same for groups of 32, GPTQ's `group_size=32`), plus its tile config. The
user-facing weight types map onto those at pack time (see packing.py): int4 and uint4b8 →
int4/scale, uint4 → int4/scale_zero, int8 and uint8b128 → int8/scale (`_g32` with group 32).

Why group 32 is a scheme of its own: CUTLASS's mixed-input collective applies one group's factors
to a whole tile K of 64 (it refuses group 32), and the family's own kernels sum a group-32 step
in two halves (two partial sums, two groups' factors a step): a kernel serves either group 32 or
the multiples of 64, never both, and dispatch must not hand group 32 to a CUTLASS kernel. As a
dispatch class of its own it has rules of its own (own kernels only) and no tuned table's picks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...generator.direct_schema import DirectTile
from ...generator.kernel_config import RASTER_ORDERS, SWIZZLES, KernelSpec, Origin, RuntimeKnobs  # noqa: F401

ACTIVATION_DTYPES = ("bf16", "fp16")
WEIGHT_ELEMENTS = ("int4", "int8")
SCHEMES = ("scale", "scale_zero", "scale_g32", "scale_zero_g32")
G32_GROUP = 32  # the group size the `_g32` schemes serve (the others: multiples of 64, or K)
GROUP_STEP = 64  # the kernels' K step: every other group size but K is a multiple of it
SCHEDULES = ("warpspecialized", "pingpong", "cooperative", "direct", "wgmma")
# "direct" is the family's own mma.sync kernel (include/gemmgen/mixed/direct_mixed_mm.cuh): the
# weights stream from global memory through a per-warp cp.async ring into registers, no CUTLASS
# collective; it is the one schedule an sm80 library has, and the small-M kernel of sm90a.
# "wgmma" is the family's own sm90a kernel for tens to hundreds of tokens
# (include/gemmgen/mixed/wgmma_mixed_mm.cuh): int4 weights dequantized in registers into
# wgmma's A operand, the tokens read by wgmma from a swizzled cp.async ring, K split over a
# thread-block cluster chosen at launch.
TILE_SCHEDULERS = ("persistent", "streamk")
# The user-facing weight types and the (stored element, scheme) kernel that serves each.
KERNEL_FOR_WEIGHT_TYPE = {"int4": ("int4", "scale"), "uint4b8": ("int4", "scale"),
                          "uint4": ("int4", "scale_zero"), "int8": ("int8", "scale"),
                          "uint8b128": ("int8", "scale")}


def scheme_for_group(scheme: str, group_size: int) -> str:
    """The scheme of the kernels that serve `scheme` (scale or scale_zero) at this group size."""
    return f"{scheme}_g32" if group_size == G32_GROUP else scheme


def base_scheme(scheme: str) -> str:
    """The dequant math of a scheme: scale or scale_zero (`_g32` removed)."""
    return scheme.removesuffix("_g32")


def scheme_has_zero(scheme: str) -> bool:
    return base_scheme(scheme) == "scale_zero"


def scheme_group_k(scheme: str) -> int:
    """The group granularity a scheme's kernels are built for: 32, or 64 (multiples of 64)."""
    return G32_GROUP if scheme.endswith("_g32") else GROUP_STEP


def group_size_fits(group_size: int, k: int) -> bool:
    """Whether some kernel serves this group size at this K: K itself (per-channel), 32, or a
    multiple of 64 that divides K (the packer, the op and dispatch ask the same; the type of
    `group_size` is the caller's to check: the op sees symbolic ints under torch.compile)."""
    return group_size in (k, G32_GROUP) or (group_size > 0 and group_size % GROUP_STEP == 0
                                           and k % group_size == 0)


def kernel_class(weight_type: str, group_size: int) -> tuple[str, str]:
    """(stored element, scheme) of the kernels serving a packed weight."""
    w, scheme = KERNEL_FOR_WEIGHT_TYPE[weight_type]
    return w, scheme_for_group(scheme, group_size)


# The other way round: a kernel's (stored element, scheme) -> the weight types it serves, in the
# order above (the first is the plain one: int4, uint4, int8), `_g32` schemes alike.
WEIGHT_TYPES_FOR_KERNEL: dict[tuple[str, str], tuple[str, ...]] = {
    (w, scheme_for_group(scheme, group)): tuple(t for t, k in KERNEL_FOR_WEIGHT_TYPE.items()
                                                 if k == (w, scheme))
    for group in (64, G32_GROUP) for w, scheme in dict.fromkeys(KERNEL_FOR_WEIGHT_TYPE.values())}

_SHORT = {"bf16": "bf16", "fp16": "f16", "int4": "i4", "int8": "i8", "scale": "s",
          "scale_zero": "sz", "scale_g32": "sg32", "scale_zero_g32": "szg32"}
_SHORT_SCHEDULE = {"warpspecialized": "ws", "pingpong": "pp", "cooperative": "coop",
                   "direct": "direct", "wgmma": "wgmma"}


@dataclass(frozen=True)
class MixedTileConfig(DirectTile):
    """Compile-time shape of one mixed-input kernel. `tile` is in the kernel's terms: M runs over
    the weight's N, N over the tokens (M of the user's problem).

    Schedule "direct": tile [16·warps_n, tokens, 64] is one CTA's features × tokens × the K
    chunk (tokens 1, 2 or 4 — decode, the MMA's other rows zero — or 8 to 64), `warps_k` the warps
    that split K inside the CTA, `stages` each warp's ring depth (0 = auto, 4), `ctas_per_sm`
    the CTAs an SM must hold at once (the compiler caps each thread's registers to fit them;
    0 = no cap), `rows_per_warp` the features a warp owns (16, or 32: two MMA tiles sharing
    the tokens' fragments and the loop's overhead); cluster is (1, 1, 1).

    Schedule "wgmma": tile [64·warpgroups (64 or 128) features, tokens (the wgmma's N: 16, 32,
    64, 96, 128, 192 or 256), 64] a CTA, `stages` the ring depth (0 = auto, 4), `ctas_per_sm`
    1 or 2 (0 = 1: two CTAs an SM cap the threads at 65536 / (2 · threads) registers); the K
    split's cluster is chosen at launch, so cluster is (1, 1, 1)."""

    WGMMA_AUTO_STAGES = 4

    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    schedule: str
    stages: int  # 0 means "auto"
    tile_scheduler: str
    warps_k: int = 0  # direct only (is_direct, ring_stages: direct_schema.DirectTile)
    ctas_per_sm: int = 0  # direct and wgmma: CTAs an SM must hold (caps the registers); 0 = no cap
    rows_per_warp: int = 16  # direct only: features a warp owns, 16 or 32 (two MMA tiles)

    @property
    def is_wgmma(self) -> bool:
        return self.schedule == "wgmma"

    @property
    def is_own(self) -> bool:
        """The family's own kernels (direct, wgmma): no CUTLASS tile scheduler or its knobs."""
        return self.is_direct or self.is_wgmma

    @property
    def wgmma_stages(self) -> int:
        """The wgmma kernel's ring depth, "auto" resolved."""
        return self.stages or self.WGMMA_AUTO_STAGES

    @property
    def terse(self) -> str:
        """Name fragment, e.g. `t128x16x64_c1x1x1_ws_sauto` (+ `_streamk`), or for the family's
        own kernels `t16x8x64_direct_wk8_s4` and `t128x64x64_wgmma_s4`."""
        stages = f"s{self.stages}" if self.stages else "sauto"
        if self.is_wgmma:
            extra = [f"o{self.ctas_per_sm}"] if self.ctas_per_sm else []
            return "_".join(["t" + "x".join(map(str, self.tile)), "wgmma", stages] + extra)
        if self.is_direct:
            extra = [f"r{self.rows_per_warp}"] if self.rows_per_warp != 16 else []
            extra += [f"o{self.ctas_per_sm}"] if self.ctas_per_sm else []
            return "_".join(["t" + "x".join(map(str, self.tile)), "direct", f"wk{self.warps_k}",
                             stages] + extra)
        parts = ["t" + "x".join(map(str, self.tile)), "c" + "x".join(map(str, self.cluster)),
                 _SHORT_SCHEDULE[self.schedule], stages]
        if self.tile_scheduler != "persistent":
            parts.append(self.tile_scheduler)
        return "_".join(parts)

    @property
    def swap_ab(self) -> bool:
        """Always: the weight is the kernel's A (the output is tiled transposed)."""
        return True


@dataclass(frozen=True, kw_only=True)
class MixedMmSpec(KernelSpec):
    """One mixed-input GEMM kernel: activation dtype, stored weight type, dequant scheme."""

    family = "mixed"
    class_fields = ("a", "w", "scheme")

    a: str
    w: str
    scheme: str

    @property
    def name(self) -> str:
        return kernel_name(self)

    @property
    def d(self) -> str:
        return self.a

    @property
    def with_zero(self) -> bool:
        """Zero points (scale_zero, scale_zero_g32)."""
        return scheme_has_zero(self.scheme)

    @property
    def group_k(self) -> int:
        """The group sizes it serves: 32 (group 32 exactly) or 64 (multiples of 64, and K)."""
        return scheme_group_k(self.scheme)

    @property
    def split_k(self) -> bool:
        """A run-time K split: CUTLASS stream-K's slices, or the wgmma kernel's cluster size (a
        tuned table may name either; the direct kernel and data-parallel CUTLASS take none)."""
        return self.config.tile_scheduler == "streamk" or self.config.is_wgmma

    @property
    def unit_key(self) -> tuple:
        return (self.a, self.config.terse)


def kernel_name(spec: MixedMmSpec) -> str:
    """The family's one naming function: ``{arch}_{op}_{a}_{w}_{scheme}_{tile config}``, e.g.
    ``sm90a_mixed_mm_bf16_i4_sz_t128x16x64_c1x1x1_ws_sauto``."""
    return "_".join([spec.arch, spec.op, _SHORT[spec.a], _SHORT[spec.w], _SHORT[spec.scheme],
                     spec.config.terse])
