/*
 * gemmgen/mixed/direct_mixed_mm.cuh — the mixed-input family's "direct" kernel: a weight-streaming
 * GEMM on mma.sync (sm80 and later, so also sm90a) for few tokens, where the weight read is the
 * whole cost. It reads the same packed weight as the CUTLASS 3.x kernels (layout version 1:
 * [N, K] K-major, int4 two per byte or int8).
 *
 * Work split. A warp owns 16 output features (the MMA's M) and one contiguous range of K; a CTA
 * has WarpsN × WarpsK warps (WarpsN feature blocks, each K split WarpsK ways) and 8·TokenTiles
 * tokens (the MMA's N, 8 per tile). The WarpsN warps that share a K range (a "K group") stream it
 * in chunks of 64 K through cp.async rings of Stages chunks: each warp its own 16 weight rows, the
 * K group one shared ring of the tokens' activations (read from L2 once per CTA, not once per
 * warp), with one barrier of the K group's warps a chunk (a named barrier). Each warp
 * converts its weights in registers (exact: every stored value is a small integer; int8 with
 * CUTLASS's converter) and feeds mma.sync m16n8k16 with fp32 accumulation. The CTA's WarpsK partial sums are added in a fixed
 * order through shared memory: results are bit-identical run to run.
 *
 * K order inside a chunk. The MMA sums over its 16 k slots, so any bijection between slots and
 * the chunk's 64 k values gives the same sum if both operands use it. This kernel maps, for the
 * lane with q = lane % 4, MMA j ∈ 0..3 and fragment slots {2q, 2q+1, 2q+8, 2q+9} to
 * k = 16q + 4j + {0, 1, 2, 3}: each lane's 16 k values of a weight row, and of a token, are
 * contiguous (one 8- or 16-byte shared-memory load each). No offline reordering is needed.
 *
 * int4 conversion. One byte permute and one LOP3 put a nibble pair under the exponent of the
 * 16-bit float B = 128 (bf16) or 1024 (fp16), whose spacing there is 1, XOR-ing each nibble with
 * 8 (int4 → unsigned): B + 8 + stored, exact. With scales alone one packed FMA then subtracts
 * B + 8. With zero points the MMA takes B + 8 + stored as it is: the kernel already sums x per
 * token for the zero point (one more MMA a k16 step, against a ones fragment), so (B + 8)·Σx
 * joins the zero point's term and the subtraction goes (with scales alone, computing Σx for it
 * cost more than the subtraction saves: 2-5% slower on the H100).
 *
 * Scales. Every (64-K chunk) MMA result is accumulated per segment in fp32 and scaled in fp32
 * when the segment ends: out = Σ_seg scale[g] · Σ_{k∈seg} x·w' + (zp[g] − bias·scale[g]) ·
 * Σ_{k∈seg} x, where w' is what the MMA saw (stored, or bias + stored) and the second term exists
 * with zero points. A segment is the group, or with the bias and groups longer than 512 (per-
 * channel is one group) the group's largest divisor up to 512: the biased sum grows with it, and 512
 * keeps its cancellation near 2^-16 relative at fp16's bias. This is more exact than rounding
 * scale·stored to 16 bits before the MMA.
 *
 * Tried and dropped (H100, A/B in one run): a loop with 32-bit shared addresses and global
 * sources stepped per chunk was 2-5% faster with int4 weights but 6-7% slower with int8; the
 * loop unrolled over the ring, deeper rings (6, 8) and a token ring sized to M at decode were
 * slower or no faster.
 */
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cute/arch/copy_sm80.hpp"
#include "cute/arch/mma_sm80.hpp"
#include "cutlass/array.h"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/numeric_types.h"

#include "gemmgen/c_api.h"
#include "gemmgen/mixed/mixed_mm_args.h"
#include "gemmgen/runtime_support.hpp"

namespace gemmgen::mixed::direct {

template <class ElementA_, class ElementW_, bool WithZero_, int WarpsN_, int WarpsK_,
          int TokenTiles_, int Stages_>
struct DirectConfig {
  using ElementA = ElementA_;  // activations = MMA, scale, zero and output type
  using ElementW = ElementW_;  // cutlass::int4b_t or int8_t
  static constexpr bool WithZero = WithZero_;
  static constexpr int WarpsN = WarpsN_;
  static constexpr int WarpsK = WarpsK_;
  static constexpr int TokenTiles = TokenTiles_;
  static constexpr int Stages = Stages_;
};

struct Params {
  void const* a;
  unsigned char const* w;
  void const* scale;
  void const* zero;
  void const* bias;
  void* d;
  int m, n, k, group;
  int64_t lda, ldd;
};

template <class Config>
struct DirectMixedMm {
  using ElementA = typename Config::ElementA;
  using ElementW = typename Config::ElementW;
  static constexpr bool kWithZero = Config::WithZero;
  static constexpr int kWarpsN = Config::WarpsN;
  static constexpr int kWarpsK = Config::WarpsK;
  static constexpr int kTokenTiles = Config::TokenTiles;
  static constexpr int kStages = Config::Stages;
  static_assert(kStages >= 2, "the ring needs at least two stages");

  static constexpr int kWarps = kWarpsN * kWarpsK;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunkK = 64;
  static constexpr int kRows = 16;                // output features per warp (the MMA's M)
  static constexpr int kTokens = 8 * kTokenTiles;  // tokens per CTA (the MMA's N, 8 per tile)
  static constexpr int kWeightBits = cutlass::sizeof_bits<ElementW>::value;
  static constexpr int kWeightRowBytes = kChunkK * kWeightBits / 8;       // 32 (int4), 64 (int8)
  static constexpr int kWeightStageBytes = kRows * kWeightRowBytes;
  static constexpr int kActRowBytes = kChunkK * 2;                        // 128: 8 × 16 bytes
  static constexpr int kActStageBytes = kTokens * kActRowBytes;
  static constexpr int kWeightRingBytes = kStages * kWeightStageBytes;  // per warp
  static constexpr int kActRingBytes = kStages * kActStageBytes;        // per K group
  static constexpr int kRingBytes = kWarps * kWeightRingBytes + kWarpsK * kActRingBytes;
  static constexpr int kReduceBytes = kWarps * kTokenTiles * 4 * 32 * 4;
  static constexpr int kSmemBytes = kRingBytes > kReduceBytes ? kRingBytes : kReduceBytes;
  static constexpr int kGroupThreads = 32 * kWarpsN;  // the threads of a K group

  static constexpr bool kIsBf16 = cute::is_same_v<ElementA, cutlass::bfloat16_t>;
  using Mma = cute::conditional_t<kIsBf16, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                  cute::SM80_16x8x16_F32F16F16F32_TN>;
  using Copy16 = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;
  using Converter = cutlass::NumericArrayConverter<ElementA, ElementW, 16>;

  static constexpr int kSegsPerRow = kWeightRowBytes / 16;
  static constexpr int kWeightCopies = kRows * kSegsPerRow / 32;  // per lane and chunk: 1 or 2
  static constexpr int kActSegs = kTokens * 8;                     // 16-byte segments a chunk
  // per thread of the K group and chunk (the last round may leave threads idle)
  static constexpr int kActCopies = (kActSegs + kGroupThreads - 1) / kGroupThreads;
  static_assert(kRows * kSegsPerRow % 32 == 0);

  // This thread's share of every chunk's copies, computed once: a global source that advances
  // by one chunk of K per chunk, a destination offset in the ring slot, and whether the row
  // exists (weight rows past N and token rows past M are zero-filled and never read from
  // global). Weights: the warp's 16 rows, 16-byte segments in row order, by its 32 lanes.
  // Tokens: the CTA's rows, by the K group's threads (`member` 0 .. 32·WarpsN - 1; a copy past
  // the segments is skipped), each row's eight 16-byte segments XOR-swizzled by (token % 8) so
  // that the lanes' fragment loads are free of bank conflicts.
  struct CopyPlan {
    unsigned char const* w_src[kWeightCopies];
    unsigned char const* a_src[kActCopies];
    int a_dst[kActCopies];
    bool w_ok[kWeightCopies];
    bool a_ok[kActCopies];
    bool a_mine[kActCopies];

    __device__ CopyPlan(Params const& p, int c_begin, int n0, int t0, int lane, int member) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kWeightCopies; ++j) {
        int const i = lane + 32 * j;
        int const n = n0 + i / kSegsPerRow;
        w_ok[j] = n < p.n;
        w_src[j] = p.w + (w_ok[j] ? (int64_t(n) * p.k + int64_t(c_begin) * kChunkK) *
                                            kWeightBits / 8 + (i % kSegsPerRow) * 16
                                      : 0);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kActCopies; ++j) {
        int const i = member + kGroupThreads * j;
        a_mine[j] = i < kActSegs;
        int const row = (a_mine[j] ? i : 0) / 8, seg = i % 8;
        a_ok[j] = a_mine[j] && t0 + row < p.m;
        a_src[j] = static_cast<unsigned char const*>(p.a) +
                   (a_ok[j] ? (int64_t(t0 + row) * p.lda + int64_t(c_begin) * kChunkK + seg * 8) *
                                  int64_t(sizeof(ElementA))
                            : 0);
        a_dst[j] = row * kActRowBytes + ((seg ^ (row & 7)) * 16);
      }
    }

    // Queue chunk `c_begin + ahead`'s copies into ring slots `weight_slot` and `act_slot`.
    __device__ void issue(char* weight_slot, char* act_slot, int ahead, int lane) const {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kWeightCopies; ++j) {
        unsigned char const* src = w_ok[j] ? w_src[j] + int64_t(ahead) * kWeightRowBytes : w_src[j];
        Copy16::copy(*reinterpret_cast<cute::uint128_t const*>(src),
                     *reinterpret_cast<cute::uint128_t*>(weight_slot + (lane + 32 * j) * 16), w_ok[j]);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kActCopies; ++j) {
        if (!a_mine[j]) {
          continue;
        }
        unsigned char const* src = a_ok[j] ? a_src[j] + int64_t(ahead) * kActRowBytes : a_src[j];
        Copy16::copy(*reinterpret_cast<cute::uint128_t const*>(src),
                     *reinterpret_cast<cute::uint128_t*>(act_slot + a_dst[j]), a_ok[j]);
      }
    }
  };

  // The barrier of K group `wk`'s warps (named barrier 1 + wk; 0 is __syncthreads'): they read
  // each other's copies. One warp a K group: the warp's own barrier. (Not the CTA's: measured on
  // the H100 with warps_k 4 and 8, tying the K groups together cost up to 1.5x.)
  static __device__ void k_group_sync(int wk) {
    if constexpr (kWarpsN == 1) {
      __syncwarp();
    } else {
      asm volatile("bar.sync %0, %1;" ::"r"(1 + wk), "r"(kGroupThreads) : "memory");
    }
  }
  static_assert(kWarpsN == 1 || kWarpsK <= 15, "one named barrier a K group: at most 15");

  static constexpr bool kInt4 = kWeightBits == 4;
  // Biased only where Σx is computed anyway, for the zero points (see the file's comment).
  static constexpr bool kBiased = kInt4 && kWithZero;
  static constexpr float kBias = !kBiased ? 0.f : kIsBf16 ? 136.f : 1032.f;
  // 1.0 in both halves, bf16 or fp16: the A fragment whose MMA sums the tokens' x
  static constexpr uint32_t kOnes = kIsBf16 ? 0x3F803F80u : 0x3C003C00u;

  // One weight row's 16 values of this lane (k = 16q .. 16q+15 of the chunk) as 8 words of two
  // 16-bit floats, word i holding values 2i and 2i+1 (biased by kBias).
  static __device__ void load_row(char const* weights, int row, int q, uint32_t (&out)[8]) {
    if constexpr (kInt4) {
      uint2 const stored =
          *reinterpret_cast<uint2 const*>(weights + row * kWeightRowBytes + q * (kWeightRowBytes / 4));
      // the exponent of 128 (bf16) or 1024 (fp16), and 8: the nibble's XOR to unsigned
      constexpr uint32_t kMagic = kIsBf16 ? 0x43084308u : 0x64086408u;
      uint32_t const words[2] = {stored.x, stored.y};
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t const w = words[h], shifted = w >> 4;
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < 4; ++b) {
          // byte b's low nibble (value 2b) to bits 0-3, its high nibble (2b + 1) to bits 16-19
          uint32_t const pair = __byte_perm(w, shifted, 0x0400 + 0x0101 * b);
          // (pair & 0x000F000F) ^ kMagic as one LOP3 (the compiler emits an AND and an XOR)
          asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(out[4 * h + b]) : "r"(pair), "n"(0x000F000F),
              "n"(kMagic));
          if constexpr (!kBiased) {  // subtract the magic: the stored value itself
            if constexpr (kIsBf16) {
              // x · 1 − magic (sub.bf16x2 needs sm90; fma.rn.bf16x2 is sm80's)
              asm("fma.rn.bf16x2 %0, %0, %1, %2;"
                  : "+r"(out[4 * h + b])
                  : "r"(kOnes), "r"(kMagic ^ 0x80008000u));
            } else {
              asm("sub.f16x2 %0, %0, %1;" : "+r"(out[4 * h + b]) : "r"(kMagic));
            }
          }
        }
      }
    } else {
      using Packed = cutlass::Array<ElementW, 16>;
      Packed const stored = *reinterpret_cast<Packed const*>(weights + row * kWeightRowBytes +
                                                             q * (kWeightRowBytes / 4));
      auto const converted = Converter::convert(stored);
      static_assert(sizeof(converted) == sizeof(out));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 8; ++i) {
        out[i] = reinterpret_cast<uint32_t const*>(&converted)[i];
      }
    }
  }

  // A biased group's segment (see the file's comment): its largest divisor up to 8 chunks.
  static __device__ int segment_chunks(int chunks_per_group) {
    int seg = chunks_per_group < 8 ? chunks_per_group : 8;
    while (chunks_per_group % seg != 0) {
      --seg;
    }
    return seg;
  }

  static __device__ float to_float(ElementA v) { return static_cast<float>(v); }

  static __device__ void kernel_body(Params const& p, char* smem) {
    int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const group_id = lane / 4, q = lane % 4;
    int const n0 = (blockIdx.y * kWarpsN + wn) * kRows;
    int const t0 = blockIdx.x * kTokens;
    int const chunks = p.k / kChunkK;
    int const c_begin = static_cast<int>(int64_t(chunks) * wk / kWarpsK);
    int const c_end = static_cast<int>(int64_t(chunks) * (wk + 1) / kWarpsK);
    int const chunks_per_group = p.group / kChunkK;
    int const chunks_per_segment = kBiased ? segment_chunks(chunks_per_group) : chunks_per_group;
    char* weight_ring = smem + warp * kWeightRingBytes;
    char* act_ring = smem + kWarps * kWeightRingBytes + wk * kActRingBytes;

    float acc[kTokenTiles][4] = {};     // scaled sum over finished segments
    float part[kTokenTiles][4] = {};    // this segment's unscaled sum
    float xsum[kTokenTiles][4] = {};    // this segment's per-token sum of x (zero-point scheme)

    int const n_lo = n0 + group_id, n_hi = n_lo + 8;
    ElementA const* scale = static_cast<ElementA const*>(p.scale);
    ElementA const* zero = static_cast<ElementA const*>(p.zero);
    auto finish_segment = [&](int g) {
      float const s_lo = n_lo < p.n ? to_float(scale[int64_t(g) * p.n + n_lo]) : 0.f;
      float const s_hi = n_hi < p.n ? to_float(scale[int64_t(g) * p.n + n_hi]) : 0.f;
      // Σx's factor: the zero point, less the bias the scale would otherwise apply
      float z_lo = 0.f, z_hi = 0.f;
      if constexpr (kWithZero) {
        z_lo = (n_lo < p.n ? to_float(zero[int64_t(g) * p.n + n_lo]) : 0.f) - kBias * s_lo;
        z_hi = (n_hi < p.n ? to_float(zero[int64_t(g) * p.n + n_hi]) : 0.f) - kBias * s_hi;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kTokenTiles; ++t) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) {
          float const s = i < 2 ? s_lo : s_hi;
          acc[t][i] += s * part[t][i];
          part[t][i] = 0.f;
          if constexpr (kWithZero) {
            acc[t][i] += (i < 2 ? z_lo : z_hi) * xsum[t][i];
            xsum[t][i] = 0.f;
          }
        }
      }
    };

    // Prologue: Stages - 1 chunks in flight (a commit group per chunk, empty past the range).
    CopyPlan const plan(p, c_begin, n0, t0, lane, wn * 32 + lane);
    int const count = c_end - c_begin;
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < count) {
        plan.issue(weight_ring + s * kWeightStageBytes, act_ring + s * kActStageBytes, s, lane);
      }
      cute::cp_async_fence();
    }

    // No division in the loop: ring slots advance by one, the group and segment by countdowns.
    int group = c_begin / chunks_per_group;
    int const in_group = c_begin - group * chunks_per_group;
    int left_in_group = chunks_per_group - in_group;
    int left_in_segment = chunks_per_segment - in_group % chunks_per_segment;
    int slot = 0, issue_slot = kStages - 1;
    for (int i = 0; i < count; ++i) {
      cute::cp_async_wait<kStages - 2>();
      k_group_sync(wk);  // chunk i landed for every thread of the K group (its copies are shared)
      // The slots chunk i + Stages - 1 goes to were read for chunk i - 1, by every thread of the
      // K group (before the barrier above).
      if (i + kStages - 1 < count) {
        plan.issue(weight_ring + issue_slot * kWeightStageBytes,
                   act_ring + issue_slot * kActStageBytes, i + kStages - 1, lane);
      }
      cute::cp_async_fence();
      issue_slot = issue_slot + 1 == kStages ? 0 : issue_slot + 1;

      char const* weights = weight_ring + slot * kWeightStageBytes;
      char const* act = act_ring + slot * kActStageBytes;
      slot = slot + 1 == kStages ? 0 : slot + 1;
      uint32_t w_lo[8], w_hi[8];
      load_row(weights, group_id, q, w_lo);
      load_row(weights, group_id + 8, q, w_hi);
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kTokenTiles; ++t) {
        int const row = t * 8 + group_id;
        uint4 const x0 = *reinterpret_cast<uint4 const*>(act + row * kActRowBytes +
                                                         (((2 * q) ^ (row & 7)) * 16));
        uint4 const x1 = *reinterpret_cast<uint4 const*>(act + row * kActRowBytes +
                                                         (((2 * q + 1) ^ (row & 7)) * 16));
        uint32_t const x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < 4; ++j) {
          Mma::fma(part[t][0], part[t][1], part[t][2], part[t][3],
                   w_lo[2 * j], w_hi[2 * j], w_lo[2 * j + 1], w_hi[2 * j + 1],
                   x[2 * j], x[2 * j + 1],
                   part[t][0], part[t][1], part[t][2], part[t][3]);
          if constexpr (kWithZero) {
            uint32_t const ones = kOnes;  // (the MMA takes references)
            Mma::fma(xsum[t][0], xsum[t][1], xsum[t][2], xsum[t][3], ones, ones, ones, ones,
                     x[2 * j], x[2 * j + 1], xsum[t][0], xsum[t][1], xsum[t][2], xsum[t][3]);
          }
        }
      }
      --left_in_group;
      if (--left_in_segment == 0) {
        finish_segment(group);
        left_in_segment = chunks_per_segment;
        if (left_in_group == 0) {
          ++group;
          left_in_group = chunks_per_group;
        }
      }
    }
    if (count > 0 && left_in_segment != chunks_per_segment) {
      finish_segment(group);  // the range ended inside a segment (an empty range adds nothing:
                              // a ±inf scale times its zero sum would be NaN)
    }
    cute::cp_async_wait<0>();
    __syncthreads();  // every ring is drained: the shared memory becomes the reduction buffer

    // Partial sums, [warp k][warp n][token tile][value][lane], added in warp-k order.
    float* reduce = reinterpret_cast<float*>(smem);
    auto at = [&](int k_index, int t, int i) {
      return ((((k_index * kWarpsN) + wn) * kTokenTiles + t) * 4 + i) * 32 + lane;
    };
    CUTLASS_PRAGMA_UNROLL
    for (int t = 0; t < kTokenTiles; ++t) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        reduce[at(wk, t, i)] = acc[t][i];
      }
    }
    __syncthreads();
    if (wk != 0) {
      return;
    }
    ElementA const* bias = static_cast<ElementA const*>(p.bias);
    ElementA* d = static_cast<ElementA*>(p.d);
    CUTLASS_PRAGMA_UNROLL
    for (int t = 0; t < kTokenTiles; ++t) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        float v = 0.f;
        for (int w = 0; w < kWarpsK; ++w) {
          v += reduce[at(w, t, i)];
        }
        int const n = i < 2 ? n_lo : n_hi;
        int const token = t0 + t * 8 + 2 * q + (i & 1);
        if (n < p.n && token < p.m) {
          if (bias != nullptr) {
            v += to_float(bias[n]);
          }
          d[int64_t(token) * p.ldd + n] = ElementA(v);
        }
      }
    }
  }

  static Params make_params(gemmgen_mixed_mm_args const& a) {
    return Params{a.a, static_cast<unsigned char const*>(a.w), a.scale, a.zero, a.bias, a.d,
                  static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k),
                  static_cast<int>(a.group_size), a.lda, a.ldd};
  }

  static size_t workspace_size(gemmgen_mixed_mm_args const*) { return 0; }
};

template <class Config>
__global__ void __launch_bounds__(DirectMixedMm<Config>::kThreads)
    direct_mixed_mm_kernel(Params const params) {
  extern __shared__ __align__(128) char smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  pdl_wait();  // the activations may come from the previous kernel; its reads of our output
  pdl_release();
  DirectMixedMm<Config>::kernel_body(params, smem);
#endif
}

// The C-ABI entry: checks what the kernel relies on, then launches. `PdlCapable`: the library's
// arch has griddepcontrol (sm90a; the sm80 library's PTX has no wait, so it never launches as a
// programmatic dependent, whatever the arguments ask).
template <class Config, bool PdlCapable>
int run(gemmgen_mixed_mm_args const* args, void*, size_t, void* stream, char const* kernel_name) {
  using K = DirectMixedMm<Config>;
  auto const& a = *args;
  auto aligned = [](void const* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (a.m < 1 || a.n < 1 || a.k < K::kChunkK || a.k % K::kChunkK != 0 || a.k >= (int64_t(1) << 31) ||
      a.m >= (int64_t(1) << 31) || a.n >= (int64_t(1) << 31)) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs M, N >= 1 and K a positive multiple of 64, all below 2^31");
  }
  if (a.group_size < K::kChunkK || a.group_size % K::kChunkK != 0 || a.k % a.group_size != 0) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs a group size that is a multiple of 64 and divides K");
  }
  if (a.a == nullptr || a.w == nullptr || a.scale == nullptr || a.d == nullptr) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "needs activations, weight, scales, output");
  }
  if (!aligned(a.a) || !aligned(a.w) || a.lda % 8 != 0 || a.lda < a.k || a.ldd < a.n) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs 16-byte aligned activations and weight, lda a multiple of 8 (>= K), ldd >= N");
  }
  if (K::kWithZero && a.zero == nullptr) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "needs the zero-point tensor");
  }
  int64_t const feature_blocks = (a.n + 16 * K::kWarpsN - 1) / (16 * K::kWarpsN);
  int64_t const token_blocks = (a.m + K::kTokens - 1) / K::kTokens;
  if (feature_blocks > 65535) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "N too large for the launch grid");
  }
  static std::atomic<bool> raised[detail::kMaxDevices] = {};
  int const allowed =
      allow_shared_memory_once(direct_mixed_mm_kernel<Config>, K::kSmemBytes, raised, kernel_name);
  if (allowed != GEMMGEN_OK) {
    return allowed;
  }
  dim3 const grid(static_cast<unsigned>(token_blocks), static_cast<unsigned>(feature_blocks));
  bool const pdl = PdlCapable && (a.launch_flags & GEMMGEN_LAUNCH_PDL) != 0;
  launch_maybe_pdl(direct_mixed_mm_kernel<Config>, grid, dim3(K::kThreads), K::kSmemBytes,
                   static_cast<cudaStream_t>(stream), pdl, K::make_params(a));
  cudaError_t const launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
  }
  return GEMMGEN_OK;
}

}  // namespace gemmgen::mixed::direct
