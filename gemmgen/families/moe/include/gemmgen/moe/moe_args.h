/*
 * gemmgen/moe/moe_args.h — the argument struct of the MoE family's kernels
 * (grouped_matmul_swiglu_quant). Mirrored by MoeArgs in gemmgen/families/moe/abi.py; the library
 * exports gemmgen_moe_args_size() and the loader compares it with the mirror.
 *
 * For expert i owning rows [start_i, end_i) of x (from group_list, clamped on the device so that
 * a bad list never indexes out of bounds; see gemmgen/families/moe/grouping.py):
 *   c[rows_i, :] = (x[rows_i] · W_i) ⊙ x_scale[rows_i] ⊙ w_scale[i]        (the grouped GEMM)
 *   S = swish(c[:, :N/2]) ⊙ c[:, N/2:];  q_scale = max|S_row| / QMAX;  q = round(S / q_scale)
 * Rows past the last group get q = 0, q_scale = 0.
 */
#pragma once

#include "gemmgen/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gemmgen_moe_args {
  const void* x;             /* [M, K] int8 / e4m3, row-major, contiguous */
  const void* w;             /* [E, N, K] packed weights: expert-major, K contiguous; int4
                                (A8W4): two per byte, even k in the low nibble */
  const float* w_scale;      /* [E, N] per-channel weight scales, or [E, K / group_size, N]
                                per-group ones (direct and wgmma A8W4 kernels) */
  const float* x_scale;      /* [M] per-token activation scales */
  const int64_t* group_list; /* [E] rows per expert (count) or end offsets (cumsum) */
  void* c;                   /* [M, N] intermediate: the scaled GEMM result (fp32 or bf16) */
  void* q;                   /* [M, N/2] quantized SwiGLU output (int8 / e4m3) */
  float* q_scale;            /* [M] per-row scales of q */
  int64_t m, n, k, experts;
  int32_t group_list_type;   /* 0: counts, 1: cumsum (end offsets) */
  int32_t raster_order;      /* 0 heuristic, 1 along M, 2 along N (in the kernel's terms) */
  int32_t max_swizzle_size;
  int32_t group_size;        /* 0: per channel; else K elements per group of w_scale */
  int32_t layout_version;    /* the packed weight's layout (packing.py), which the kernels
                                pair act and gate columns by: GEMMGEN_MOE_LAYOUT_VERSION */
  int32_t launch_flags;      /* GEMMGEN_LAUNCH_PDL (gemmgen/c_api.h): the direct and wgmma kernels' launches */
} gemmgen_moe_args;

/* Layout 3: act and gate interleaved (packed row 2j is act column j, 2j + 1 gate column j); int4
   weights with per-group scales in the MMA fragment order (2: as per channel). A library built
   for layout 1 has another sizeof(gemmgen_moe_args) (without the field), so the loader refuses
   it, and a kernel refuses a call that names another layout. */
#define GEMMGEN_MOE_LAYOUT_VERSION 3

#ifdef __cplusplus
}
#endif
