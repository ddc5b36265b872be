// A measurement prototype, not a benchmark of record: the mixed-input wgmma kernel
// (gemmgen/mixed/wgmma_mixed_mm.cuh) rewritten with a producer warp: one extra warp queues every
// chunk with the Tensor Memory Accelerator (the tokens through a 2-D tensor map in 128-byte
// swizzle, the weights and the group's factors as 1-D bulk copies), and full / empty mbarriers a
// ring slot replace the cp.async waits, the proxy fence and the CTA barrier. The consumer
// warpgroups only wait for a slot, convert, run the wgmmas and release the slot: 118 instructions
// a warp and 64-K chunk instead of 142 ([128, 64], GPTQ, bf16; SASS), no CTA barrier in the loop,
// every ring slot in flight. The question: is the shipped kernel at 48-64 tokens bound by those
// instructions and that barrier (ncu, session 22: issue and latency bound, ~80 of 142
// instructions a chunk queue copies and wait)?
//
// Answer (session 27, H200, RESULTS.md): no. Bit-identical to the shipped kernel, but slower:
// best K split of each, geomean over the 8 Llama shapes, shipped / this: 0.97 (5 stages) and 0.99
// (8 stages) at 48 tokens, 0.96 / 0.98 at 64, 0.88 for the one-warpgroup [64, 32] tile at 24-32
// tokens.
//
// The second kernel here (namespace wgmma_cs) turns the problem round: the tokens are wgmma's M,
// the weights its N, both read from shared memory, and converter warps dequantize each chunk into
// a ring of bf16 tiles (stmatrix, swizzled) ahead of the MMA warpgroup. 0.73-0.85x the shipped
// kernel at 48-64 tokens (outputs within 1% of it: the sums' order differs). Neither is in the
// library.
//
// The program times each against the shipped kernel (int4 GPTQ scales group 128, bf16): for
// each of the 8 Llama shapes and token count, every K split (1, 2, 3, 4, 6, 8: what the tuner's
// split knob times), the best of each kernel compared. Every call is checked against the shipped
// kernel's at the same split first, on outputs poisoned with NaN, so an element a kernel leaves
// unwritten shows: bit for bit for the producer-warp kernel (the same wgmmas in the same order),
// within 1% (plus 1% of the RMS) for the converter-warp kernels. Timing: 40 calls in a CUDA graph
// (PDL on, as gemmgen launches them), weights rotated through a pool past L2, median of 9
// replays after 3 warm-up replays.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -Igemmgen/templates/include \
//        -Igemmgen/families/mixed/include \
//        -I"$(python -c 'from gemmgen.build import toolchain; print(toolchain.find_toolchain().cutlass_root)')/include" \
//        -o /tmp/wgmma_ws_proto benchmarks/prototypes/wgmma_ws_proto.cu
//   /tmp/wgmma_ws_proto ws         # the producer-warp kernel at 24, 32, 48, 64 tokens
//   /tmp/wgmma_ws_proto cs         # the converter-warp kernel at 48 and 64 tokens
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gemmgen/mixed/wgmma_mixed_mm.cuh"

#include "cuda_check.h"  // CHECK

// The kernel header calls the driver's cuTensorMapEncodeTiled, which the gemmgen library defines
// (library.cu.j2); this program resolves it the same way instead of linking libcuda.
extern "C" CUresult CUDAAPI cuTensorMapEncodeTiled(
    CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
    const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2_promotion, CUtensorMapFloatOOBfill oob_fill) {
  static auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                           &found));
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode(map, type, rank, address, dims, strides, box, element_strides, interleave,
                swizzle, l2_promotion, oob_fill);
}

// The kernel under test (not in the library: measured slower, RESULTS.md "session 27").
namespace gemmgen::mixed::wgmma_ws {

using direct::lds128;
using direct::Params;

namespace mbar {
__device__ __forceinline__ void init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n"
      "}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
}  // namespace mbar

// `bytes` (a multiple of 16) from global `src` to shared `dst`, counted on `bar`.
__device__ __forceinline__ void bulk_copy(uint32_t dst, void const* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// The box of `map` at (x, y) = (k, token) to shared `dst`, counted on `bar`.
__device__ __forceinline__ void tensor_copy_2d(uint32_t dst, CUtensorMap const* map, int x, int y,
                                               uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// The producer warp of both kernels here: lane 0 queues chunk i into ring slot i % Stages once
// the chunk Stages before it was released (`empty`), counted on `full`. The tile's weight rows
// are one contiguous run of row blocks a chunk (rows past N: fewer bytes, the slot's rest left as
// it is: it only reaches outputs past N, which are not stored), its factors one run of rows (N a
// multiple of 8). The packed weights are model constants: the first Stages chunks' are queued
// before the PDL wait, the tokens after it.
template <int Rows, int Stages, bool WithZero, int ActStageBytes, int WeightStageBytes,
          int FactorStageBytes>
__device__ void produce(Params const& p, CUtensorMap const* tokens_map, int lane, int n0, int t0,
                        int c_begin, int count, uint32_t act_ring, uint32_t weight_ring,
                        uint32_t factor_ring, uint32_t full, uint32_t empty) {
  constexpr int kStepK = 64, kBlockBytes = 512;
  int64_t const row_blocks = (p.n + 15) / 16;
  int const valid_rows = p.n - n0 < Rows ? p.n - n0 : Rows;
  uint32_t const weight_bytes = uint32_t((valid_rows + 15) / 16) * kBlockBytes;
  uint32_t const factor_bytes = uint32_t(valid_rows) * 2;
  uint32_t const chunk_bytes = ActStageBytes + weight_bytes + factor_bytes * (WithZero ? 2 : 1);
  int const chunks_per_group = p.group / kStepK;
  auto queue_weights = [&](int i) {
    int const s = i % Stages, c = c_begin + i;
    uint32_t const bar = full + 8 * s;
    mbar::arrive_expect_tx(bar, chunk_bytes);
    bulk_copy(weight_ring + s * WeightStageBytes,
              p.w + (int64_t(c) * row_blocks + n0 / 16) * kBlockBytes, weight_bytes, bar);
    int64_t const factors = int64_t(c / chunks_per_group) * p.n + n0;
    uint32_t const factor_slot = factor_ring + s * FactorStageBytes;
    bulk_copy(factor_slot, static_cast<uint16_t const*>(p.scale) + factors, factor_bytes, bar);
    if constexpr (WithZero) {
      bulk_copy(factor_slot + Rows * 2, static_cast<uint16_t const*>(p.zero) + factors,
                factor_bytes, bar);
    }
  };
  auto queue_tokens = [&](int i) {
    int const s = i % Stages;
    tensor_copy_2d(act_ring + s * ActStageBytes, tokens_map, (c_begin + i) * kStepK, t0,
                   full + 8 * s);
  };
  int const first = count < Stages ? count : Stages;
  if (lane == 0) {
    for (int i = 0; i < first; ++i) {
      queue_weights(i);
    }
  }
  pdl_wait();
  pdl_release();
  if (lane == 0) {
    for (int i = 0; i < first; ++i) {
      queue_tokens(i);
    }
    for (int i = Stages; i < count; ++i) {
      mbar::wait(empty + 8 * (i % Stages), ((i / Stages) + 1) & 1);
      queue_weights(i);
      queue_tokens(i);
    }
  }
  __syncwarp();
}

// The K split's sums of both kernels (as the shipped kernel adds them, wgmma::add_split_piece):
// the `Threads` threads that hold sums (`holds`) leave them in shared memory and add their CTA's
// pieces over the cluster; `store(j, sum)` writes piece j. Every thread of the CTA calls it.
template <int Pieces, int Threads, class Store>
__device__ void add_split_sums(uint32_t smem, int tid, bool holds, float const* acc, int rank,
                               int splits, Store&& store) {
  if (holds) {
    for (int j = 0; j < Pieces; ++j) {
      wgmma::store_shared4(smem + uint32_t(j * Threads + tid) * 16u, acc + 4 * j);
    }
  }
  wgmma::cluster_sync();
  if (holds) {
    int const j_begin = Pieces * rank / splits, j_end = Pieces * (rank + 1) / splits;
    for (int j = j_begin; j < j_end; ++j) {
      float sum[4];
      wgmma::add_split_piece(smem + uint32_t(j * Threads + tid) * 16u, splits, sum);
      store(j, sum);
    }
  }
  wgmma::cluster_sync_relaxed();
}

template <class Config>
struct WgmmaWsMixedMm {
  using Base = wgmma::WgmmaMixedMm<Config>;
  using ElementA = typename Base::ElementA;
  static constexpr bool kWithZero = Base::kWithZero;
  static constexpr int kWarpGroups = Base::kWarpGroups;
  static constexpr int kTokens = Base::kTokens;
  static constexpr int kStages = Base::kStages;
  static constexpr int kConsumers = Base::kThreads;  // the warpgroups' threads
  static constexpr int kThreads = kConsumers + 32;   // + the producer warp
  static constexpr int kMinBlocks = 1;
  static constexpr int kRows = Base::kRows;
  static constexpr int kStepK = Base::kStepK;
  static constexpr int kBlockBytes = Base::kBlockBytes;
  static constexpr int kWeightStageBytes = Base::kWeightStageBytes;
  static constexpr int kActRowBytes = Base::kActRowBytes;
  static constexpr int kActStageBytes = Base::kActStageBytes;
  static constexpr int kFactorStageBytes = Base::kFactorStageBytes;
  static constexpr int kAccRegs = Base::kAccRegs;
  static constexpr int kActRingBytes = kStages * kActStageBytes;
  static constexpr int kWeightRingBytes = kStages * kWeightStageBytes;
  static constexpr int kRingBytes = Base::kRingBytes;
  static constexpr int kPartialBytes = kAccRegs * kConsumers * 4;
  static constexpr int kDataBytes = kRingBytes > kPartialBytes ? kRingBytes : kPartialBytes;
  // the ring (or the K split's sums), then the full and empty barriers of each slot; + 1024: the
  // ring starts at the first 1024-byte boundary (the swizzle's period)
  static constexpr int kSmemBytes = kDataBytes + 2 * 8 * kStages + 1024;

  static __device__ void kernel_body(Params const& p, CUtensorMap const* tokens_map,
                                     char* smem_raw) {
    int const tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    int const g = lane / 4, q = lane % 4;
    int const t0 = blockIdx.x * kTokens, n0 = blockIdx.y * kRows;
    int const splits = gridDim.z, rank = blockIdx.z;  // clusters (1, 1, splits): rank = z
    bool const producer = warp == kConsumers / 32;
    uint32_t const raw = cute::cast_smem_ptr_to_uint(smem_raw);
    uint32_t const smem = (raw + 1023u) & ~1023u;
    uint32_t const act_ring = smem, weight_ring = smem + kActRingBytes;
    uint32_t const factor_ring = weight_ring + kWeightRingBytes;
    uint32_t const full_bars = smem + kDataBytes, empty_bars = full_bars + 8 * kStages;

    int const chunks = p.k / kStepK;
    int const c_begin = static_cast<int>(int64_t(chunks) * rank / splits);
    int const c_end = static_cast<int>(int64_t(chunks) * (rank + 1) / splits);
    int const count = c_end - c_begin;

    if (tid == 0) {
      for (int s = 0; s < kStages; ++s) {
        mbar::init(full_bars + 8 * s, 1);                      // the producer's expect_tx
        mbar::init(empty_bars + 8 * s, kConsumers / 32);       // a consumer warp each
      }
      mbar::fence_init();
    }
    __syncthreads();

    if (producer) {
      produce<kRows, kStages, kWithZero, kActStageBytes, kWeightStageBytes, kFactorStageBytes>(
          p, tokens_map, lane, n0, t0, c_begin, count, act_ring, weight_ring, factor_ring,
          full_bars, empty_bars);
    } else {
      pdl_wait();  // before the output is written
      pdl_release();
    }

    int const row_lo = 16 * warp + g;  // as in the cp.async kernel (warp < kConsumers / 32)
    int const n_lo = n0 + row_lo, n_hi = n_lo + 8;
    float acc[kAccRegs];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kAccRegs; ++r) {
      acc[r] = 0.f;
    }

    if (!producer) {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kAccRegs; ++r) {
        cute::warpgroup_fence_operand(acc[r]);
      }
      constexpr int kSteps = kStepK / 16;
      uint32_t const weight_lane = weight_ring + warp * kBlockBytes + lane * 16;
      uint64_t const desc_ring = smem::sw128_k_major_descriptor(act_ring);
      // The ring position of the next chunk to load (its slot and the parity of the slot's
      // phase) and of the last one issued (whose slot a retired chunk releases): counted, not
      // divided, since the loop is short.
      int load_slot = 0, run_slot = 0;
      uint32_t load_phase = 0;
      // Wait for the next chunk's slot and convert its fragments into `a`.
      auto load_chunk = [&](uint32_t (&a)[kSteps][4]) {
        mbar::wait(full_bars + 8 * load_slot, load_phase);
        uint4 const packed = lds128(weight_lane + load_slot * kWeightStageBytes);
        uint32_t const words[kSteps] = {packed.x, packed.y, packed.z, packed.w};
        uint32_t const factor_slot = factor_ring + load_slot * kFactorStageBytes + row_lo * 2;
        uint32_t const scale_lo = Base::lds16(factor_slot) * 0x10001u;
        uint32_t const scale_hi = Base::lds16(factor_slot + 16) * 0x10001u;
        uint32_t zero_lo = 0u, zero_hi = 0u;
        if constexpr (kWithZero) {
          zero_lo = Base::lds16(factor_slot + kRows * 2) * 0x10001u;
          zero_hi = Base::lds16(factor_slot + kRows * 2 + 16) * 0x10001u;
        }
        if (++load_slot == kStages) {
          load_slot = 0;
          load_phase ^= 1u;
        }
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kSteps; ++j) {  // registers 0, 2: row g; 1, 3: row g + 8
          a[j][0] = Base::dequant(words[j], scale_lo, zero_lo);
          a[j][1] = Base::dequant(words[j] >> 4, scale_hi, zero_hi);
          a[j][2] = Base::dequant(words[j] >> 8, scale_lo, zero_lo);
          a[j][3] = Base::dequant(words[j] >> 12, scale_hi, zero_hi);
        }
      };
      // Issue the next chunk's wgmmas, retire the one before and release its slot (a warp at a
      // time: its wgmmas have read the slot's tokens, its lanes the weights and factors long
      // before). `first`: no chunk before.
      auto run_chunk = [&](bool first, uint32_t (&a)[kSteps][4]) {
        uint64_t const desc = desc_ring + uint64_t(run_slot * (kActStageBytes / 16));
        cute::warpgroup_arrive();
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kSteps; ++j) {
          Base::mma(a[j], desc + 2 * j, acc, std::make_index_sequence<kAccRegs>{});
        }
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<1>();
        int const retired = run_slot == 0 ? kStages - 1 : run_slot - 1;
        if (!first && lane == 0) {
          mbar::arrive(empty_bars + 8 * retired);
        }
        run_slot = run_slot + 1 == kStages ? 0 : run_slot + 1;
      };
      uint32_t a_even[kSteps][4], a_odd[kSteps][4];
      if (count > 0) {
        load_chunk(a_even);
      }
      for (int i = 0; i < count; i += 2) {
        run_chunk(i == 0, a_even);
        if (i + 1 < count) {
          load_chunk(a_odd);
          run_chunk(false, a_odd);
          if (i + 2 < count) {
            load_chunk(a_even);
          }
        }
      }
      cute::warpgroup_wait<0>();
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kAccRegs; ++r) {
        cute::warpgroup_fence_operand(acc[r]);
      }
    }

    ElementA const* bias = static_cast<ElementA const*>(p.bias);
    ElementA* d = static_cast<ElementA*>(p.d);
    float bias_lo = 0.f, bias_hi = 0.f;
    if (bias != nullptr && !producer) {
      bias_lo = n_lo < p.n ? static_cast<float>(bias[n_lo]) : 0.f;
      bias_hi = n_hi < p.n ? static_cast<float>(bias[n_hi]) : 0.f;
    }
    auto store = [&](int r, float v) {
      int const n = (r % 4 < 2) ? n_lo : n_hi;
      int const token = t0 + 8 * (r / 4) + 2 * q + (r % 2);
      if (n < p.n && token < p.m) {
        d[int64_t(token) * p.ldd + n] = ElementA(v + ((r % 4 < 2) ? bias_lo : bias_hi));
      }
    };
    if (splits == 1) {
      if (!producer) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kAccRegs; ++r) {
          store(r, acc[r]);
        }
      }
      return;
    }
    // The K split's sums, as in the cp.async kernel: every copy has landed (each slot's full
    // barrier was waited for), so after this barrier the ring holds the partial sums.
    __syncthreads();
    add_split_sums<kAccRegs / 4, kConsumers>(smem, tid, !producer, acc, rank, splits,
                                             [&](int j, float const (&sum)[4]) {
                                               for (int i = 0; i < 4; ++i) {
                                                 store(4 * j + i, sum[i]);
                                               }
                                             });
  }
};

// Both kernels here: a body K (kernel_body, kThreads, kMinBlocks) with the tokens' tensor map.
template <class K>
__global__ void __launch_bounds__(K::kThreads, K::kMinBlocks)
    kernel_with_map(Params const params, __grid_constant__ CUtensorMap const tokens_map) {
  extern __shared__ __align__(1024) char smem[];
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  K::kernel_body(params, &tokens_map, smem);
#endif
}

// The tokens' tensor map: [M, K] (K innermost, row stride lda), a box of 64 K x Tokens rows in
// 128-byte swizzle, rows past M and K read as zeros.
template <class Config>
CUresult encode_tokens_map(CUtensorMap* map, gemmgen_mixed_mm_args const& a) {
  using K = WgmmaWsMixedMm<Config>;
  constexpr bool kBf16 = cute::is_same_v<typename K::ElementA, cutlass::bfloat16_t>;
  cuuint64_t const dims[2] = {cuuint64_t(a.k), cuuint64_t(a.m)};
  cuuint64_t const strides[1] = {cuuint64_t(a.lda) * 2};
  cuuint32_t const box[2] = {cuuint32_t(K::kStepK), cuuint32_t(K::kTokens)};
  cuuint32_t const element_strides[2] = {1, 1};
  return cuTensorMapEncodeTiled(
      map, kBf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
      const_cast<void*>(a.a), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The launch of both kernels here: the tokens' tensor map, the K split chosen as the shipped
// kernel chooses it, clusters (1, 1, S), PDL as asked. GEMMGEN_OK or the failure recorded.
template <class Map, class... Params>
int launch_with_map(void (*kernel)(Params...), Map encode, int threads, int smem_bytes,
                    int64_t feature_tiles, int64_t token_tiles, gemmgen_mixed_mm_args const& a,
                    void* stream, char const* kernel_name) {
  CUtensorMap tokens_map;
  if (encode(&tokens_map) != CUDA_SUCCESS) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "cuTensorMapEncodeTiled refused the activations (pointer, sizes or row stride)");
  }
  int const sms = hardware_info().sm_count;
  int const splits = wgmma::choose_splits(feature_tiles * token_tiles, static_cast<int>(a.k / 64),
                                          sms, a.split_k_slices);
  dim3 const grid(static_cast<unsigned>(token_tiles), static_cast<unsigned>(feature_tiles),
                  static_cast<unsigned>(splits));
  bool const pdl = (a.launch_flags & GEMMGEN_LAUNCH_PDL) != 0;
  cudaError_t launched = launch_clustered_maybe_pdl(
      kernel, grid, dim3(threads), smem_bytes, static_cast<cudaStream_t>(stream), pdl,
      dim3(1, 1, splits), direct::make_params(a), tokens_map);
  cudaError_t const last = cudaGetLastError();
  launched = launched != cudaSuccess ? launched : last;
  if (launched != cudaSuccess) {
    return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
  }
  return GEMMGEN_OK;
}

template <class Config>
int run(gemmgen_mixed_mm_args const* args, void*, size_t, void* stream, char const* kernel_name) {
  using K = WgmmaWsMixedMm<Config>;
  auto const& a = *args;
  int const valid = direct::check_args(a, K::kWithZero, /*group_k=*/64, kernel_name);
  if (valid != GEMMGEN_OK) {
    return valid;
  }
  auto aligned = [](void const* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (a.n % 8 != 0 || !aligned(a.scale) || (K::kWithZero && !aligned(a.zero)) ||
      !aligned(a.w) || a.lda % 8 != 0) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs N a multiple of 8, 16-byte aligned weights, scales and zero terms, and "
                "the activations' row stride a multiple of 8 (bulk and tensor copies)");
  }
  int64_t const feature_tiles = (a.n + K::kRows - 1) / K::kRows;
  int64_t const token_tiles = (a.m + K::kTokens - 1) / K::kTokens;
  if (feature_tiles > 65535) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "N too large for the launch grid");
  }
  static std::atomic<bool> raised[detail::kMaxDevices] = {};
  int const allowed = allow_shared_memory_once(kernel_with_map<K>, K::kSmemBytes,
                                               raised, kernel_name);
  if (allowed != GEMMGEN_OK) {
    return allowed;
  }
  return launch_with_map(
      kernel_with_map<K>,
      [&](CUtensorMap* map) { return encode_tokens_map<Config>(map, a); }, K::kThreads,
      K::kSmemBytes, feature_tiles, token_tiles, a, stream, kernel_name);
}

}  // namespace gemmgen::mixed::wgmma_ws

// The second design under test: the weights dequantized into shared memory by converter warps,
// the tokens (wgmma's M = 64) and the bf16 weights (its N = Features) both read by wgmma from
// shared memory. The RS kernel above converts in the warps that issue the wgmmas, with two
// fragment sets: the tensor cores sit ~60% idle at 64 tokens (ncu, session 22) although neither
// issue nor memory is saturated. Here the conversion runs ahead in its own warps through a ring
// of converted tiles; the cost is shared-memory traffic (the converted tile written once and
// read by wgmma).
namespace gemmgen::mixed::wgmma_cs {

using direct::lds128;
using direct::Params;
using wgmma_ws::bulk_copy;
using wgmma_ws::tensor_copy_2d;
namespace mbar = wgmma_ws::mbar;

// Four 8 x 8 matrices of 16-bit values to shared memory (lane 8i + r gives matrix i's row r
// address): lane (g, q)'s register i holds matrix i's row g, columns 2q and 2q + 1.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

template <class ElementA_, bool WithZero_, int Features_, int ConvWarps_, int InStages_,
          int CvStages_, int MinBlocks_>
struct CsConfig {
  using ElementA = ElementA_;
  static constexpr bool WithZero = WithZero_;
  static constexpr int Features = Features_;    // wgmma's N: 64 to 256
  static constexpr int ConvWarps = ConvWarps_;  // converter warps
  static constexpr int InStages = InStages_;    // ring of tokens, int4 weights, factors
  static constexpr int CvStages = CvStages_;    // ring of converted bf16 weights
  static constexpr int MinBlocks = MinBlocks_;  // CTAs an SM the registers must allow
};

template <class Config>
struct WgmmaCsMixedMm {
  using ElementA = typename Config::ElementA;
  static constexpr bool kWithZero = Config::WithZero;
  // the RS kernel's conversion (a static of any of its configs with this element and scheme)
  using Rs = wgmma::WgmmaMixedMm<
      wgmma::WgmmaConfig<ElementA, cutlass::int4b_t, kWithZero, 1, 64, 3>>;
  static constexpr int kTokens = 64, kStepK = 64;
  static constexpr int kF = Config::Features;
  static constexpr int kConvWarps = Config::ConvWarps;
  static constexpr int kInStages = Config::InStages, kCvStages = Config::CvStages;
  static constexpr int kThreads = 128 + 32 * kConvWarps + 32;
  static constexpr int kMinBlocks = Config::MinBlocks;
  static constexpr int kProducerWarp = 4 + kConvWarps;
  static constexpr int kBlocks = kF / 16;  // row blocks of 16 features
  static_assert(kF % 16 == 0 && kBlocks % kConvWarps == 0, "whole row blocks a converter warp");
  static constexpr int kActStageBytes = kTokens * 128;
  static constexpr int kCvStageBytes = kF * 128;
  static constexpr int kWeightStageBytes = kF * 32;
  static constexpr int kFactorStageBytes = kF * 2 * (kWithZero ? 2 : 1);
  static constexpr int kActRing = 0;
  static constexpr int kCvRing = kActRing + kInStages * kActStageBytes;
  static constexpr int kWeightRing = kCvRing + kCvStages * kCvStageBytes;
  static constexpr int kFactorRing = kWeightRing + kInStages * kWeightStageBytes;
  static constexpr int kRingEnd = kFactorRing + kInStages * kFactorStageBytes;
  static constexpr int kAccRegs = kF / 2;  // 64 x F fp32 over 128 threads
  static constexpr int kPartialBytes = kAccRegs * 128 * 4;
  static constexpr int kDataBytes = kRingEnd > kPartialBytes ? kRingEnd : kPartialBytes;
  static constexpr int kBarBytes = 8 * (2 * kInStages + 2 * kCvStages);
  static constexpr int kSmemBytes = kDataBytes + kBarBytes + 1024;
  using Mma = decltype(cute::SM90::GMMA::ss_op_selector<
                       ElementA, ElementA, float, cute::Shape<cute::_64, cute::Int<kF>, cute::_16>,
                       cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>());
  static_assert(sizeof(typename Mma::CRegisters) == kAccRegs * sizeof(float));

  template <size_t... I>
  static __device__ void mma(uint64_t desc_a, uint64_t desc_b, float (&acc)[kAccRegs],
                             std::index_sequence<I...>) {
    Mma::fma(desc_a, desc_b, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
  }

  static __device__ void kernel_body(Params const& p, CUtensorMap const* tokens_map,
                                     char* smem_raw) {
    int const tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    int const g = lane / 4, q = lane % 4;
    int const t0 = blockIdx.x * kTokens, n0 = blockIdx.y * kF;
    int const splits = gridDim.z, rank = blockIdx.z;
    uint32_t const raw = cute::cast_smem_ptr_to_uint(smem_raw);
    uint32_t const smem = (raw + 1023u) & ~1023u;
    uint32_t const act_ring = smem + kActRing, cv_ring = smem + kCvRing;
    uint32_t const weight_ring = smem + kWeightRing, factor_ring = smem + kFactorRing;
    uint32_t const full_in = smem + kDataBytes, empty_in = full_in + 8 * kInStages;
    uint32_t const full_cv = empty_in + 8 * kInStages, empty_cv = full_cv + 8 * kCvStages;

    int const chunks = p.k / kStepK;
    int const c_begin = static_cast<int>(int64_t(chunks) * rank / splits);
    int const c_end = static_cast<int>(int64_t(chunks) * (rank + 1) / splits);
    int const count = c_end - c_begin;

    if (tid == 0) {
      for (int s = 0; s < kInStages; ++s) {
        mbar::init(full_in + 8 * s, 1);
        mbar::init(empty_in + 8 * s, kConvWarps + 4);  // converters read weights, MMA tokens
      }
      for (int s = 0; s < kCvStages; ++s) {
        mbar::init(full_cv + 8 * s, kConvWarps);
        mbar::init(empty_cv + 8 * s, 4);
      }
      mbar::fence_init();
    }
    __syncthreads();

    float acc[kAccRegs];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kAccRegs; ++r) {
      acc[r] = 0.f;
    }

    if (warp == kProducerWarp) {
      wgmma_ws::produce<kF, kInStages, kWithZero, kActStageBytes, kWeightStageBytes,
                        kFactorStageBytes>(p, tokens_map, lane, n0, t0, c_begin, count, act_ring,
                                           weight_ring, factor_ring, full_in, empty_in);
    } else if (warp >= 4) {
      pdl_wait();
      pdl_release();
      // Converter warp cw: row blocks cw, cw + kConvWarps, ... of every chunk, dequantized as the
      // RS kernel does and stored with stmatrix in the swizzled K-major layout wgmma reads
      // (feature f's 64 K at f·128 bytes, 16-byte piece c at (c ^ f % 8)·16).
      int const cw = warp - 4;
      int const mat = lane / 8, mrow = lane % 8;  // stmatrix: this lane's matrix row address
      uint32_t const lane_row = uint32_t(mrow + 8 * (mat & 1)) * 128;
      int const half = mat >> 1;
      int in_slot = 0, cv_slot = 0;
      uint32_t in_phase = 0, cv_phase = 0;
      for (int i = 0; i < count; ++i) {
        mbar::wait(full_in + 8 * in_slot, in_phase);
        if (i >= kCvStages) {
          mbar::wait(empty_cv + 8 * cv_slot, cv_phase ^ 1u);
        }
        uint32_t const cv_slot_base = cv_ring + cv_slot * kCvStageBytes;
        CUTLASS_PRAGMA_UNROLL
        for (int bb = 0; bb < kBlocks / kConvWarps; ++bb) {
          int const rb = cw + kConvWarps * bb;
          uint4 const packed = lds128(weight_ring + in_slot * kWeightStageBytes + rb * 512 + lane * 16);
          uint32_t const words[4] = {packed.x, packed.y, packed.z, packed.w};
          uint32_t const factor_slot = factor_ring + in_slot * kFactorStageBytes + (rb * 16 + g) * 2;
          uint32_t const scale_lo = Rs::lds16(factor_slot) * 0x10001u;
          uint32_t const scale_hi = Rs::lds16(factor_slot + 16) * 0x10001u;
          uint32_t zero_lo = 0u, zero_hi = 0u;
          if constexpr (kWithZero) {
            zero_lo = Rs::lds16(factor_slot + kF * 2) * 0x10001u;
            zero_hi = Rs::lds16(factor_slot + kF * 2 + 16) * 0x10001u;
          }
          uint32_t const block_base = cv_slot_base + rb * 16 * 128 + lane_row;
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) {
            uint32_t const a0 = Rs::dequant(words[j], scale_lo, zero_lo);
            uint32_t const a1 = Rs::dequant(words[j] >> 4, scale_hi, zero_hi);
            uint32_t const a2 = Rs::dequant(words[j] >> 8, scale_lo, zero_lo);
            uint32_t const a3 = Rs::dequant(words[j] >> 12, scale_hi, zero_hi);
            stmatrix_x4(block_base + uint32_t(((2 * j + half) ^ mrow) * 16), a0, a1, a2, a3);
          }
        }
        fence_proxy_async();  // this thread's stores, visible to wgmma (the async proxy)
        __syncwarp();
        if (lane == 0) {
          mbar::arrive(empty_in + 8 * in_slot);
          mbar::arrive(full_cv + 8 * cv_slot);
        }
        if (++in_slot == kInStages) {
          in_slot = 0;
          in_phase ^= 1u;
        }
        if (++cv_slot == kCvStages) {
          cv_slot = 0;
          cv_phase ^= 1u;
        }
      }
    } else {
      pdl_wait();
      pdl_release();
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kAccRegs; ++r) {
        cute::warpgroup_fence_operand(acc[r]);
      }
      uint64_t const desc_act = smem::sw128_k_major_descriptor(act_ring);
      uint64_t const desc_cv = smem::sw128_k_major_descriptor(cv_ring);
      int in_slot = 0, cv_slot = 0, prev_in = 0, prev_cv = 0;
      uint32_t in_phase = 0, cv_phase = 0;
      for (int i = 0; i < count; ++i) {
        mbar::wait(full_in + 8 * in_slot, in_phase);
        mbar::wait(full_cv + 8 * cv_slot, cv_phase);
        uint64_t const da = desc_act + uint64_t(in_slot * (kActStageBytes / 16));
        uint64_t const db = desc_cv + uint64_t(cv_slot * (kCvStageBytes / 16));
        cute::warpgroup_arrive();
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) {
          mma(da + 2 * j, db + 2 * j, acc, std::make_index_sequence<kAccRegs>{});
        }
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<1>();
        if (i > 0 && lane == 0) {
          mbar::arrive(empty_in + 8 * prev_in);
          mbar::arrive(empty_cv + 8 * prev_cv);
        }
        prev_in = in_slot;
        prev_cv = cv_slot;
        if (++in_slot == kInStages) {
          in_slot = 0;
          in_phase ^= 1u;
        }
        if (++cv_slot == kCvStages) {
          cv_slot = 0;
          cv_phase ^= 1u;
        }
      }
      cute::warpgroup_wait<0>();
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kAccRegs; ++r) {
        cute::warpgroup_fence_operand(acc[r]);
      }
    }

    // Register r: feature pair 8(r / 4) + 2q (+ 1), token 16·warp + g (+ 8 for r % 4 >= 2).
    bool const mma_warp = warp < 4;
    ElementA const* bias = static_cast<ElementA const*>(p.bias);
    ElementA* d = static_cast<ElementA*>(p.d);
    auto store_pair = [&](int t, bool hi, float v0, float v1) {
      int const n = n0 + 8 * t + 2 * q;
      int const token = t0 + 16 * warp + g + (hi ? 8 : 0);
      if (n < p.n && token < p.m) {  // N even: n + 1 < N too
        if (bias != nullptr) {
          v0 += static_cast<float>(bias[n]);
          v1 += static_cast<float>(bias[n + 1]);
        }
        ElementA out[2] = {ElementA(v0), ElementA(v1)};
        *reinterpret_cast<uint32_t*>(d + int64_t(token) * p.ldd + n) =
            *reinterpret_cast<uint32_t*>(out);
      }
    };
    if (splits == 1) {
      if (mma_warp) {
        CUTLASS_PRAGMA_UNROLL
        for (int t = 0; t < kAccRegs / 4; ++t) {
          store_pair(t, false, acc[4 * t], acc[4 * t + 1]);
          store_pair(t, true, acc[4 * t + 2], acc[4 * t + 3]);
        }
      }
      return;
    }
    __syncthreads();  // every copy landed and every wgmma retired: the ring holds the sums
    wgmma_ws::add_split_sums<kAccRegs / 4, 128>(smem, tid, mma_warp, acc, rank, splits,
                                                [&](int j, float const (&sum)[4]) {
                                                  store_pair(j, false, sum[0], sum[1]);
                                                  store_pair(j, true, sum[2], sum[3]);
                                                });
  }
};

template <class Config>
int run(gemmgen_mixed_mm_args const* args, void*, size_t, void* stream, char const* kernel_name) {
  using K = WgmmaCsMixedMm<Config>;
  auto const& a = *args;
  int const valid = direct::check_args(a, K::kWithZero, /*group_k=*/64, kernel_name);
  if (valid != GEMMGEN_OK) {
    return valid;
  }
  if (a.n % 8 != 0 || a.lda % 8 != 0 || a.ldd % 2 != 0) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "alignment");
  }
  int64_t const feature_tiles = (a.n + K::kF - 1) / K::kF;
  int64_t const token_tiles = (a.m + K::kTokens - 1) / K::kTokens;
  static std::atomic<bool> raised[detail::kMaxDevices] = {};
  int const allowed = allow_shared_memory_once(wgmma_ws::kernel_with_map<K>, K::kSmemBytes,
                                               raised, kernel_name);
  if (allowed != GEMMGEN_OK) {
    return allowed;
  }
  // the same box as the producer-warp kernel's: 64 K x 64 tokens, 128-byte swizzle
  using Ws = wgmma::WgmmaConfig<typename K::ElementA, cutlass::int4b_t, false, 1, 64, 3>;
  return wgmma_ws::launch_with_map(
      wgmma_ws::kernel_with_map<K>,
      [&](CUtensorMap* map) { return wgmma_ws::encode_tokens_map<Ws>(map, a); }, K::kThreads,
      K::kSmemBytes, feature_tiles, token_tiles, a, stream, kernel_name);
}

}  // namespace gemmgen::mixed::wgmma_cs


namespace mixed = gemmgen::mixed;
using Bf16 = cutlass::bfloat16_t;
using Int4 = cutlass::int4b_t;
struct Mid5 : mixed::wgmma::WgmmaConfig<Bf16, Int4, false, 2, 64, 5> {};  // shipped mid_wgmma
struct Mid8 : mixed::wgmma::WgmmaConfig<Bf16, Int4, false, 2, 64, 8> {};
struct Small8 : mixed::wgmma::WgmmaConfig<Bf16, Int4, false, 1, 32, 8> {};  // small_wgmma
// converter-warp kernels: 128 features (2 CTAs an SM) and 256 (one), 4 converter warps each
struct Cs128 : mixed::wgmma_cs::CsConfig<Bf16, false, 128, 4, 4, 2, 2> {};
struct Cs256 : mixed::wgmma_cs::CsConfig<Bf16, false, 256, 4, 4, 3, 1> {};
// deeper rings: 128 features with 8 converter warps (one row block each a chunk), one CTA an SM;
// with 4 converter warps and 3 converted stages, two CTAs an SM
struct Cs128Deep : mixed::wgmma_cs::CsConfig<Bf16, false, 128, 8, 6, 4, 1> {};
struct Cs128Two : mixed::wgmma_cs::CsConfig<Bf16, false, 128, 4, 4, 3, 2> {};

using RunFn = int (*)(gemmgen_mixed_mm_args const*, void*, size_t, void*, char const*);
struct Candidate {
  char const* name;
  RunFn run;
  bool exact;  // bit-identical to the baseline (same wgmmas in the same order), else within 1%
};

static uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

struct Problem {
  int m, n, k, group = 128, pool;
  void *a, *scale, *d;
  std::vector<void*> w;
  Problem(int m_, int n_, int k_) : m(m_), n(n_), k(k_) {
    size_t const weight_bytes = size_t(n) * k / 2;
    pool = std::max<int>(2, static_cast<int>((150ull << 20) / weight_bytes) + 1);
    std::mt19937 rng(27 + n + k + m);
    std::vector<uint16_t> a_host(size_t(m) * k), scale_host(size_t(k / group) * n);
    std::vector<uint8_t> w_host(weight_bytes);
    for (auto& v : a_host) v = bf16_bits((rng() % 2001) / 1000.0f - 1.0f);
    for (auto& v : scale_host) v = bf16_bits(0.002f + (rng() % 1000) / 100000.0f);
    for (auto& v : w_host) v = static_cast<uint8_t>(rng());  // any byte is two int4 values
    CHECK(cudaMalloc(&a, a_host.size() * 2));
    CHECK(cudaMalloc(&scale, scale_host.size() * 2));
    CHECK(cudaMalloc(&d, size_t(m) * n * 2));
    CHECK(cudaMemcpy(a, a_host.data(), a_host.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(scale, scale_host.data(), scale_host.size() * 2, cudaMemcpyHostToDevice));
    w.resize(pool);
    for (auto& p : w) {
      CHECK(cudaMalloc(&p, weight_bytes));
      CHECK(cudaMemcpy(p, w_host.data(), weight_bytes, cudaMemcpyHostToDevice));
    }
  }
  ~Problem() {
    for (auto p : w) cudaFree(p);
    cudaFree(a);
    cudaFree(scale);
    cudaFree(d);
  }
  gemmgen_mixed_mm_args args(int i, int splits) const {
    gemmgen_mixed_mm_args x{};
    x.a = a;
    x.w = w[i % pool];
    x.scale = scale;
    x.d = d;
    x.m = m;
    x.n = n;
    x.k = k;
    x.lda = k;
    x.ldd = n;
    x.group_size = group;
    x.split_k_slices = splits;
    x.launch_flags = GEMMGEN_LAUNCH_PDL;
    x.layout_version = GEMMGEN_MIXED_LAYOUT_VERSION;
    return x;
  }
};

static void call(Candidate const& c, Problem const& p, int i, int splits, cudaStream_t stream) {
  gemmgen_mixed_mm_args const x = p.args(i, splits);
  if (c.run(&x, nullptr, 0, stream, c.name) != GEMMGEN_OK) {
    std::fprintf(stderr, "%s refused: %s\n", c.name, gemmgen::last_error_message().c_str());
    std::exit(1);
  }
}

static std::vector<uint16_t> output(Candidate const& c, Problem const& p, int splits,
                                    cudaStream_t stream) {
  CHECK(cudaMemsetAsync(p.d, 0xFF, size_t(p.m) * p.n * 2, stream));  // NaN
  call(c, p, 0, splits, stream);
  std::vector<uint16_t> out(size_t(p.m) * p.n);
  CHECK(cudaMemcpyAsync(out.data(), p.d, out.size() * 2, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  return out;
}

static float bf16_value(uint16_t bits) {
  uint32_t const u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Elements of `got` that differ from `want`: any bit (exact), or by more than 1% of the element
// plus 1% of the outputs' RMS (a NaN left by the poison always counts).
static size_t differing(std::vector<uint16_t> const& want, std::vector<uint16_t> const& got,
                        bool exact) {
  size_t bad = 0;
  if (exact) {
    for (size_t e = 0; e < want.size(); ++e) bad += want[e] != got[e];
    return bad;
  }
  double sq = 0;
  for (uint16_t w : want) sq += double(bf16_value(w)) * bf16_value(w);
  double const rms = std::sqrt(sq / want.size());
  for (size_t e = 0; e < want.size(); ++e) {
    double const w = bf16_value(want[e]), x = bf16_value(got[e]);
    bad += !(std::fabs(w - x) <= 0.01 * std::fabs(w) + 0.01 * rms);
  }
  return bad;
}

static double time_us(Candidate const& c, Problem const& p, int splits, cudaStream_t stream) {
  constexpr int kCalls = 40;
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) call(c, p, i, splits, stream);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  for (int r = 0; r < 3; ++r) CHECK(cudaGraphLaunch(exec, stream));
  std::vector<float> us;
  for (int r = 0; r < 9; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1000.0f / kCalls);
  }
  std::sort(us.begin(), us.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return us[us.size() / 2];
}

int main(int argc, char** argv) {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  Candidate const cp5{"cp.async [128,64] s5", &mixed::wgmma::run<Mid5>, true};
  Candidate const ws5{"tma+producer [128,64] s5", &mixed::wgmma_ws::run<Mid5>, true};
  Candidate const ws8{"tma+producer [128,64] s8", &mixed::wgmma_ws::run<Mid8>, true};
  Candidate const cp_small{"cp.async [64,32] s8", &mixed::wgmma::run<Small8>, true};
  Candidate const ws_small{"tma+producer [64,32] s8", &mixed::wgmma_ws::run<Small8>, true};
  Candidate const cs128{"converters [64 tok,128 f]", &mixed::wgmma_cs::run<Cs128>, false};
  Candidate const cs256{"converters [64 tok,256 f]", &mixed::wgmma_cs::run<Cs256>, false};
  Candidate const cs_deep{"converters 128 f, 8 warps, 6/4", &mixed::wgmma_cs::run<Cs128Deep>, false};
  Candidate const cs_two{"converters 128 f, 4 warps, 4/3", &mixed::wgmma_cs::run<Cs128Two>, false};
  struct Set {
    int m;
    std::vector<Candidate> kernels;  // the first is the baseline
  };
  // argv[1]: "ws" (the producer-warp kernel) or "cs" (the converter warps); then token counts
  bool const ws = argc > 1 && std::strcmp(argv[1], "ws") == 0;
  std::vector<Set> sets = ws ? std::vector<Set>{{24, {cp_small, ws_small}},
                                                {32, {cp_small, ws_small}},
                                                {48, {cp5, ws5, ws8}},
                                                {64, {cp5, ws5, ws8}}}
                             : std::vector<Set>{{48, {cp5, cs128, cs256, cs_deep, cs_two}},
                                                {64, {cp5, cs128, cs256, cs_deep, cs_two}}};
  if (argc > 2) {  // only the given token counts
    std::vector<Set> chosen;
    for (int i = 2; i < argc; ++i)
      for (auto const& s : sets)
        if (s.m == std::atoi(argv[i])) chosen.push_back(s);
    sets = chosen;
  }
  int const shapes[][2] = {{6144, 4096}, {4096, 4096},  {28672, 4096}, {4096, 14336},
                           {10240, 8192}, {8192, 8192}, {57344, 8192}, {8192, 28672}};
  int const split_choices[] = {1, 2, 3, 4, 6, 8};
  int mismatches = 0;
  for (auto const& set : sets) {
    std::vector<double> log_ratio(set.kernels.size(), 0.0);
    std::printf("\n%d tokens: best K split of each kernel (us), ratio = baseline / kernel\n", set.m);
    for (auto const& s : shapes) {
      Problem const p(set.m, s[0], s[1]);
      std::string line;
      double base_us = 0;
      for (size_t ki = 0; ki < set.kernels.size(); ++ki) {
        auto const& c = set.kernels[ki];
        double best = 1e30;
        int best_split = 0;
        for (int splits : split_choices) {
          if (splits > p.k / 64 / 4 && splits > 1) continue;  // at least 4 chunks a CTA
          if (ki > 0) {  // bit for bit against the baseline at the same split
            auto const want = output(set.kernels[0], p, splits, stream);
            auto const got = output(c, p, splits, stream);
            size_t const bad = differing(want, got, c.exact);
            if (bad != 0) {
              ++mismatches;
              std::printf("  MISMATCH %s %dx%d m=%d split %d: %zu of %zu elements differ\n",
                          c.name, p.n, p.k, p.m, splits, bad, want.size());
            }
          }
          double const us = time_us(c, p, splits, stream);
          if (us < best) best = us, best_split = splits;
        }
        if (ki == 0) base_us = best;
        log_ratio[ki] += std::log(base_us / best);
        char cell[128];
        std::snprintf(cell, sizeof cell, "  %s %7.2f (S=%d, %.3f)", c.name, best, best_split,
                      base_us / best);
        line += cell;
      }
      std::printf("%6d x %6d:%s\n", p.n, p.k, line.c_str());
    }
    std::printf("geomean ratio:");
    for (size_t ki = 0; ki < set.kernels.size(); ++ki)
      std::printf("  %s %.3f", set.kernels[ki].name, std::exp(log_ratio[ki] / 8));
    std::fflush(stdout);
    std::printf("\n");
  }
  std::printf("\n%d mismatching pairs\n", mismatches);
  return mismatches == 0 ? 0 : 1;
}
