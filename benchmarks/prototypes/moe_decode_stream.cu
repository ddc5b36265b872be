// A measurement prototype, not a benchmark of record: how fast can the MoE family's wgmma kernel
// stream an A8W4 layer at 16 rows an expert if it did nothing but stream? Session 51 asked why
// the per-channel `[64, 16]` tile reads Qwen3-30B-A3B's int4 experts at 256 tokens at 64% of the
// H200's DRAM bandwidth with its warps mostly waiting on their copies (ncu: long-scoreboard the
// largest stall), although its ring keeps ~30 KB in flight a CTA and four CTAs an SM.
//
// The kernel below keeps the wgmma kernel's copy pipeline and drops its math: a CTA of 128
// threads owns 64 features of one expert (the real grid's order: feature blocks fastest), streams
// K in chunks through a cp.async ring (weights [64 rows x chunk/2 bytes] of the packed
// [E, N, K/2], the expert's 16 token rows [16 x chunk bytes] of x, 128-byte swizzle), one commit
// group a chunk, `ahead` chunks queued before the one read, a wait and CTA barrier every `sync`
// chunks; "reading" a chunk is the lanes' 16-byte shared loads of their two rows (as the kernel's
// conversion reads them) and x, folded into a checksum. Variants: chunks of 128 or 256 K (64 or
// 128 bytes a weight row), the ring depth, chunks a barrier, and a persistent grid (4 CTAs an SM
// walking the tiles, the ring running on across tiles: no per-tile ramp or drain). Median of 20
// launches after 3, CUDA events.
//
// Run in session 51 (H200), weights' TB/s: 128-K chunks 3.3 (Qwen3-30B-A3B, DeepSeek-V2-Lite;
// the real [64, 16] kernel's GEMM ~3.0 in ncu) and 3.6-3.7 (Mixtral-8x7B) whatever the depth (4-7
// ahead), the chunks a barrier (1, 2; 4 is 5% slower) or persistence; 256-K chunks 3.5-3.7 and
// 4.0-4.1. The real kernel given the 256-K pattern (a chunk pair's weights queued together,
// 128 bytes a row) ran 4-5% slower, not faster (RESULTS.md, session 51): copies are not what
// holds it.
//
//   nvcc -O3 -arch=sm_90a -o /tmp/moe_decode_stream benchmarks/prototypes/moe_decode_stream.cu
//   /tmp/moe_decode_stream
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda_check.h"

struct Layer {
  int experts, n, k, rows_per_expert;
  const char* name;
};

__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}

// CHUNK: K a chunk; STAGES: ring slots; AHEAD: chunks queued ahead of the one read; SYNC: chunks
// made ready by one wait and CTA barrier (AHEAD + SYNC <= STAGES)
template <int CHUNK, int STAGES, int AHEAD, bool PERSISTENT, int SYNC = 1>
__global__ void __launch_bounds__(128) stream(const uint8_t* __restrict__ w, const int8_t* __restrict__ x,
                                             Layer L, uint32_t* out) {
  constexpr int kWRow = CHUNK / 2, kWBytes = 64 * kWRow, kXBytes = 16 * CHUNK;
  constexpr int kSlot = kWBytes + kXBytes;
  constexpr int kWCopies = kWBytes / 16 / 128, kXCopies = kXBytes / 16 / 128;
  extern __shared__ __align__(1024) uint8_t smem[];
  uint32_t const ring = (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + 1023u) & ~1023u;
  int const tid = threadIdx.x;
  int const chunks = L.k / CHUNK, fblocks = L.n / 64, tiles = fblocks * L.experts;
  int const first = blockIdx.x, step = PERSISTENT ? gridDim.x : tiles;
  int const my_tiles = first < tiles ? (tiles - first + step - 1) / step : 0;
  long const total = long(my_tiles) * chunks;  // this CTA's chunks, tile after tile
  auto issue = [&](long q) {
    if (q < total) {
      int const tile = first + int(q / chunks) * step, c = int(q % chunks);
      int const e = tile / fblocks, fb = tile % fblocks;
      uint32_t const slot = ring + uint32_t(q % STAGES) * kSlot;
      const uint8_t* wb = w + (long(e) * L.n + fb * 64) * (L.k / 2) + long(c) * kWRow;
#pragma unroll
      for (int j = 0; j < kWCopies; ++j) {
        int const i = tid + 128 * j, row = i / (kWRow / 16), piece = i % (kWRow / 16);
        cp16(slot + row * kWRow + piece * 16, wb + long(row) * (L.k / 2) + piece * 16);
      }
      const int8_t* xb = x + long(e) * L.rows_per_expert * L.k + long(c) * CHUNK;
#pragma unroll
      for (int j = 0; j < kXCopies; ++j) {
        int const i = tid + 128 * j, row = i / (CHUNK / 16), piece = i % (CHUNK / 16);
        cp16(slot + kWBytes + row * CHUNK + ((piece ^ (row & 7)) * 16), xb + long(row) * L.k + piece * 16);
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  for (int s = 0; s < AHEAD; ++s) issue(s);
  uint32_t acc = 0;
  int const warp = tid / 32, lane = tid % 32, g = lane / 4, q4 = lane % 4;
  static_assert(AHEAD + SYNC <= STAGES && AHEAD >= SYNC, "ring accounting");
  for (long q = 0; q < total; ++q) {
    if (q % SYNC == 0) {
      asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - SYNC));
      __syncthreads();  // chunks q .. q + SYNC - 1 landed; every thread is past chunk q - 1
#pragma unroll
      for (int c = 0; c < SYNC; ++c) issue(q + AHEAD + c);
    }
    uint32_t const slot = ring + uint32_t(q % STAGES) * kSlot;
#pragma unroll
    for (int h = 0; h < CHUNK / 128; ++h) {
      uint4 const lo = lds128(slot + (16 * warp + g) * kWRow + 64 * h + 16 * q4);
      uint4 const hi = lds128(slot + (16 * warp + g + 8) * kWRow + 64 * h + 16 * q4);
      acc ^= lo.x ^ lo.y ^ lo.z ^ lo.w ^ hi.x ^ hi.y ^ hi.z ^ hi.w;
    }
    uint4 const xv = lds128(slot + kWBytes + (tid % (kXBytes / 16)) * 16);
    acc += xv.x ^ xv.w;
    if (q % chunks == chunks - 1) {  // a tile ends: its "epilogue"
      if (acc == 0x9e3779b9u) out[0] = acc;
      acc = 0;
    }
  }
  asm volatile("cp.async.wait_group 0;");
}

template <int CHUNK, int STAGES, int AHEAD, bool PERSISTENT, int SYNC = 1>
void run(const char* label, const uint8_t* w, const int8_t* x, Layer L, uint32_t* out, int sms) {
  auto kern = stream<CHUNK, STAGES, AHEAD, PERSISTENT, SYNC>;
  int const slot = 64 * CHUNK / 2 + 16 * CHUNK;
  // four CTAs an SM, as the real [64, 16] kernel (its ring of 8 x 6 KB + scales)
  int const smem = std::max(STAGES * slot + 1024, 228 * 1024 / 5);
  CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int const tiles = L.n / 64 * L.experts;
  int const grid = PERSISTENT ? std::min(tiles, 4 * sms) : tiles;
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) kern<<<grid, 128, smem>>>(w, x, L, out);
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaEventRecord(a));
    kern<<<grid, 128, smem>>>(w, x, L, out);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  double const wbytes = double(L.experts) * L.n * L.k / 2;
  std::printf("%-18s %-40s %7.1f us  weights %5.2f TB/s  (best %7.1f)\n", L.name, label, t[10],
              wbytes / t[10] / 1e6, t[0]);
}

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Layer const layers[] = {{128, 1536, 2048, 16, "qwen3-30b-a3b"}, {64, 2816, 2048, 24, "deepseek-v2-lite"},
                          {8, 28672, 4096, 64, "mixtral-8x7b"}};
  for (Layer const& L : layers) {
    uint8_t* w;
    int8_t* x;
    uint32_t* out;
    CHECK(cudaMalloc(&w, size_t(L.experts) * L.n * L.k / 2));
    CHECK(cudaMalloc(&x, size_t(L.experts) * L.rows_per_expert * L.k));
    CHECK(cudaMalloc(&out, 4));
    CHECK(cudaMemset(w, 0x5a, size_t(L.experts) * L.n * L.k / 2));
    CHECK(cudaMemset(x, 0x33, size_t(L.experts) * L.rows_per_expert * L.k));
    for (int pass = 0; pass < 2; ++pass) {
      run<128, 8, 5, false>("tiles, 128-K chunks, 8 slots, 5 ahead", w, x, L, out, sms);
      run<128, 8, 7, false>("tiles, 128-K chunks, 8 slots, 7 ahead", w, x, L, out, sms);
      run<128, 8, 6, false, 2>("tiles, 128-K, 8 slots, 6 ahead, 2 a barrier", w, x, L, out, sms);
      run<128, 8, 4, false, 2>("tiles, 128-K, 8 slots, 4 ahead, 2 a barrier", w, x, L, out, sms);
      run<128, 8, 4, false, 4>("tiles, 128-K, 8 slots, 4 ahead, 4 a barrier", w, x, L, out, sms);
      run<128, 8, 5, true>("persistent, 128-K, 8 slots, 5 ahead", w, x, L, out, sms);
      run<256, 4, 2, false>("tiles, 256-K chunks, 4 slots, 2 ahead", w, x, L, out, sms);
      run<256, 4, 3, false>("tiles, 256-K chunks, 4 slots, 3 ahead", w, x, L, out, sms);
      run<256, 4, 2, false, 2>("tiles, 256-K, 4 slots, 2 ahead, 2 a barrier", w, x, L, out, sms);
    }
    CHECK(cudaFree(w));
    CHECK(cudaFree(x));
    CHECK(cudaFree(out));
  }
  return 0;
}
