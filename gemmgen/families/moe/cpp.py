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
