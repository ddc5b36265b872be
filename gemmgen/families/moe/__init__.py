"""The MoE grouped-GEMM op family, `grouped_matmul_swiglu_quant` (like Ascend's
aclnnGroupedMatmulSwigluQuantV2): per-expert GEMM of token rows grouped by expert, dequant,
SwiGLU and per-token quantization. BEING BUILT: no kernels, manifest keys or torch op yet, and no
`FAMILY` attribute here, so the family registry (gemmgen.families) skips this folder.

What exists (CPU groundwork, exact and tested in tests/test_moe_reference.py):

- `grouping.py`: `group_offsets` (a group list, counts or cumsum, to the row range [start, end)
  of every expert, torch ops only, no host sync unless checking), `check_group_list` (the one
  value check, which syncs; errors name the first bad entry), `stack_weights` (a stacked
  [E, ...] tensor or a list of E per-expert tensors to one stacked tensor).
- `gemmgen/reference.py`: `grouped_matmul_swiglu_quant` (the plain torch definition of the op:
  A8W8 int8, fp8 e4m3, A8W4 per-channel and per-group), `grouped_matmul_dequant` (its first
  step alone: the dequantized float32 GEMM result C) and `swiglu_quant_reference` (its last two
  steps: SwiGLU and per-token quantization of a given C).
"""
