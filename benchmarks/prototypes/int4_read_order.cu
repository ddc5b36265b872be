// A measurement prototype, not a benchmark of record: how fast can the MoE family's int4 expert
// weights be streamed in the order its kernels read them? Session 35 (RESULTS.md, "session 35")
// asked whether the packed per-group layout (rows of K/2 bytes one after another, so a 64-feature
// tile reads 64 pieces of 64 bytes K/2 apart a chunk) costs bandwidth against one contiguous
// block a chunk. This program reads Mixtral-8x7B's w13 experts (8 x 28672 rows of 2048 bytes,
// int4 with K = 4096) with plain 16-byte loads, a CTA per RB rows walking the rows in chunks of
// SEG bytes, DEPTH chunks of loads in flight a thread, "strided" (the packed rows) or "blocked"
// ([rows / RB][chunks][RB][SEG]); best and mean of 20 launches after 3, CUDA events. Not built by
// gemmgen; on a Hopper machine:
//
//   nvcc -O3 -arch=sm_90a -o /tmp/int4_read_order benchmarks/prototypes/int4_read_order.cu
//   /tmp/int4_read_order
//
// Run in session 35 (H200): 64 rows x 64 B, depth 8: strided 4.04-4.08 TB/s, blocked 4.40-4.41;
// 32 rows x 128 B either way 4.42; 128 rows x 32 B strided 2.88, blocked 4.35-4.37; the two
// experts of one token (57344 rows) strided 3.62, blocked 4.00. The blocked layout, built into the
// kernels, then measured within +-2% of the packed one through the op (RESULTS.md) and was not
// kept.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
template <int RB, int SEG, bool BLOCKED, int DEPTH>
__global__ void __launch_bounds__(RB * SEG / 16) walk(const uint4* __restrict__ w, size_t rowbytes, uint32_t* out) {
  constexpr int TPR = SEG / 16;
  const int row = threadIdx.x / TPR, piece = threadIdx.x % TPR;
  const size_t chunks = rowbytes / SEG;
  const char* base = reinterpret_cast<const char*>(w) + size_t(blockIdx.x) * RB * rowbytes;
  uint32_t acc = 0;
  for (size_t c0 = 0; c0 < chunks; c0 += DEPTH) {
    uint4 v[DEPTH];
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) {
      size_t c = c0 + d;
      const char* p = BLOCKED ? base + c * (RB * SEG) + row * SEG + piece * 16
                              : base + size_t(row) * rowbytes + c * SEG + piece * 16;
      asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v[d].x), "=r"(v[d].y), "=r"(v[d].z), "=r"(v[d].w) : "l"(p));
    }
#pragma unroll
    for (int d = 0; d < DEPTH; ++d) acc ^= v[d].x ^ v[d].y ^ v[d].z ^ v[d].w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}
template <int RB, int SEG, bool BLOCKED, int DEPTH>
void run(const char* name, const uint4* w, size_t rows, size_t rowbytes, uint32_t* out) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  dim3 grid(rows / RB);
  for (int i = 0; i < 3; ++i) walk<RB, SEG, BLOCKED, DEPTH><<<grid, RB * SEG / 16>>>(w, rowbytes, out);
  float best = 1e9, sum = 0; const int reps = 20;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a); walk<RB, SEG, BLOCKED, DEPTH><<<grid, RB * SEG / 16>>>(w, rowbytes, out); cudaEventRecord(b);
    cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); best = ms < best ? ms : best; sum += ms;
  }
  double bytes = double(rows) * rowbytes;
  printf("%-34s rows %6zu rowbytes %5zu  best %8.1f us  %6.2f TB/s (mean %6.2f)\n", name, rows, rowbytes,
         best * 1e3, bytes / best / 1e9, bytes / (sum / reps) / 1e9);
}
int main() {
  size_t rows = 8 * 28672, rowbytes = 2048;  // Mixtral w13, int4, K = 4096
  uint4* w; uint32_t* out; cudaMalloc(&w, rows * rowbytes); cudaMalloc(&out, 4);
  cudaMemset(w, 0x5a, rows * rowbytes);
  for (int pass = 0; pass < 2; ++pass) {
    run<64, 64, false, 8>("strided 64 rows x 64B, depth 8", w, rows, rowbytes, out);
    run<64, 64, true, 8>("blocked 64 rows x 64B, depth 8", w, rows, rowbytes, out);
    run<64, 64, false, 2>("strided 64 rows x 64B, depth 2", w, rows, rowbytes, out);
    run<64, 64, true, 2>("blocked 64 rows x 64B, depth 2", w, rows, rowbytes, out);
    run<32, 128, false, 8>("strided 32 rows x 128B, depth 8", w, rows, rowbytes, out);
    run<32, 128, true, 8>("blocked 32 rows x 128B, depth 8", w, rows, rowbytes, out);
    run<16, 256, false, 4>("strided 16 rows x 256B, depth 4", w, rows, rowbytes, out);
    run<128, 32, false, 8>("strided 128 rows x 32B, depth 8", w, rows, rowbytes, out);
    run<128, 32, true, 8>("blocked 128 rows x 32B, depth 8", w, rows, rowbytes, out);
  }
  // 2 experts only (Mixtral at one token): 57344 rows
  run<64, 64, false, 8>("1tok strided 64x64B d8", w, 2 * 28672, rowbytes, out);
  run<64, 64, true, 8>("1tok blocked 64x64B d8", w, 2 * 28672, rowbytes, out);
  cudaError_t e = cudaDeviceSynchronize(); printf("%s\n", cudaGetErrorString(e));
}
