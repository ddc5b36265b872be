/*
 * gemmgen/c_api.h — the plain C ABI every generated kernel library exports.
 *
 * The library links neither Python nor torch: Python loads it with ctypes and passes raw device
 * pointers, strides and the current CUDA stream. One struct per op family keeps the signature of
 * every kernel of that family identical, so the bindings need one ctypes prototype per family.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define GEMMGEN_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes returned by every kernel entry point; gemmgen_last_error() has the details. */
enum gemmgen_status {
  GEMMGEN_OK = 0,
  GEMMGEN_CANNOT_IMPLEMENT = 1, /* CUTLASS can_implement() refused the problem (alignment, size) */
  GEMMGEN_WORKSPACE_TOO_SMALL = 2,
  GEMMGEN_INITIALIZE_FAILED = 3,
  GEMMGEN_LAUNCH_FAILED = 4,    /* the launch or a CUDA call before it failed */
  GEMMGEN_WRONG_ARCH = 5        /* the current device cannot run this kernel's SASS */
};

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
  int32_t reserved;
} gemmgen_scaled_mm_args;

typedef int (*gemmgen_scaled_mm_fn)(const gemmgen_scaled_mm_args* args, void* workspace,
                                   size_t workspace_bytes, void* stream);
typedef size_t (*gemmgen_scaled_mm_workspace_fn)(const gemmgen_scaled_mm_args* args);

/* Exported once per library (library.cu). */
GEMMGEN_EXPORT const char* gemmgen_last_error(void);
GEMMGEN_EXPORT const char* gemmgen_library_fingerprint(void);
GEMMGEN_EXPORT size_t gemmgen_scaled_mm_args_size(void);

#ifdef __cplusplus
}
#endif
