// A measurement prototype, not a benchmark of record: does the direct kernel (gemmgen/mixed/
// direct_mixed_mm.cuh) at decode lose time to how its CTAs land on the SMs? Session 25 (RESULTS.md,
// "session 25") timed a variant of the [32, 8] r32 K-split-8 kernel that used 95 registers
// instead of 80 (so two CTAs an SM fit, not three): 20-23% faster on N = 8192 at one token
// (8192 x 8192 12.5 against 15.6 µs, 8192 x 28672 38.1 against 49.7) and 7-17% slower on the
// other shapes. This program times the shipped kernel with its dynamic shared memory padded so
// that at most 3, 2 or 1 CTAs fit an SM (argument: KB a CTA asks for; 0 = its own): one token
// with the [32, 8] tile, K split 8 and K split 4 (the rules' choice at N 8192-10240), and 16
// tokens with [32, 16], K split 8; 32 features a warp, int4 group 128, bf16; back-to-back
// launches, weights rotated past L2, CUDA events, median of 9 batches of 40. Arguments: KB a CTA
// asks for, then `legacy` or `own` (the stream), 1 or 0 (PDL), and anything (the N = 8192 and
// 6144 shapes at one token only). Not built by gemmgen; on a Hopper machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Igemmgen/templates/include \
//        -Igemmgen/families/mixed/include \
//        -I"$(python -c 'from gemmgen.build import toolchain; print(toolchain.find_toolchain().cutlass_root)')/include" \
//        -o /tmp/direct_occupancy benchmarks/prototypes/direct_occupancy.cu
//   for kb in 0 80 120; do /tmp/direct_occupancy $kb; done   # 3, 2, 1 CTAs an SM at one token
//
// Run in session 26 (H200; RESULTS.md, "session 26"): launched from this loop as programmatic
// dependents, a grid of one to two CTAs an SM ran up to 1.4x slower with three CTAs an SM than
// capped at two (8192 x 28672: 49.7 against 35.3 µs), on either stream; without PDL both were
// level (37.4). Through gemmgen's own path (the Python op, eager back to back and in a CUDA
// graph, PDL on) the uncapped kernel already ran at the capped speed (35.9 eager, 36.6 in a
// graph), and a launcher that capped the residency measured level with it, so none ships: what
// this loop shows is a property of a bare C++ launch loop, not of the kernel's use.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gemmgen/mixed/direct_mixed_mm.cuh"

#include "cuda_check.h"  // CHECK

using gemmgen::mixed::direct::DirectConfig;
using gemmgen::mixed::direct::DirectMixedMm;
// the shipped decode configs: [32, 8] and [32, 16], 32 features a warp, K split 8, 4 stages
struct OneToken : DirectConfig<cutlass::bfloat16_t, cutlass::int4b_t, false, 1, 8, 8, 64, 4, 0, 2> {};
struct SixteenTokens : DirectConfig<cutlass::bfloat16_t, cutlass::int4b_t, false, 1, 8, 16, 64, 4, 0, 2> {};
// the rules' one-token choice for N 8192-10240 at K >= 8192: K split 4
struct OneTokenSplit4 : DirectConfig<cutlass::bfloat16_t, cutlass::int4b_t, false, 1, 4, 8, 64, 4, 0, 2> {};

static uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

// How the calls are launched (argv[2], argv[3]): on the legacy default stream or a stream of
// their own, as programmatic dependents (PDL, as gemmgen launches them) or not.
static cudaStream_t g_stream = nullptr;
static bool g_pdl = true;

template <class Config>
void time_shape(int m, int n, int k, int smem_request, char const* label) {
  using K = DirectMixedMm<Config>;
  int const group = 128;
  size_t const weight_bytes = size_t(n) * k / 2;
  int const pool = std::max<int>(2, static_cast<int>((150ull << 20) / weight_bytes) + 1);
  std::mt19937 rng(25);
  std::vector<uint16_t> a_host(size_t(m) * k), scale_host(size_t(k / group) * n);
  std::vector<uint8_t> w_host(weight_bytes);
  for (auto& v : a_host) v = bf16_bits((rng() % 2001) / 1000.0f - 1.0f);
  for (auto& v : scale_host) v = bf16_bits(0.002f + (rng() % 1000) / 100000.0f);
  for (auto& v : w_host) v = static_cast<uint8_t>(rng());  // any bytes are int4 values
  void *a, *scale, *d;
  std::vector<void*> w(pool);
  CHECK(cudaMalloc(&a, a_host.size() * 2));
  CHECK(cudaMalloc(&scale, scale_host.size() * 2));
  CHECK(cudaMalloc(&d, size_t(m) * n * 2));
  CHECK(cudaMemcpy(a, a_host.data(), a_host.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(scale, scale_host.data(), scale_host.size() * 2, cudaMemcpyHostToDevice));
  for (auto& p : w) {
    CHECK(cudaMalloc(&p, weight_bytes));
    CHECK(cudaMemcpy(p, w_host.data(), weight_bytes, cudaMemcpyHostToDevice));
  }
  gemmgen_mixed_mm_args args{};
  args.a = a;
  args.scale = scale;
  args.d = d;
  args.m = m;
  args.n = n;
  args.k = k;
  args.lda = k;
  args.ldd = n;
  args.group_size = group;
  int const smem = std::max<int>(K::kSmemBytes, smem_request);
  auto* kernel = gemmgen::mixed::direct::direct_mixed_mm_kernel<Config>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int resident = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, K::kThreads, smem));
  dim3 const grid((m + K::kTokens - 1) / K::kTokens, (n + K::kRows * K::kWarpsN - 1) / (K::kRows * K::kWarpsN));
  auto call = [&](int i) {
    args.w = w[i % pool];
    gemmgen::launch_maybe_pdl(kernel, grid, dim3(K::kThreads), smem, g_stream, g_pdl,
                              gemmgen::mixed::direct::make_params(args));
  };
  for (int i = 0; i < 20; ++i) call(i);
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> us;
  for (int r = 0; r < 9; ++r) {
    CHECK(cudaEventRecord(start, g_stream));
    for (int i = 0; i < 40; ++i) call(i);
    CHECK(cudaEventRecord(stop, g_stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1000.0f / 40);
  }
  std::sort(us.begin(), us.end());
  std::printf("%-7s smem %3d KB (%d CTAs an SM)  m=%3d  %6d x %6d  %5u CTAs  %8.2f us\n", label,
              smem >> 10, resident, m, n, k, grid.x * grid.y, us[us.size() / 2]);
  for (auto p : w) CHECK(cudaFree(p));
  CHECK(cudaFree(a));
  CHECK(cudaFree(scale));
  CHECK(cudaFree(d));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
}

int main(int argc, char** argv) {
  int const smem_request = argc > 1 ? std::atoi(argv[1]) * 1024 : 0;
  if (argc > 2 && std::strcmp(argv[2], "own") == 0) {
    CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  }
  g_pdl = argc > 3 ? std::atoi(argv[3]) != 0 : true;
  bool const quick = argc > 4;  // only the N = 8192 shapes at one token, K split 8
  std::printf("stream %s, PDL %s\n", g_stream ? "own" : "legacy default", g_pdl ? "on" : "off");
  if (quick) {
    time_shape<OneToken>(1, 8192, 8192, smem_request, "split8");
    time_shape<OneToken>(1, 8192, 28672, smem_request, "split8");
    time_shape<OneToken>(1, 6144, 4096, smem_request, "split8");
    return 0;
  }
  int const shapes[][2] = {{4096, 4096},  {6144, 4096},  {8192, 8192},   {10240, 8192},
                           {28672, 4096}, {4096, 14336}, {8192, 28672}, {57344, 8192}};
  for (auto const& s : shapes) time_shape<OneToken>(1, s[0], s[1], smem_request, "split8");
  for (auto const& s : shapes) time_shape<OneTokenSplit4>(1, s[0], s[1], smem_request, "split4");
  for (auto const& s : shapes) time_shape<SixteenTokens>(16, s[0], s[1], smem_request, "split8");
  return 0;
}
