// Two MoE pass designs measured and not kept (session 53, benchmarks/RESULTS.md), timed by
// moe_passes.cu: (1) long rows (N/2 > 1536 values) streamed through a shared-memory ring of 8 KB
// chunks filled by 1-D bulk copies, a producer warp running into the next row while 8 consumer
// warps reduce and quantize this one (0.87-1.00x the library's pass with fp32 C at 512-2048 rows,
// 0.4-0.9x elsewhere); (2) the fused kernels' quantize pass over every vector of S at once (a 64-bit
// fast division finds a vector's row; 0.94-1.02x the library's time at 128 Mixtral rows and
// 1536-2048 short rows, 1.07-1.30x elsewhere). Same results as the library's kernels, bit for bit.
#pragma once
#include "gemmgen/moe/swiglu_quant.cuh"

namespace gemmgen::moe::candidate {

__device__ __forceinline__ void bulk_load(uint32_t dst, void const* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void mbarrier_init_count(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void consumers_sync() {  // the consumer warps only (named barrier 1)
  asm volatile("bar.sync 1, %0;" ::"n"(256) : "memory");
}

constexpr int kStreamConsumers = 256;
constexpr int kStreamThreads = kStreamConsumers + 32;
constexpr int kStreamChunkVectors = kStreamConsumers;  // a vector (4 values of S) a consumer

template <class ElementC>
constexpr int stream_chunk_bytes() {
  return kStreamChunkVectors * 8 * int(sizeof(ElementC));
}

__device__ __forceinline__ void lds_pairs(uint32_t addr, float const*, float act[4], float gate[4]) {
  uint4 const lo = smem::lds128(addr), hi = smem::lds128(addr + 16);
  act[0] = __uint_as_float(lo.x), gate[0] = __uint_as_float(lo.y);
  act[1] = __uint_as_float(lo.z), gate[1] = __uint_as_float(lo.w);
  act[2] = __uint_as_float(hi.x), gate[2] = __uint_as_float(hi.y);
  act[3] = __uint_as_float(hi.z), gate[3] = __uint_as_float(hi.w);
}
__device__ __forceinline__ void lds_pairs(uint32_t addr, cutlass::bfloat16_t const*, float act[4],
                                          float gate[4]) {
  uint4 const v = smem::lds128(addr);
  cutlass::bfloat16_t const* h = reinterpret_cast<cutlass::bfloat16_t const*>(&v);
  for (int i = 0; i < 4; ++i) {
    act[i] = static_cast<float>(h[2 * i]);
    gate[i] = static_cast<float>(h[2 * i + 1]);
  }
}

template <class ElementC, class ElementQ, int Kept, int Stages>
__global__ void __launch_bounds__(kStreamThreads)
swiglu_quant_stream_rows(ElementC const* c, ElementQ* q, float* q_scale, int64_t m, int64_t n_half,
                         int64_t const* rows_total) {
  constexpr int kChunkBytes = stream_chunk_bytes<ElementC>();
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[Stages], empty[Stages];
  __shared__ float warp_max[2][kStreamConsumers / 32];
  int const warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  uint32_t const ring_at = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  auto full_at = [&](int s) { return static_cast<uint32_t>(__cvta_generic_to_shared(&full[s])); };
  auto empty_at = [&](int s) { return static_cast<uint32_t>(__cvta_generic_to_shared(&empty[s])); };
  if (threadIdx.x == 0) {
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init_count(full_at(s), 1);
      mbarrier_init_count(empty_at(s), kStreamConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_wait();
  pdl_release();
  int64_t const total = *rows_total;
  int const vectors = static_cast<int>(n_half / 4);
  int const chunks = (vectors + kStreamChunkVectors - 1) / kStreamChunkVectors;  // <= Kept
  int64_t const row_bytes = int64_t(vectors) * 8 * int64_t(sizeof(ElementC));
  if (warp == kStreamConsumers / 32) {  // the producer warp: one lane queues every chunk
    if (lane == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t row = blockIdx.x; row < m && row < total; row += gridDim.x) {
        char const* src = reinterpret_cast<char const*>(c) + row * row_bytes;
        for (int j = 0; j < chunks; ++j) {
          smem::mbarrier_wait(empty_at(stage), phase ^ 1);
          int64_t const left = row_bytes - int64_t(j) * kChunkBytes;
          uint32_t const bytes = static_cast<uint32_t>(left < kChunkBytes ? left : kChunkBytes);
          smem::mbarrier_expect_tx(full_at(stage), bytes);
          bulk_load(ring_at + stage * kChunkBytes, src + int64_t(j) * kChunkBytes, bytes,
                    full_at(stage));
          if (++stage == Stages) {
            stage = 0, phase ^= 1;
          }
        }
      }
    }
    return;
  }
  int stage = 0, parity = 0;
  uint32_t phase = 0;
  int const tid = static_cast<int>(threadIdx.x);
  for (int64_t row = blockIdx.x; row < m; row += gridDim.x, parity ^= 1) {
    ElementQ* q_row = q + row * n_half;
    if (row >= total) {
      zero_vectors(q_row, tid, vectors, kStreamConsumers);
      if (tid == 0) {
        q_scale[row] = 0.0f;
      }
      continue;
    }
    float s[Kept][4];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < Kept; ++j) {
      if (j < chunks) {
        smem::mbarrier_wait(full_at(stage), phase);
        if (j * kStreamChunkVectors + tid < vectors) {
          float act[4];
          lds_pairs(ring_at + stage * kChunkBytes + tid * 8 * int(sizeof(ElementC)), c, act, s[j]);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            s[j][i] = swiglu(act[i], s[j][i]);
            amax = max_keep_nan(amax, fabsf(s[j][i]));
          }
        }
        __syncwarp();
        if (lane == 0) {
          mbarrier_arrive(empty_at(stage));
        }
        if (++stage == Stages) {
          stage = 0, phase ^= 1;
        }
      }
    }
    amax = warp_max_keep_nan(amax);
    if (lane == 0) {
      warp_max[parity][warp] = amax;
    }
    consumers_sync();  // warp_max[parity] is rewritten two rows later, after the next row's sync
    amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kStreamConsumers / 32; ++w) {
      amax = max_keep_nan(amax, warp_max[parity][w]);
    }
    float const scale = amax / Quantizer<ElementQ>::kMax;
#pragma unroll
    for (int j = 0; j < Kept; ++j) {
      if (j < chunks && j * kStreamChunkVectors + tid < vectors) {
        store4(q_row, j * kStreamChunkVectors + tid, s[j], scale);
      }
    }
    if (tid == 0) {
      q_scale[row] = scale;
    }
  }
}

template <class ElementC, class ElementQ, int Kept, int Stages>
cudaError_t launch_stream_rows_of(ElementC const* c, ElementQ* q, float* q_scale, int64_t m,
                                  int64_t n_half, int64_t const* rows_total, cudaStream_t stream,
                                  bool pdl, int sm_count, int per_sm) {
  auto kernel = swiglu_quant_stream_rows<ElementC, ElementQ, Kept, Stages>;
  int const smem = Stages * stream_chunk_bytes<ElementC>();
  static bool const configured =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess;
  (void)configured;
  int64_t const slots = int64_t(sm_count) * per_sm;
  unsigned const grid = static_cast<unsigned>(m < slots ? m : slots);
  return launch_maybe_pdl(kernel, dim3(grid), dim3(kStreamThreads), smem, stream, pdl, c, q,
                          q_scale, m, n_half, rows_total);
}

// ---- (2) the fused kernels' quantize pass, every vector of S at once
constexpr int kFlatThreads = 256;

template <class ElementQ, int Batch>
__global__ void __launch_bounds__(kFlatThreads)
quantize_flat(float const* s, uint32_t const* row_max_bits, ElementQ* q, float* q_scale, int64_t m,
              int64_t n_half, int64_t const* rows_total, cutlass::FastDivmodU64 by_vectors) {
  pdl_wait();
  pdl_release();
  int64_t const total = *rows_total;
  uint64_t const count = uint64_t(m) * uint64_t(n_half / 4);
  uint64_t const first = uint64_t(blockIdx.x) * (kFlatThreads * Batch) + threadIdx.x;
  uint64_t const policy = l2_policy_evict_first();  // as quantize_rows reads S
  float values[Batch][4];
  uint64_t rows[Batch], vecs[Batch];
#pragma unroll
  for (int u = 0; u < Batch; ++u) {
    uint64_t const g = first + uint64_t(u) * kFlatThreads;
    by_vectors(rows[u], vecs[u], g);
    if (g < count && int64_t(rows[u]) < total) {
      load4(s + rows[u] * uint64_t(n_half), int64_t(vecs[u]), values[u], policy);
    }
  }
#pragma unroll
  for (int u = 0; u < Batch; ++u) {
    uint64_t const g = first + uint64_t(u) * kFlatThreads;
    if (g >= count) {
      continue;
    }
    int64_t const row = int64_t(rows[u]);
    ElementQ* q_row = q + row * n_half;
    float const scale = row < total ? __uint_as_float(__ldg(row_max_bits + row)) / Quantizer<ElementQ>::kMax : 0.0f;
    if (row < total) {
      store4(q_row, int64_t(vecs[u]), values[u], scale);
    } else {
      reinterpret_cast<uint32_t*>(q_row)[vecs[u]] = 0u;
    }
    if (vecs[u] == 0) {
      q_scale[row] = scale;
    }
  }
}

template <class ElementQ, int Batch>
cudaError_t launch_quantize_flat(float const* s, uint32_t const* row_max_bits, ElementQ* q,
                                 float* q_scale, int64_t m, int64_t n_half,
                                 int64_t const* rows_total, cudaStream_t stream, bool pdl) {
  uint64_t const count = uint64_t(m) * uint64_t(n_half / 4);
  uint64_t const ctas = (count + kFlatThreads * Batch - 1) / (kFlatThreads * Batch);
  return launch_maybe_pdl(quantize_flat<ElementQ, Batch>, dim3(static_cast<unsigned>(ctas)),
                          dim3(kFlatThreads), 0, stream, pdl, s, row_max_bits, q, q_scale, m,
                          n_half, rows_total, cutlass::FastDivmodU64(uint64_t(n_half / 4)));
}

}  // namespace gemmgen::moe::candidate
