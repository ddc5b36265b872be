/*
 * gemmgen/splitk_epilogue.cuh — the scaled epilogues applied after a split-K GEMM.
 *
 * CUTLASS 2.x epilogue visitor trees support neither serial nor parallel split-K, so a split
 * kernel writes fp32 partial sums and this kernel reduces the `slices` partials and applies the
 * same math as scaled_epilogues.hpp, element by element:
 *   D = s_a · (s_b · (acc − zp)) + bias,  zp = azp_adj[n] or azp[m]·azp_adj[n] (int32), bias 0 if absent.
 * With bias absent and no zero point this is s_a · (s_b · acc), as ScaledEpilogue computes it.
 */
#pragma once

#include <cuda_runtime.h>

#include "cutlass/numeric_conversion.h"

#include "gemmgen/w8a8/scaled_mm_args.h"

namespace gemmgen {

template <class ElementD>
__global__ void splitk_scaled_epilogue(float const* partials, int slices, int64_t slice_stride,
                                       gemmgen_scaled_mm_args p) {
  int64_t const total = p.m * p.n;
  cutlass::NumericConverter<ElementD, float, cutlass::FloatRoundStyle::round_to_nearest> to_d;
  cutlass::NumericConverter<float, ElementD> from_d;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t const row = i / p.n;
    int64_t const col = i - row * p.n;
    float acc = 0.0f;
    for (int s = 0; s < slices; ++s) {
      acc += partials[s * slice_stride + i];
    }
    if (p.azp_adj != nullptr) {
      int32_t const zero = p.azp != nullptr ? p.azp[row] * p.azp_adj[col] : p.azp_adj[col];
      acc -= static_cast<float>(zero);
    }
    float const scale_a = p.scale_a[p.scale_a_per_token ? row : 0];
    float const scale_b = p.scale_b[p.scale_b_per_channel ? col : 0];
    float const bias = p.bias != nullptr ? from_d(static_cast<ElementD const*>(p.bias)[col]) : 0.0f;
    static_cast<ElementD*>(p.d)[row * p.ldd + col] = to_d(fmaf(scale_a, scale_b * acc, bias));
  }
}

// Launch on `stream`: one thread per output element, a grid-stride loop past 65535·256 elements.
template <class ElementD>
cudaError_t launch_splitk_scaled_epilogue(float const* partials, int slices, int64_t slice_stride,
                                          gemmgen_scaled_mm_args const& p, cudaStream_t stream) {
  int const threads = 256;
  int64_t const blocks_needed = (p.m * p.n + threads - 1) / threads;
  int const blocks = static_cast<int>(blocks_needed < 65535 ? blocks_needed : 65535);
  splitk_scaled_epilogue<ElementD><<<blocks, threads, 0, stream>>>(partials, slices, slice_stride, p);
  return cudaGetLastError();
}

}  // namespace gemmgen
