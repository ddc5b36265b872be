/*
 * gemmgen/moe/swiglu_quant.cuh — the device kernels of the MoE op around its grouped GEMM:
 *
 *   group_setup   reads the group list on the device and writes the grouped GEMM's per-expert
 *                 problem sizes, operand pointers and strides (no host synchronisation, so the
 *                 op can be captured in a CUDA graph, and empty experts cost nothing);
 *   swiglu_quant  SwiGLU of the GEMM result and dynamic per-row quantization (int8 or e4m3).
 *
 * Both are deterministic: the row maximum is order-independent, every other value has one
 * writer.
 */
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "cute/layout.hpp"
#include "cutlass/float8.h"
#include "cutlass/numeric_types.h"

namespace gemmgen::moe {

// ------------------------------------------------------------------------------- group setup

// Per-expert arrays the grouped GEMM reads (device memory, carved from the workspace). The
// kernel's M and N depend on swap-AB: tokens × N, or N × tokens (the weight as operand A).
template <class ProblemShape, class ElementA, class ElementB, class ElementD, class StrideA,
          class StrideB, class StrideD>
struct GroupArrays {
  ProblemShape* shapes;
  ElementA const** a;
  ElementB const** b;
  ElementD** d;
  float const** x_scales;        // per group: its tokens' x_scale
  float const** w_scales;        // per group: its expert's w_scale row
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  int64_t* rows_total;           // end of the last group: rows past it are outside every group
};

constexpr int kSetupThreads = 256;

// One block. Ends are clamped exactly as grouping.group_offsets(check=False) does:
//   count:  ends = min(cumsum(clamp(g, 0, m)), m);  cumsum: ends = running max of clamp(g, 0, m)
// so 0 <= start_i <= end_i <= m whatever the list holds.
template <bool SwapAB, class Arrays, class ElementX, class ElementW, class ElementD,
          class StrideA, class StrideB, class StrideD>
__global__ void group_setup(Arrays arrays, int64_t const* group_list, int32_t cumsum,
                            int64_t experts, int64_t m, int n, int k, ElementX const* x,
                            ElementW const* w, ElementD* d, float const* x_scale,
                            float const* w_scale, StrideA stride_a, StrideB stride_b,
                            StrideD stride_d) {
  __shared__ int64_t ends[kSetupThreads];
  __shared__ int64_t carry;        // the end of the last group seen so far
  __shared__ int64_t chunk_start;  // the start of this chunk's first group
  if (threadIdx.x == 0) {
    carry = 0;
  }
  for (int64_t base = 0; base < experts; base += kSetupThreads) {
    int64_t const i = base + threadIdx.x;
    __syncthreads();
    if (i < experts) {
      int64_t const v = group_list[i];
      ends[threadIdx.x] = v < 0 ? 0 : (v > m ? m : v);
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // the scan: at most kSetupThreads adds, in shared memory
      chunk_start = carry;
      int64_t running = carry;
      int64_t const count = experts - base < kSetupThreads ? experts - base : kSetupThreads;
      for (int j = 0; j < count; ++j) {
        int64_t const v = ends[j];
        running = cumsum ? (v > running ? v : running) : (running + v > m ? m : running + v);
        ends[j] = running;
      }
      carry = running;
    }
    __syncthreads();
    if (i < experts) {
      int64_t const end = ends[threadIdx.x];
      int64_t const start = threadIdx.x > 0 ? ends[threadIdx.x - 1] : chunk_start;
      int const rows = static_cast<int>(end - start);
      ElementX const* x_i = x + start * k;
      ElementW const* w_i = w + i * static_cast<int64_t>(n) * k;
      if constexpr (SwapAB) {
        arrays.shapes[i] = cute::make_shape(n, rows, k);
        arrays.a[i] = w_i;
        arrays.b[i] = x_i;
      } else {
        arrays.shapes[i] = cute::make_shape(rows, n, k);
        arrays.a[i] = x_i;
        arrays.b[i] = w_i;
      }
      arrays.x_scales[i] = x_scale + start;
      arrays.w_scales[i] = w_scale + i * n;
      arrays.d[i] = d + start * n;
      arrays.stride_a[i] = stride_a;
      arrays.stride_b[i] = stride_b;
      arrays.stride_d[i] = stride_d;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    arrays.rows_total[0] = carry;
  }
}

// ----------------------------------------------------------------------------- SwiGLU + quant

template <class T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}

__device__ __forceinline__ float swiglu(float act, float gate) {
  return act / (1.0f + expf(-act)) * gate;  // expf, not __expf: within a few ulps of exact
}

template <class ElementQ>
struct Quantizer;

template <>
struct Quantizer<int8_t> {
  static constexpr float kMax = 127.0f;
  __device__ static int8_t convert(float v) {  // nearest, ties to even (cvt.rni)
    int const q = __float2int_rn(v);
    return static_cast<int8_t>(q > 127 ? 127 : (q < -127 ? -127 : q));
  }
  __device__ static int8_t zero() { return 0; }
};

template <>
struct Quantizer<cutlass::float_e4m3_t> {
  static constexpr float kMax = 448.0f;
  __device__ static cutlass::float_e4m3_t convert(float v) {  // nearest, ties to even
    v = fminf(fmaxf(v, -kMax), kMax);
    return cutlass::float_e4m3_t(v);
  }
  __device__ static cutlass::float_e4m3_t zero() { return cutlass::float_e4m3_t(0.0f); }
};

constexpr int kQuantThreads = 256;

// One block per row (grid-stride over rows). Pass 1: the row's max |S|; pass 2: S / q_scale.
// S is recomputed in pass 2 (the row is still in L1/L2) rather than held in shared memory.
template <class ElementC, class ElementQ>
__global__ void __launch_bounds__(kQuantThreads)
swiglu_quant(ElementC const* c, ElementQ* q, float* q_scale, int64_t m, int64_t n_half,
             int64_t const* rows_total) {
  using Quant = Quantizer<ElementQ>;
  __shared__ float warp_max[kQuantThreads / 32];
  int64_t const total = *rows_total;
  for (int64_t row = blockIdx.x; row < m; row += gridDim.x) {
    ElementQ* q_row = q + row * n_half;
    if (row >= total) {  // outside every group: q = 0, q_scale = 0
      for (int64_t j = threadIdx.x; j < n_half; j += blockDim.x) {
        q_row[j] = Quant::zero();
      }
      if (threadIdx.x == 0) {
        q_scale[row] = 0.0f;
      }
      continue;
    }
    ElementC const* act = c + row * 2 * n_half;
    ElementC const* gate = act + n_half;
    float amax = 0.0f;
    for (int64_t j = threadIdx.x; j < n_half; j += blockDim.x) {
      amax = fmaxf(amax, fabsf(swiglu(to_float(act[j]), to_float(gate[j]))));
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    }
    if (threadIdx.x % 32 == 0) {
      warp_max[threadIdx.x / 32] = amax;
    }
    __syncthreads();
    amax = 0.0f;
    for (int w = 0; w < kQuantThreads / 32; ++w) {
      amax = fmaxf(amax, warp_max[w]);
    }
    __syncthreads();  // warp_max is rewritten by the next row
    float const scale = amax / Quant::kMax;  // IEEE division, as the reference
    if (scale == 0.0f) {                      // S all zero (or underflowing): never NaN
      for (int64_t j = threadIdx.x; j < n_half; j += blockDim.x) {
        q_row[j] = Quant::zero();
      }
    } else {
      for (int64_t j = threadIdx.x; j < n_half; j += blockDim.x) {
        q_row[j] = Quant::convert(swiglu(to_float(act[j]), to_float(gate[j])) / scale);
      }
    }
    if (threadIdx.x == 0) {
      q_scale[row] = scale;
    }
  }
}

}  // namespace gemmgen::moe
