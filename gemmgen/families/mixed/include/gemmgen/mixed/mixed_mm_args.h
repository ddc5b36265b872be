/*
 * gemmgen/mixed/mixed_mm_args.h — the argument struct of the mixed-input GEMM family's kernels
 * (weight-only quantization). Mirrored by MixedMmArgs in gemmgen/families/mixed/abi.py; the
 * library exports gemmgen_mixed_mm_args_size() and the loader compares it with the mirror.
 *
 * out[M,N] = a[M,K] · dequant(w)[K,N] (+ bias[N]); dequant(w)[k,n] = stored[n,k] · scale[g,n]
 * (+ zero[g,n]), g = k / group_size. The packed layout (gemmgen/families/mixed/packing.py,
 * version GEMMGEN_MIXED_LAYOUT_VERSION):
 *   w      int4: [K/64][ceil(N/16)] blocks of 16 rows x 64 k (512 bytes) in the MMA's fragment
 *          order (sm90_mixed_mm.hpp's FragmentOrderAtom); int8: [N, K] K-major
 *   scale  [K/group, N] (N contiguous), activation dtype
 *   zero   [K/group, N] (N contiguous), activation dtype: −scale·(zero − 8), or NULL
 * Act-order (GPTQ desc_act): the packed K is in group order and k_perm[j] is the column of `a`
 * at kernel position j; the entry point gathers a's columns first (gemmgen/mixed/gather_k.cuh).
 */
#pragma once

#include "gemmgen/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gemmgen_mixed_mm_args {
  const void* a;          /* [M, K] activations (bf16/fp16), row stride lda */
  const void* w;          /* packed weight (layout above), contiguous */
  const void* scale;      /* [K/group, N] */
  const void* zero;       /* [K/group, N] or NULL (scale-only kernels) */
  const void* bias;       /* [N] in the output dtype, or NULL */
  void* d;                /* [M, N] output, row stride ldd */
  const int32_t* k_perm;  /* [K] int32, 16-byte aligned, or NULL: K in a's own order */
  int64_t m, n, k;
  int64_t lda, ldd;
  int64_t group_size;     /* a multiple of the tile K that divides K, or K (per-channel) */
  int32_t raster_order;   /* 0 heuristic, 1 along M, 2 along N (the kernel's M is the weight's N) */
  int32_t max_swizzle_size;
  int32_t split_k_slices; /* >1: stream-K kernels split K so; the wgmma kernel splits K over a
                             cluster of this many CTAs (capped at 8 and the chunks) */
  int32_t launch_flags;   /* GEMMGEN_LAUNCH_PDL: the direct kernel as a programmatic dependent launch */
  int32_t layout_version; /* the packed weight's layout: GEMMGEN_MIXED_LAYOUT_VERSION, else refused */
} gemmgen_mixed_mm_args;

/* The packed layout these kernels read (packing.py's LAYOUT_VERSION). */
#define GEMMGEN_MIXED_LAYOUT_VERSION 2
#define GEMMGEN_MIXED_LAYOUT_VERSION_TEXT "2"  /* the same, for messages */

#ifdef __cplusplus
}
#endif
