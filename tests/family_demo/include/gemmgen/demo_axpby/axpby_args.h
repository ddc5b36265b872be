/*
 * gemmgen/demo_axpby/axpby_args.h — the argument struct of the demo axpby family's kernels
 * (tests/family_demo). Mirrored by AxpbyArgs in tests/family_demo/__init__.py; the library
 * exports gemmgen_demo_axpby_args_size() and the loader compares it with the mirror.
 */
#pragma once

#include "gemmgen/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[b, i] = alpha * x[b, i] + beta * out[b, i] for b < batch, i < n (rows of length n). */
typedef struct gemmgen_demo_axpby_args {
  const void* x;
  void* out;
  int64_t n, batch;
  int64_t ldx, ldout; /* row strides, in elements */
  float alpha, beta;
} gemmgen_demo_axpby_args;

#ifdef __cplusplus
}
#endif
