// A measurement prototype, not a benchmark of record: the act-order column gather
// (out[row, j] = a[row, k_perm[j]], 16-bit elements) two ways, alone and beside a kernel that
// holds most of every SM's shared memory, to test session 24's hypothesis (RESULTS.md,
// "Act-order"): the shipped gather (gemmgen/mixed/gather_k.cuh) reads a's row at scattered
// 2-byte positions and is fast only while L1 holds the row, and a gather CTA that shares its SM
// with GEMM CTAs (~200 KB of shared memory each) gets the small L1 the carve-out leaves.
//
//   global  gather_k.cuh's gather_columns: a thread writes 16 bytes of a row from 8 scattered
//           global reads
//   staged  gather_k.cuh's gather_columns_staged: a CTA copies its row into shared memory with
//           16-byte coalesced reads, then writes its share of the row's outputs from shared
//           memory (rows split over CTAs while they are fewer than about two an SM, as shipped)
//
// Each variant is timed by CUDA events (median of 50 after 10 warm-ups), then its output checked
// against a host gather: alone, and while a "hog" kernel on another stream keeps one CTA with
// 200 KB of shared memory resident on every SM (spinning on a flag this program releases after
// timing; a staged CTA that does not fit beside it is not run there). Not built by gemmgen; on a Hopper machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -Igemmgen/templates/include -Igemmgen/families/mixed/include \
//        -I"$(python -c 'from gemmgen.build import toolchain; print(toolchain.find_toolchain().cutlass_root)')/include" \
//        -o /tmp/gather_variants benchmarks/prototypes/gather_variants.cu
//   /tmp/gather_variants
//
// Written in session 24; run in session 25 (RESULTS.md, "session 25"), when the staged kernel
// moved into gather_k.cuh. GATHER_HOG=1 adds the hog columns.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "gemmgen/mixed/gather_k.cuh"  // the shipped gather: gemmgen::mixed::gather::gather_columns

#include "cuda_check.h"  // CHECK

using gemmgen::mixed::gather::kThreads;  // the shipped launch's settings

// One CTA an SM holding its dynamic shared memory, counting itself in *arrived, then spinning
// until *release != 0 (both in mapped host memory).
__global__ void hog(int volatile* arrived, int volatile const* release) {
  extern __shared__ char hold[];
  if (threadIdx.x == 0) {
    hold[0] = 0;
    atomicAdd(const_cast<int*>(arrived), 1);
    while (*release == 0) {
      __nanosleep(1000);
    }
  }
}

struct Problem {
  int64_t m;
  int k;
  uint16_t* a;
  int32_t* perm;
  uint16_t* out;
};

static void launch(char const* variant, Problem const& p, int sms, cudaStream_t stream) {
  if (variant[0] == 'g') {
    int64_t const work = p.m * (p.k / 8);
    int const blocks = static_cast<int>(std::min<int64_t>(work / kThreads + 1, gemmgen::mixed::gather::kMaxBlocks));
    gemmgen::mixed::gather::gather_columns<<<blocks, kThreads, 0, stream>>>(p.a, p.k, p.perm,
                                                                            p.out, p.m, p.k);
  } else {
    int const splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(16, 2 * sms / p.m)));
    gemmgen::mixed::gather::gather_columns_staged<<<dim3(splits, static_cast<unsigned>(p.m)),
                                                    kThreads, p.k * 2, stream>>>(p.a, p.k, p.perm,
                                                                                 p.out, p.k);
  }
}

static float median_us(char const* variant, Problem const& p, int sms, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 10; ++i) launch(variant, p, sms, stream);
  std::vector<float> times;
  for (int i = 0; i < 50; ++i) {
    CHECK(cudaEventRecord(start, stream));
    launch(variant, p, sms, stream);
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0f);
  }
  std::sort(times.begin(), times.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return times[times.size() / 2];
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int const sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs\n", prop.name, sms);
  int const hog_smem = 200 * 1024;
  CHECK(cudaFuncSetAttribute(hog, cudaFuncAttributeMaxDynamicSharedMemorySize, hog_smem));
  CHECK(cudaFuncSetAttribute(gemmgen::mixed::gather::gather_columns_staged,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             gemmgen::mixed::gather::kStagedMaxK * 2));
  int *flags, *flags_device;  // [0]: hog CTAs arrived, [1]: release
  CHECK(cudaHostAlloc(&flags, 2 * sizeof(int), cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(&flags_device, flags, 0));
  int volatile* arrived = flags;
  cudaStream_t work, side;
  CHECK(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  std::mt19937 rng(24);
  std::printf("%6s %6s  %12s %12s  %12s %12s   (µs, median)\n", "M", "K", "global", "staged",
              "global+hog", "staged+hog");
  bool const hog_too = std::getenv("GATHER_HOG") != nullptr;  // the hog columns (session 24's test)
  for (int k : {4096, 8192, 14336, 28672}) {
    std::vector<int32_t> perm(k);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t m : {1, 4, 16, 64, 128, 256, 1024, 4096}) {
      std::vector<uint16_t> host(m * k);
      for (auto& v : host) v = static_cast<uint16_t>(rng());
      Problem p{m, k, nullptr, nullptr, nullptr};
      CHECK(cudaMalloc(&p.a, host.size() * 2));
      CHECK(cudaMalloc(&p.out, host.size() * 2));
      CHECK(cudaMalloc(&p.perm, k * 4));
      CHECK(cudaMemcpy(p.a, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(p.perm, perm.data(), k * 4, cudaMemcpyHostToDevice));
      float us[4];
      int column = 0;
      for (bool with_hog : {false, true}) {
        if (with_hog && !hog_too) {
          us[column++] = -1.0f;
          us[column++] = -1.0f;
          continue;
        }
        for (char const* variant : {"global", "staged"}) {
          // a staged CTA (K * 2 bytes) does not fit beside the hog: it would wait for it
          if (with_hog && variant[0] == 's' && k * 2 + hog_smem > prop.sharedMemPerMultiprocessor - 2048) {
            us[column++] = -1.0f;
            continue;
          }
          CHECK(cudaMemset(p.out, 0xFF, host.size() * 2));
          if (with_hog) {
            flags[0] = flags[1] = 0;
            hog<<<sms, 32, hog_smem, side>>>(flags_device, flags_device + 1);
            CHECK(cudaGetLastError());
            while (*arrived < sms) {
            }
          }
          us[column++] = median_us(variant, p, sms, work);
          if (with_hog) {
            reinterpret_cast<int volatile*>(flags)[1] = 1;
            CHECK(cudaStreamSynchronize(side));
          }
          std::vector<uint16_t> got(host.size());
          CHECK(cudaMemcpy(got.data(), p.out, got.size() * 2, cudaMemcpyDeviceToHost));
          for (int64_t row = 0; row < m; ++row) {
            for (int j = 0; j < k; ++j) {
              if (got[row * k + j] != host[row * k + perm[j]]) {
                std::fprintf(stderr, "%s wrong at M=%lld K=%d row %lld j %d\n", variant,
                             static_cast<long long>(m), k, static_cast<long long>(row), j);
                return 1;
              }
            }
          }
        }
      }
      std::printf("%6lld %6d  %12.2f %12.2f  %12.2f %12.2f%s\n", static_cast<long long>(m), k,
                  us[0], us[1], us[2], us[3], us[3] < 0 ? "  (-1: does not fit beside the hog)" : "");
      CHECK(cudaFree(p.a));
      CHECK(cudaFree(p.out));
      CHECK(cudaFree(p.perm));
    }
  }
  return 0;
}
