// A measurement prototype, not a benchmark of record: the tensor-core rate of bf16 wgmma with
// the A operand in registers (RS, as the mixed-input wgmma kernel issues it: m64 x N x k16, N =
// the tokens) against A in shared memory (SS), for N = 64, 128, 256, with 1 to 4 warpgroups an
// SM issuing back to back (3 at most for N = 256: registers), no memory traffic (every operand
// stays where it is). The question
// (session 27, RESULTS.md): is RS m64n64k16 itself slower than the SM's peak (2048 bf16 MACs a
// cycle), which would cap the register-operand design at 64 tokens whatever its pipeline?
//
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Igemmgen/templates/include \
//        -I"$(python -c 'from gemmgen.build import toolchain; print(toolchain.find_toolchain().cutlass_root)')/include" \
//        -o /tmp/wgmma_rate benchmarks/prototypes/wgmma_rate.cu
//   /tmp/wgmma_rate
#include <cuda_runtime.h>

#include <cstdio>
#include <utility>

#include "cute/arch/mma_sm90.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/numeric_types.h"
#include "gemmgen/shared_memory.cuh"

#include "cuda_check.h"  // CHECK

namespace GMMA = cute::SM90::GMMA;
using Bf16 = cutlass::bfloat16_t;

constexpr int kIters = 512;    // wgmma groups a warpgroup issues
constexpr int kPerGroup = 4;   // wgmmas a group (one 64-K chunk)

template <int N, bool RegisterA, size_t... I>
__device__ void issue(uint32_t const (&a)[4], uint64_t desc_a, uint64_t desc_b, float (&acc)[N / 2],
                      std::index_sequence<I...>) {
  if constexpr (RegisterA) {
    using Mma = decltype(GMMA::rs_op_selector<Bf16, Bf16, float, cute::Shape<cute::_64, cute::Int<N>, cute::_16>,
                                              GMMA::Major::K, GMMA::Major::K>());
    Mma::fma(a[0], a[1], a[2], a[3], desc_b, acc[I]..., GMMA::ScaleOut::One);
  } else {
    using Mma = decltype(GMMA::ss_op_selector<Bf16, Bf16, float, cute::Shape<cute::_64, cute::Int<N>, cute::_16>,
                                              GMMA::Major::K, GMMA::Major::K>());
    Mma::fma(desc_a, desc_b, acc[I]..., GMMA::ScaleOut::One);
  }
}

// Each warpgroup issues kIters groups of kPerGroup wgmmas (commit, wait until one group is in
// flight), as the mixed-input kernel's loop does; thread 0 of the CTA records the cycles.
template <int N, bool RegisterA>
__global__ void __launch_bounds__(N == 256 ? 384 : 512, 1) rate_kernel(long long* cycles, float* sink) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem[];
  uint32_t const base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  for (int i = threadIdx.x; i < (64 + N) * 64; i += blockDim.x) {
    reinterpret_cast<Bf16*>(smem)[i] = Bf16(0.001f * (i % 7));
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  uint64_t const desc_a = gemmgen::smem::sw128_k_major_descriptor(base);
  uint64_t const desc_b = gemmgen::smem::sw128_k_major_descriptor(base + 64 * 128);
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) a[r] = 0x3c003c00u + threadIdx.x + r;
  float acc[N / 2];
  for (int r = 0; r < N / 2; ++r) {
    acc[r] = 0.f;
    cute::warpgroup_fence_operand(acc[r]);
  }
  __syncthreads();
  long long const start = clock64();
  for (int it = 0; it < kIters; ++it) {
    cute::warpgroup_arrive();
#pragma unroll
    for (int j = 0; j < kPerGroup; ++j) {
      issue<N, RegisterA>(a, desc_a + 2 * j, desc_b + 2 * j, acc, std::make_index_sequence<N / 2>{});
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();
  }
  cute::warpgroup_wait<0>();
  for (int r = 0; r < N / 2; ++r) cute::warpgroup_fence_operand(acc[r]);
  __syncthreads();
  long long const stop = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
  float s = 0.f;
  for (int r = 0; r < N / 2; ++r) s += acc[r];
  if (s == 12345.f) sink[threadIdx.x] = s;  // keep the sums alive
#endif
}

template <int N, bool RegisterA>
void measure(int warpgroups, int sms, long long* cycles, float* sink) {
  if (N == 256 && warpgroups > 3) return;  // 128 accumulators: at most 3 warpgroups' registers
  auto* kernel = rate_kernel<N, RegisterA>;
  int const smem = (64 + N) * 128 + 1024;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<sms, 128 * warpgroups, smem>>>(cycles, sink);
  CHECK(cudaGetLastError());
  kernel<<<sms, 128 * warpgroups, smem>>>(cycles, sink);
  CHECK(cudaDeviceSynchronize());
  long long host[1024];
  CHECK(cudaMemcpy(host, cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost));
  long long worst = 0;
  for (int i = 0; i < sms; ++i) worst = host[i] > worst ? host[i] : worst;
  double const macs = double(warpgroups) * kIters * kPerGroup * 64.0 * N * 16;
  std::printf("%s m64n%dk16, %d warpgroup(s) an SM: %7.1f MACs a cycle an SM (%.0f%% of 2048)\n",
              RegisterA ? "RS" : "SS", N, warpgroups, macs / worst, 100.0 * macs / worst / 2048);
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  int const sms = prop.multiProcessorCount;
  long long* cycles;
  float* sink;
  CHECK(cudaMalloc(&cycles, sizeof(long long) * 1024));
  CHECK(cudaMalloc(&sink, sizeof(float) * 512));
  for (int wg = 1; wg <= 4; ++wg) {
    measure<64, true>(wg, sms, cycles, sink);
    measure<64, false>(wg, sms, cycles, sink);
    measure<128, true>(wg, sms, cycles, sink);
    measure<128, false>(wg, sms, cycles, sink);
    measure<256, true>(wg, sms, cycles, sink);
    measure<256, false>(wg, sms, cycles, sink);
  }
  return 0;
}
