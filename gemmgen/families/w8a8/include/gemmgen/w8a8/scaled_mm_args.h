/*
 * gemmgen/w8a8/scaled_mm_args.h — the argument struct of the W8A8 scaled GEMM family's kernels
 * (sm90a and sm80). Mirrored by ScaledMmArgs in gemmgen/families/w8a8/abi.py; the library
 * exports gemmgen_scaled_mm_args_size() (`<struct>_size`) and the loader compares it with the mirror.
 */
#pragma once

#include "gemmgen/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * W8A8 scaled GEMM, D[M,N] = epilogue(A[M,K] · B[K,N]).
 * A is row-major (K contiguous, row stride lda), B column-major (K contiguous, column stride ldb),
 * D row-major (row stride ldd). Per-token / per-channel choices are run-time flags, so one
 * compiled kernel serves both.
 */
typedef struct gemmgen_scaled_mm_args {
  const void* a;
  const void* b;
  void* d;
  int64_t m, n, k;
  int64_t lda, ldb, ldd;
  const float* scale_a;     /* numel 1 (per-tensor) or M (per-token) */
  const float* scale_b;     /* numel 1 (per-tensor) or N (per-channel) */
  const void* bias;         /* [N] in the output dtype, or NULL */
  const int32_t* azp_adj;   /* [N]: azp_with_adj (ScaledEpilogueAzp) or azp_adj (PerToken) */
  const int32_t* azp;       /* [M] per-token zero points (ScaledEpilogueAzpPerToken) */
  int32_t scale_a_per_token;
  int32_t scale_b_per_channel;
  int32_t raster_order;     /* sm90: 0 heuristic, 1 along M, 2 along N */
  int32_t max_swizzle_size; /* sm90: 1, 2, 4 or 8 */
  int32_t split_k_slices;   /* sm80 kernels built with split-K: K slices (1 = no split) */
  int32_t launch_flags;     /* GEMMGEN_LAUNCH_PDL: sm90, launch as a programmatic dependent */
} gemmgen_scaled_mm_args;

#ifdef __cplusplus
}
#endif
