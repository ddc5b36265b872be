"""The MoE family's typed, frozen configs, its kernel spec and the one function that names a
kernel.

A kernel is fixed by its activation type `x` (int8 or e4m3: also the quantized output q), its
weight type `w` (x's, or int4 with int8 x: A8W4) and its tile config, which also fixes the type of the intermediate C (the
scaled GEMM result that SwiGLU reads): fp32, or bf16 to halve its bytes. Dispatch picks among every config of an element
type, so the intermediate is a config choice, not part of the op's contract. A fused config
(`fused`) does SwiGLU in the GEMM's epilogue: its intermediate is S (N/2 columns), not C.
An e4m3 config with `fast_accum` accumulates as cuBLAS's fp8 GEMMs do (no periodic promotion).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...generator.direct_schema import DirectTile
from ...generator.kernel_config import KernelSpec

ELEMENTS = ("int8", "e4m3")
WEIGHTS = ("int8", "e4m3", "int4")
# (x, w) pairs the kernels serve: A8W8 int8, fp8, and A8W4 (int4 weights, int8 activations).
PAIRS = (("int8", "int8"), ("e4m3", "e4m3"), ("int8", "int4"))
INTERMEDIATES = ("fp32", "bf16")
SCHEDULES = ("pingpong", "cooperative", "direct", "wgmma")
# "direct" is the family's own mma.sync kernel (include/gemmgen/moe/direct_grouped_gemm.cuh): int8
# activations with int8 or int4 weights (per-channel or per-group scales), or e4m3 activations and
# weights (per-channel), few tokens per expert.
# "wgmma" is its own sm90a kernel for A8W4 (include/gemmgen/moe/wgmma_grouped_gemm.cuh): int4
# weights converted to int8 in registers as wgmma's A operand, per-channel or per-group scales,
# tens to hundreds of tokens per expert.
WGMMA_AUTO_STAGES = 4
# How the wgmma kernel fills its ring: every thread's cp.async (the default), or the TMA (thread 0
# queues a chunk's boxes on the slot's mbarrier; fewer instructions and better-formed DRAM
# requests at hundreds of tokens an expert, a longer round trip at decode: RESULTS, session 50).
COPIES = ("cp_async", "tma")
SCALES = ("channel", "group")

_SHORT = {"int8": "i8", "e4m3": "e4m3", "fp32": "f32", "bf16": "bf16", "int4": "w4"}
_SHORT_SCHEDULE = {"pingpong": "pp", "cooperative": "coop", "direct": "direct", "wgmma": "wgmma"}


@dataclass(frozen=True)
class MoeTileConfig(DirectTile):
    """Compile-time shape of one sm90 grouped GEMM. With `swap_ab` the tile is in the kernel's
    terms C_iᵀ = W_i · X_iᵀ: tile M runs over the weight's N, tile N over an expert's tokens.

    Schedule "direct": tile [16·warps_n, 8·token_tiles, 128] is one CTA's features × rows × the
    K chunk, `warps_k` the warps that split K inside the CTA, `stages` each warp's ring depth
    (0: DIRECT_AUTO_STAGES); no cluster, not swap-AB (the weight is the MMA's A by design).

    Schedule "wgmma": tile [64·warpgroups (64 or 128) features, an expert's rows a tile (the
    wgmma's N), 128 K], `stages` the ring depth (0: WGMMA_AUTO_STAGES), `copy` what fills the
    ring (COPIES); like direct, no cluster and not swap-AB."""

    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    schedule: str
    stages: int  # 0 means "auto"
    swap_ab: bool
    intermediate: str  # fp32 or bf16: the element type of C (fused: of S; C stays fp32)
    fused: bool = False  # SwiGLU + row max in the epilogue, then a light quant pass
    # e4m3 only: CUTLASS's FP8FastAccum mainloop (the tensor cores' own accumulation, no
    # promotion to fp32 every few wgmmas), as cuBLAS's and the W8A8 family's fp8 kernels run
    fast_accum: bool = False
    warps_k: int = 0  # direct only (is_direct, ring_stages: direct_schema.DirectTile)
    copy: str = "cp_async"  # wgmma only: COPIES

    @property
    def is_wgmma(self) -> bool:
        return self.schedule == "wgmma"

    @property
    def is_own(self) -> bool:
        """The family's own kernels (direct, wgmma): no CUTLASS tile scheduler, cluster or
        swap-AB; run inside the direct kernels' three-launch op."""
        return self.is_direct or self.is_wgmma

    @property
    def wgmma_stages(self) -> int:
        """The wgmma kernel's ring depth, "auto" resolved."""
        return self.stages or WGMMA_AUTO_STAGES

    @property
    def terse(self) -> str:
        """Name fragment, e.g. `f32_t128x16x128_c1x1x1_pp_sauto_swap`,
        `f32_t64x8x128_direct_wk4_s4`, `f32_t128x64x128_wgmma_s4`,
        `f32_t128x64x128_wgmma_s4_tma` or `f32_t128x80x128_wgmma_s5_fused`."""
        if self.is_wgmma:
            return "_".join([_SHORT[self.intermediate], "t" + "x".join(map(str, self.tile)),
                             "wgmma", f"s{self.wgmma_stages}"]
                            + (["tma"] if self.copy == "tma" else [])
                            + (["fused"] if self.fused else []))
        if self.is_direct:
            return "_".join([_SHORT[self.intermediate], "t" + "x".join(map(str, self.tile)),
                             "direct", f"wk{self.warps_k}", f"s{self.ring_stages}"])
        parts = [_SHORT[self.intermediate], "t" + "x".join(map(str, self.tile)), "c" + "x".join(map(str, self.cluster)),
                 _SHORT_SCHEDULE[self.schedule], f"s{self.stages}" if self.stages else "sauto"]
        if self.swap_ab:
            parts.append("swap")
        if self.fused:
            parts.append("fused")
        if self.fast_accum:
            parts.append("fa")
        return "_".join(parts)


@dataclass(frozen=True, kw_only=True)
class MoeSpec(KernelSpec):
    """One grouped_matmul_swiglu_quant kernel: activation type `x`, weight type `w`, weight
    scales per output `channel` ([E, N]) or per `group` of K ([E, K/group, N]: the family's own
    kernels only)."""

    family = "moe"
    class_fields = ("x", "w", "scales")

    x: str
    w: str
    scales: str = "channel"

    @property
    def name(self) -> str:
        return kernel_name(self)

    @property
    def d(self) -> str:
        return self.x

    @property
    def c(self) -> str:
        """The intermediate's element type."""
        return self.config.intermediate

    @property
    def split_k(self) -> bool:
        return False

    @property
    def unit_key(self) -> tuple:
        return (self.x + ("" if self.w == self.x else "w4") + ("g" if self.scales == "group" else ""),
                self.config.terse)


def kernel_name(spec: MoeSpec) -> str:
    """The family's one naming function: ``{arch}_{op}_{x}[w4][g]_{config}``, e.g.
    ``sm90a_grouped_matmul_swiglu_quant_i8_f32_t128x16x128_c1x1x1_pp_sauto_swap`` (A8W8),
    ``sm90a_grouped_matmul_swiglu_quant_i8w4_f32_...`` (A8W4) or ``..._i8w4g_f32_...`` (A8W4 with
    per-group scales)."""
    element = (_SHORT[spec.x] + (_SHORT[spec.w] if spec.w != spec.x else "")
               + ("g" if spec.scales == "group" else ""))
    return "_".join([spec.arch, spec.op, element, spec.config.terse])
