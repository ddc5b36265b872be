// benchmarks/prototypes/a8w4_wgmma_proto.cu — a measurement prototype, not product code: the
// MoE A8W4 mode's GEMM core (issue 12) on sm90a register-sourced int8 wgmma, as one dense GEMM.
//   out[M, N] (fp32) = s_x[m] · s_w[n] · Σ_k x[m, k] · w[n, k]
// x int8 [M, K]; w int4 packed [N, K/2] (even k in the low nibble: the MoE packer's layout);
// per-channel scales. The design is the mixed family's wgmma kernel (wgmma_mixed_mm.cuh) with
// int8 tokens in 128-K chunks and the int4 → int8 conversion (two byte permutes, a shift and a
// mask for four values: the nibbles times 16, divided out in the epilogue) feeding
// `wgmma m64n64k32 s8`; a K split adds with float atomics (the product would use the cluster
// reduction). It checks itself against an integer reference kernel and times 60 calls with the
// weights rotated through a 200 MB pool. Results: benchmarks/RESULTS.md, session 12.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//        -I<nvidia-cutlass>/include -o a8w4_proto a8w4_wgmma_proto.cu
//   ./a8w4_proto N K M [splits]
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <utility>
#include <vector>
#include <cmath>
#include "cute/arch/copy_sm80.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/arch/mma_sm90_desc.hpp"

constexpr int kThreads = 256, kRows = 128, kTokens = 64, kStages = 4, kAhead = kStages - 2;
constexpr int kChunkK = 128, kWRow = kChunkK / 2, kWStage = kRows * kWRow, kARow = 128,
              kAStage = kTokens * kARow, kAccRegs = kTokens / 2;
constexpr int kSmem = kStages * (kWStage + kAStage) + 1024;
using Mma = cute::SM90::GMMA::MMA_64x64x32_S32S8S8_RS_TN;

__device__ void cp16(uint32_t dst, void const* src, uint32_t n) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ uint64_t bdesc(uint32_t addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = addr >> 4;
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = 64;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 1;
  return d.desc_;
}
template <size_t... I>
__device__ void mma(uint32_t const (&a)[4], uint64_t desc, uint32_t (&acc)[kAccRegs], std::index_sequence<I...>) {
  Mma::fma(a[0], a[1], a[2], a[3], desc, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
}
// halfword of the lane (bytes b, b+1 of the pair) -> 4 int8 = 16 * nibbles
__device__ uint32_t cvt(uint32_t w0, uint32_t w1, uint32_t gather) {
  uint32_t u = __byte_perm(w0, w1, gather);  // bytes 0,1 = B0, B1
  uint32_t v = u << 4;
  uint32_t r = __byte_perm(u, v, 0x1504);     // [v0, u0, v1, u1]
  return r & 0xF0F0F0F0u;
}

__global__ void __launch_bounds__(kThreads, 1) kern(int8_t const* x, uint8_t const* w, float const* sx,
                                                    float const* sw, float* out, int m, int n, int k) {
  extern __shared__ __align__(1024) char smem_raw[];
  int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, q = lane % 4;
  int t0 = blockIdx.x * kTokens, n0 = blockIdx.y * kRows;
  int chunks = k / kChunkK, splits = gridDim.z, rank = blockIdx.z;
  int cb = chunks * rank / splits, ce = chunks * (rank + 1) / splits, count = ce - cb;
  uint32_t raw = cute::cast_smem_ptr_to_uint(smem_raw), smem = (raw + 1023) & ~1023u;
  uint32_t aring = smem, wring = smem + kStages * kAStage;
  // copies: weights 2 a thread (row tid/2? 128 rows x 4 segs = 512), tokens 2 a thread (64 x 8)
  uint8_t const* wsrc[2]; uint32_t wdst[2], wbytes[2];
  int8_t const* asrc[2]; uint32_t adst[2], abytes[2];
  for (int j = 0; j < 2; ++j) {
    int i = tid + 256 * j, row = i / 4, seg = i % 4;
    bool ok = n0 + row < n;
    wsrc[j] = w + int64_t(ok ? n0 + row : 0) * (k / 2) + int64_t(cb) * kWRow + seg * 16;
    wdst[j] = row * kWRow + seg * 16; wbytes[j] = ok ? 16 : 0;
    int arow = i / 8, aseg = i % 8;
    bool aok = t0 + arow < m;
    asrc[j] = x + int64_t(aok ? t0 + arow : 0) * k + int64_t(cb) * kChunkK + aseg * 16;
    adst[j] = arow * kARow + ((aseg ^ (arow & 7)) * 16); abytes[j] = aok ? 16 : 0;
  }
  auto issue = [&](int slot) {
    for (int j = 0; j < 2; ++j) {
      cp16(wring + slot * kWStage + wdst[j], wsrc[j], wbytes[j]); wsrc[j] += kWRow;
      cp16(aring + slot * kAStage + adst[j], asrc[j], abytes[j]); asrc[j] += kChunkK;
    }
  };
  for (int s = 0; s < kAhead; ++s) { if (s < count) issue(s); cute::cp_async_fence(); }
  int row_lo = 16 * warp + g;
  uint32_t gather = (2 * (q % 2) + 4 * (q / 2)) | ((2 * (q % 2) + 4 * (q / 2) + 1) << 4);
  uint32_t acc[kAccRegs];
  for (int r = 0; r < kAccRegs; ++r) { acc[r] = 0; cute::warpgroup_fence_operand(acc[r]); }
  uint32_t wlane = wring + row_lo * kWRow;
  int rs = 0, ws = kAhead;
  auto load = [&](int i, uint32_t (&a)[4][4]) {
    cute::cp_async_wait<kAhead - 1>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (i + kAhead < count) issue(ws);
    cute::cp_async_fence();
    ws = ws + 1 == kStages ? 0 : ws + 1;
    uint32_t base = wlane + rs * kWStage;
    uint32_t lo[16], hi[16];
    for (int h = 0; h < 4; ++h) {
      uint4 l = lds128(base + 16 * h), u = lds128(base + 8 * kWRow + 16 * h);
      lo[4 * h] = l.x; lo[4 * h + 1] = l.y; lo[4 * h + 2] = l.z; lo[4 * h + 3] = l.w;
      hi[4 * h] = u.x; hi[4 * h + 1] = u.y; hi[4 * h + 2] = u.z; hi[4 * h + 3] = u.w;
    }
    rs = rs + 1 == kStages ? 0 : rs + 1;
    // step j: k = 32j + 4q.. (bytes 16j + 2q: words 4j, 4j+1) and k + 16 (words 4j+2, 4j+3)
    for (int j = 0; j < 4; ++j) {
      a[j][0] = cvt(lo[4 * j], lo[4 * j + 1], gather);
      a[j][1] = cvt(hi[4 * j], hi[4 * j + 1], gather);
      a[j][2] = cvt(lo[4 * j + 2], lo[4 * j + 3], gather);
      a[j][3] = cvt(hi[4 * j + 2], hi[4 * j + 3], gather);
    }
  };
  auto run = [&](uint32_t (&a)[4][4]) {
    int slot = rs == 0 ? kStages - 1 : rs - 1;
    uint64_t desc = bdesc(aring + slot * kAStage);
    cute::warpgroup_arrive();
    for (int j = 0; j < 4; ++j) mma(a[j], desc + 2 * j, acc, std::make_index_sequence<kAccRegs>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();
  };
  uint32_t ae[4][4], ao[4][4];
  if (count > 0) load(0, ae);
  for (int i = 0; i < count; i += 2) {
    run(ae);
    if (i + 1 < count) { load(i + 1, ao); run(ao); if (i + 2 < count) load(i + 2, ae); }
  }
  cute::warpgroup_wait<0>();
  for (int r = 0; r < kAccRegs; ++r) cute::warpgroup_fence_operand(acc[r]);
  for (int r = 0; r < kAccRegs; ++r) {
    int nn = n0 + row_lo + ((r % 4) < 2 ? 0 : 8), tok = t0 + 8 * (r / 4) + 2 * q + (r % 2);
    if (nn < n && tok < m) {
      float v = float(int(acc[r])) * (1.f / 16.f) * sw[nn] * sx[tok];
      if (splits == 1) out[int64_t(tok) * n + nn] = v; else atomicAdd(out + int64_t(tok) * n + nn, v);
    }
  }
}

__global__ void ref(int8_t const* x, uint8_t const* w, float const* sx, float const* sw, float* out, int m, int n, int k) {
  int nn = blockIdx.x * blockDim.x + threadIdx.x, tok = blockIdx.y;
  if (nn >= n) return;
  long long s = 0;
  for (int kk = 0; kk < k; ++kk) {
    uint8_t b = w[int64_t(nn) * (k / 2) + kk / 2];
    int v = (kk % 2 == 0) ? (b & 0xF) : (b >> 4);
    v = v >= 8 ? v - 16 : v;
    s += int(x[int64_t(tok) * k + kk]) * v;
  }
  out[int64_t(tok) * n + nn] = float(s) * sw[nn] * sx[tok];
}

int main(int argc, char** argv) {
  int n = atoi(argv[1]), k = atoi(argv[2]), m = atoi(argv[3]);
  int sms = 132;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  size_t wbytes = size_t(n) * k / 2;
  int pool = int(std::max<size_t>(2, 200000000 / wbytes + 1));
  std::vector<uint8_t> hw(wbytes); std::vector<int8_t> hx(size_t(m) * k);
  std::vector<float> hsx(m), hsw(n);
  srand(1);
  for (auto& v : hw) v = rand() & 0xFF;
  for (auto& v : hx) v = int8_t((rand() % 255) - 127);
  for (auto& v : hsx) v = 0.01f + (rand() % 100) * 1e-4f;
  for (auto& v : hsw) v = 0.001f + (rand() % 100) * 1e-5f;
  uint8_t* dw; int8_t* dx; float *dsx, *dsw, *dout, *dref;
  cudaMalloc(&dw, wbytes * pool); cudaMalloc(&dx, hx.size()); cudaMalloc(&dsx, m * 4); cudaMalloc(&dsw, n * 4);
  cudaMalloc(&dout, size_t(m) * n * 4); cudaMalloc(&dref, size_t(m) * n * 4);
  for (int p = 0; p < pool; ++p) cudaMemcpy(dw + p * wbytes, hw.data(), wbytes, cudaMemcpyHostToDevice);
  cudaMemcpy(dx, hx.data(), hx.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dsx, hsx.data(), m * 4, cudaMemcpyHostToDevice); cudaMemcpy(dsw, hsw.data(), n * 4, cudaMemcpyHostToDevice);
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  int tiles = ((n + kRows - 1) / kRows) * ((m + kTokens - 1) / kTokens);
  int chunks = k / kChunkK;
  int splits = 1; double best = 1e30;
  for (int s = 1; s <= 8 && s <= std::max(1, chunks / 4); ++s) { double l = double((tiles * s + sms - 1) / sms) / s; if (l < best - 1e-9) { best = l; splits = s; } }
  if (argc > 4) splits = atoi(argv[4]);
  dim3 grid((m + kTokens - 1) / kTokens, (n + kRows - 1) / kRows, splits);
  cudaMemset(dout, 0, size_t(m) * n * 4);
  kern<<<grid, kThreads, kSmem>>>(dx, dw, dsx, dsw, dout, m, n, k);
  ref<<<dim3((n + 127) / 128, m), 128>>>(dx, dw, dsx, dsw, dref, m, n, k);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("CUDA error %s\n", cudaGetErrorString(e)); return 1; }
  std::vector<float> o(size_t(m) * n), r(size_t(m) * n);
  cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost); cudaMemcpy(r.data(), dref, r.size() * 4, cudaMemcpyDeviceToHost);
  double num = 0, den = 0; for (size_t i = 0; i < o.size(); ++i) { num += (o[i] - r[i]) * (o[i] - r[i]); den += r[i] * r[i]; }
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  int iters = 60;
  for (int it = 0; it < 10; ++it) { if (splits > 1) cudaMemsetAsync(dout, 0, size_t(m) * n * 4); kern<<<grid, kThreads, kSmem>>>(dx, dw + (it % pool) * wbytes, dsx, dsw, dout, m, n, k); }
  cudaEventRecord(a);
  for (int it = 0; it < iters; ++it) { if (splits > 1) cudaMemsetAsync(dout, 0, size_t(m) * n * 4); kern<<<grid, kThreads, kSmem>>>(dx, dw + (it % pool) * wbytes, dsx, dsw, dout, m, n, k); }
  cudaEventRecord(b); cudaEventSynchronize(b);
  float ms; cudaEventElapsedTime(&ms, a, b);
  double us = ms * 1000 / iters;
  printf("n=%d k=%d m=%d splits=%d rel_err=%.2e  %.1f us  weights %.2f TB/s\n", n, k, m, splits, sqrt(num / den), us, wbytes / (us * 1e-6) / 1e12);
  return 0;
}
