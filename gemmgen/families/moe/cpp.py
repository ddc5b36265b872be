"""C++ spellings of the MoE config vocabulary, used by the family's kernel template."""

from __future__ import annotations

from collections.abc import Sequence


class Cpp:
    _ELEMENT = {"int8": "int8_t", "e4m3": "cutlass::float_e4m3_t", "fp32": "float",
                "bf16": "cutlass::bfloat16_t", "int4": "cutlass::int4b_t"}

    def element(self, dtype: str) -> str:
        return self._ELEMENT[dtype]

    def shape(self, dims: Sequence[int]) -> str:
        return ", ".join(f"_{d}" for d in dims)

    def direct_config(self, k) -> str:
        """The DirectConfig of a direct kernel (direct_grouped_gemm.cuh)."""
        c = k.config
        return (f"gemmgen::moe::direct::DirectConfig<{self.element(k.w)}, /*warps_n=*/{c.tile[0] // 16}, "
                f"/*warps_k=*/{c.warps_k}, /*token_tiles=*/{c.tile[1] // 8}, "
                f"/*stages=*/{c.ring_stages}>")

    def wgmma_config(self, k) -> str:
        """The WgmmaConfig of a wgmma kernel (wgmma_grouped_gemm.cuh)."""
        c = k.config
        return (f"gemmgen::moe::wgmma::WgmmaConfig<{self.element(k.w)}, "
                f"/*per_group=*/{'true' if k.scales == 'group' else 'false'}, "
                f"/*warp_groups=*/{c.tile[0] // 64}, /*tokens=*/{c.tile[1]}, "
                f"/*stages=*/{c.wgmma_stages}, /*tma=*/{'true' if c.copy == 'tma' else 'false'}, "
                f"/*fused=*/{'true' if c.fused else 'false'}>")

    def op_class(self, k) -> str:
        """The class template behind a kernel's C-ABI entry points."""
        if k.config.is_wgmma:
            return "gemmgen::moe::wgmma::WgmmaSwigluQuant"
        return ("gemmgen::moe::direct::DirectSwigluQuant" if k.config.is_direct
                else "gemmgen::moe::sm90::GroupedSwigluQuant")
