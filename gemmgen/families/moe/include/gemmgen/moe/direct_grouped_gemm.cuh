/*
 * gemmgen/moe/direct_grouped_gemm.cuh — the MoE family's "direct" kernels: grouped_matmul_swiglu_quant
 * with int8 activations and int8 or int4 weights on mma.sync (m16n8k32 s8, sm80 and later, so
 * also sm90a), or fp8 e4m3 activations and weights (m16n8k32 e4m3 with float32 accumulation,
 * sm89 and later), for few tokens per expert, where reading the weights is the whole cost. Three
 * launches on one stream, none waiting for the host:
 *
 *   1. group_work: each expert's end row from the group list (clamped, see swiglu_quant.cuh)
 *      and the list of the non-empty experts (for the wgmma kernel with per-channel weights, in
 *      the same launch as the tokens' permutation: group_work_and_permute);
 *   2. the grouped GEMM below, writing C = dequantized (X_i · W_i) in fp32;
 *   3. swiglu_quant (swiglu_quant.cuh): SwiGLU and per-row quantization of C.
 *
 * A fused GEMM (the wgmma kernel's `Fused` configs; Gemm::kFused) writes S = SwiGLU(C) instead,
 * half C's columns, and reduces each row's max |S| by atomics into [M] maxima that step 1 zeroes
 * (its launch's blocks after the first, or with inline grouping the permutation's: a fused op
 * with per-group scales, which has no permutation, always launches group_work); step
 * 3 is then quantize_rows, which only scales and rounds, as after the CUTLASS fused kernels. S
 * is stored evict_last and dropped once read where it fits in a third of L2 (s_kept_in_l2).
 *
 * Inline grouping: when the GEMM's grid has at most kInlineGroupingCtas CTAs (decode of a model
 * with narrow experts), step 1 is not a launch of its own: every CTA scans the group list itself
 * (the same clamped scan, by its own threads) for the expert of its slot, and CTA (0, 0, 0)
 * writes the row count the SwiGLU pass needs. That takes a kernel boundary (launch, completion,
 * flush) off the op's critical path, which at a few tokens is latency, not bytes: 1 token of
 * Qwen3-30B-A3B (192 CTAs) 9-11% faster in int8 and 12-13% in A8W4 on the H100 and the H200.
 * With more CTAs the scan per CTA costs more than it saves (on the H100: Mixtral at 1 token,
 * 896-1792 CTAs, 2-3% slower; 16 tokens a step of Qwen3, 6144 CTAs, 15-23% slower), so
 * group_work's shared lists stay there.
 *
 * Scales: per channel (w_scale [E, N]: C = w_scale · (x_scale · acc), acc the exact int32 sum,
 * or with e4m3 the float32 one, the same two float32 roundings as the CUTLASS kernels' epilogue;
 * e4m3's MMAs add into the float32 accumulator over the warp's whole K range as the tensor cores
 * do, which may keep fewer bits than float32 (like CUTLASS's FP8FastAccum, not promoted every
 * 128 K like its accurate mainloop); then the warps' partial sums are added in float32 in a fixed
 * order) or per group (w_scale
 * [E, K/group, N]: C = x_scale · Σ_g w_scale[g] · acc_g, each group's int32 sum promoted to
 * float32 when the group ends). The group size is a run-time value: a multiple of 128 that
 * divides K (per channel: one group spanning K).
 *
 * Work split. The grid is (feature blocks, expert slots, token slots). There are min(E, M) expert
 * slots, as no more experts than rows can be non-empty: slot y serves the y-th non-empty expert
 * (group_work's list; a slot past the count exits at once), so a decode step with a few active
 * experts of many launches a few CTAs, not one per expert. A warp owns 16 output features (the
 * MMA's M) and a contiguous range of K; a CTA has WarpsN × WarpsK warps (WarpsN feature blocks,
 * each K split WarpsK ways) and works on 8·TokenTiles rows of its expert at a time (the MMA's N,
 * 8 per tile), walking that expert's row tiles z, z + Z, ... (Z token slots). The WarpsN warps
 * that share a K range (a "K group") stream it in chunks of 128 K through cp.async rings of
 * Stages chunks: each warp its own 16 weight rows, the K group one shared ring of the tile's
 * activations (each row read from L2 once per CTA, not once per warp), with one barrier a chunk
 * (the CTA's, when it has several feature warps). The WarpsK partial sums are added in a fixed
 * order through shared memory, so results are bit-identical run to run.
 *
 * K order inside a chunk. The MMA sums over its 32 k slots, so any bijection between slots and
 * the chunk's 128 k values gives the same sum if both operands use it. For the lane with
 * q = lane % 4 and MMA j ∈ 0..3, the slots {4q..4q+3} (registers a0/a1/b0) and {16+4q..16+4q+3}
 * (a2/a3/b1) hold k = 32q + 8j + {0..3} and {4..7} (int8 weights), or k = 32q + 8j + {0, 2, 4, 6}
 * and {1, 3, 5, 7} (int4 weights): each lane's 32 k values of a weight row and of a token are
 * contiguous in the packed weight (packing.py, K-major, even k in the low nibble) and in x, so the
 * per-channel weights need no layout of their own. Per-group int4 weights come in the MMA's own k
 * order (packing.py: the lane's 16 bytes of a row give slots 4q.. and 16 + 4q.. of MMA j as k =
 * 32j + 4q .. and + 16), shared with the wgmma kernel, whose tokens cannot be permuted; the
 * tokens' words are then read in natural order. int4 → int8 is two masks and a shift per 8
 * values: the nibble lands in the byte's high half (16·w, exact in int8), and the 16 is taken
 * back out of each chunk's int32 sum by an exact shift.
 */
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cute/arch/copy_sm80.hpp"
#include "cute/arch/mma_sm80.hpp"
#include "cute/arch/mma_sm89.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/fast_math.h"
#include "cutlass/numeric_types.h"

#include "gemmgen/c_api.h"
#include "gemmgen/moe/moe_args.h"
#include "gemmgen/moe/swiglu_quant.cuh"
#include "gemmgen/runtime_support.hpp"

namespace gemmgen::moe::direct {

template <class ElementW_, int WarpsN_, int WarpsK_, int TokenTiles_, int Stages_>
struct DirectConfig {
  // int8_t or cutlass::int4b_t (int8 activations), or cutlass::float_e4m3_t (e4m3 activations,
  // per-channel scales)
  using ElementW = ElementW_;
  static constexpr int WarpsN = WarpsN_;
  static constexpr int WarpsK = WarpsK_;
  static constexpr int TokenTiles = TokenTiles_;
  static constexpr int Stages = Stages_;
};

struct Params {
  int8_t const* x;            // x's bytes: int8, or e4m3 with e4m3 weights
  unsigned char const* w;
  float const* w_scale;
  float const* x_scale;
  int64_t const* ends;        // [E] end row of each expert (group_work; null: inline grouping)
  int32_t const* active;      // [min(E, M)] the non-empty experts, in order (group_work)
  int64_t const* active_total;  // how many there are
  int64_t const* group_list;  // inline grouping: the op's group list, scanned by every CTA
  int64_t* rows_total;        // inline grouping: written by CTA (0, 0, 0) for the SwiGLU pass
  int64_t experts;
  int32_t cumsum;             // group_list_type
  float* c;             // [M, N] fp32 (a fused GEMM: S [M, N/2])
  int m, n, k;
  int groups;           // groups per expert: K / group size (1: per channel)
  int chunks_per_group;
  int x_stride;         // x's row stride (K; the wgmma kernel's permuted copy: K rounded up to 128)
  uint32_t* row_max = nullptr;  // a fused GEMM: [M] max|S| bits a row (zeroed by the launch before)
  bool keep_s = false;          // a fused GEMM: store S evict_last (s_kept_in_l2)
};

// The tokens of int4 weights in CUTLASS's order (even k in the low nibble) for the wgmma kernel:
// x [M, K] → x_perm [M, Kp] (Kp = K rounded up to 128, zeros past K), in each 128-k chunk byte
// 32j + 16b + 4q + i = x[32q + 8j + 2i + b]. The wgmma kernel then converts a lane's 16 weight
// bytes of a row (k = 32q .. 32q + 31) with a shift and masks, word j giving the even k of
// 32q + 8j .. + 7 (its A slots 4q ..) and the odd ones (slots 16 + 4q ..), and wgmma reads
// the tokens at those slots from x_perm as it is. A thread per 8 input bytes, its row by a
// multiply-high (`by_groups`: k_pad / 8 pieces a row; a 64-bit division took ~70 instructions),
// over `blocks` blocks of which this is `block`.
__device__ __forceinline__ void permute_tokens(int8_t const* x, int8_t* x_perm, int64_t m, int k,
                                               int k_pad, cutlass::FastDivmodU64 by_groups,
                                               int64_t block, int64_t blocks) {
  int64_t const pieces = m * static_cast<int64_t>(by_groups.divisor);
  for (int64_t i = block * blockDim.x + threadIdx.x; i < pieces; i += blocks * blockDim.x) {
    uint64_t piece;
    int64_t const row = static_cast<int64_t>(by_groups.divmod(piece, static_cast<uint64_t>(i)));
    int const k0 = static_cast<int>(piece) * 8;
    uint2 v = make_uint2(0u, 0u);
    if (k0 < k) {
      v = *reinterpret_cast<uint2 const*>(x + row * k + k0);
    }
    int const chunk = k0 / 128 * 128, q = k0 % 128 / 32, j = k0 % 32 / 8;
    int8_t* out = x_perm + row * k_pad + chunk + 32 * j + 4 * q;
    *reinterpret_cast<uint32_t*>(out) = __byte_perm(v.x, v.y, 0x6420);       // even k
    *reinterpret_cast<uint32_t*>(out + 16) = __byte_perm(v.x, v.y, 0x7531);  // odd k
  }
}

// The permutation alone (the GEMM groups its rows inline), and `zero_count` zeros to `zeros` (a
// fused GEMM's row maxima).
static __global__ void permute_tokens_for_mma(int8_t const* x, int8_t* x_perm, int64_t m, int k,
                                              int k_pad, cutlass::FastDivmodU64 by_groups,
                                              uint32_t* zeros, int64_t zero_count) {
  pdl_wait();  // x may come from the kernel before
  pdl_release();
  permute_tokens(x, x_perm, m, k, k_pad, by_groups, blockIdx.x, gridDim.x);
  zero_words(zeros, zero_count, blockIdx.x, gridDim.x);
}

// One block of kSetupThreads: ends[i] for every expert, the non-empty experts in order
// (active[0 .. count)), rows_total and the count, clamped like group_setup.
__device__ __forceinline__ void find_groups(int64_t const* group_list, int32_t cumsum,
                                            int64_t experts, int64_t m, int64_t* ends,
                                            int32_t* active, int64_t* rows_total,
                                            int64_t* active_total) {
  scan_groups(group_list, cumsum, experts, m, rows_total, active_total,
              [&](int64_t i, int64_t start, int64_t end, int64_t index) {
                ends[i] = end;
                if (end > start) {
                  active[index] = static_cast<int32_t>(i);
                }
              });
}

// find_groups as a launch of its own (block 0), its blocks after the first zeroing `zero_count`
// words at `zeros` (a fused GEMM's row maxima). Internal linkage, as the kernels below: every
// translation unit that includes this header has its own.
static __global__ void __launch_bounds__(kSetupThreads)
group_work(int64_t const* group_list, int32_t cumsum, int64_t experts, int64_t m, int64_t* ends,
           int32_t* active, int64_t* rows_total, int64_t* active_total, uint32_t* zeros,
           int64_t zero_count) {
  pdl_wait();  // the group list comes from an earlier kernel; the previous call reads `ends`
  pdl_release();
  if (blockIdx.x == 0) {
    find_groups(group_list, cumsum, experts, m, ends, active, rows_total, active_total);
  } else {
    zero_words(zeros, zero_count, blockIdx.x - 1, gridDim.x - 1);
  }
}

// Both in one launch: block 0 finds the groups while the others permute the tokens (the two are
// independent) and zero `zero_count` words at `zeros` (a fused GEMM's row maxima). As two
// launches the permutation waited for the one-block scan to complete (256 tokens of
// Qwen3-30B-A3B: 3.1 µs, then 5.9, H200 ncu).
static __global__ void __launch_bounds__(kSetupThreads)
group_work_and_permute(int64_t const* group_list, int32_t cumsum, int64_t experts, int64_t m,
                       int64_t* ends, int32_t* active, int64_t* rows_total, int64_t* active_total,
                       int8_t const* x, int8_t* x_perm, int k, int k_pad,
                       cutlass::FastDivmodU64 by_groups, uint32_t* zeros, int64_t zero_count) {
  pdl_wait();  // the group list and x come from earlier kernels
  pdl_release();
  if (blockIdx.x == 0) {
    find_groups(group_list, cumsum, experts, m, ends, active, rows_total, active_total);
  } else {
    permute_tokens(x, x_perm, m, k, k_pad, by_groups, blockIdx.x - 1, gridDim.x - 1);
    zero_words(zeros, zero_count, blockIdx.x - 1, gridDim.x - 1);
  }
}

template <class Config>
struct DirectGroupedGemm {
  using ElementW = typename Config::ElementW;
  static constexpr int kWarpsN = Config::WarpsN;
  static constexpr int kWarpsK = Config::WarpsK;
  static constexpr int kTokenTiles = Config::TokenTiles;
  static constexpr int kStages = Config::Stages;
  static_assert(kStages >= 2, "the ring needs at least two stages");
  static constexpr bool kInt4 = cute::is_same_v<ElementW, cutlass::int4b_t>;
  static constexpr bool kFp8 = cute::is_same_v<ElementW, cutlass::float_e4m3_t>;
  static_assert(kFp8 || kInt4 || cute::is_same_v<ElementW, int8_t>, "int8, int4 or e4m3 weights");
  using ElementQ = cute::conditional_t<kFp8, cutlass::float_e4m3_t, int8_t>;  // x's and q's type
#if defined(__CUDA_ARCH__) && !defined(CUTE_ARCH_MMA_F32_SM89_ENABLED)
  // CuTe compiles SM89_16x8x32_F32E4M3E4M3F32_TN's MMA only with nvcc 12.4+ on sm89+; elsewhere
  // its fma does nothing (with NDEBUG), which would leave every sum 0
  static constexpr bool kFp8MmaCompiled = false;
#else
  static constexpr bool kFp8MmaCompiled = true;  // (the host pass never runs the MMA)
#endif
  static_assert(!kFp8 || kFp8MmaCompiled,
                "e4m3 direct kernels need nvcc 12.4 or later and sm89+ (mma.sync e4m3)");
  // The MMA's accumulator: the exact int32 sum, or e4m3's float32 one
  using Acc = cute::conditional_t<kFp8, float, int32_t>;

  static constexpr int kWarps = kWarpsN * kWarpsK;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunkK = 128;
  static constexpr int kRows = 16;                 // output features per warp (the MMA's M)
  static constexpr int kTokens = 8 * kTokenTiles;  // rows per CTA tile (the MMA's N, 8 a tile)
  static constexpr int kFeatures = kRows * kWarpsN;  // output features a CTA
  static constexpr bool kTokenSlotsFirst = false;   // (grouped_block)
  static constexpr bool kPermutedTokens = false;    // reads x as it is (OwnSwigluQuant)
  static constexpr bool kTmaMaps = false;           // the kernel takes Params only (OwnSwigluQuant)
  static constexpr bool kFused = false;             // writes C for the SwiGLU pass (OwnSwigluQuant)
  static constexpr int kWeightBits = kInt4 ? 4 : 8;
  static constexpr int kWeightRowBytes = kChunkK * kWeightBits / 8;  // 64 (int4), 128 (int8)
  static constexpr int kWeightStageBytes = kRows * kWeightRowBytes;
  static constexpr int kActRowBytes = kChunkK;                       // 128: 8 × 16 bytes
  static constexpr int kActStageBytes = kTokens * kActRowBytes;
  static constexpr int kWeightRingBytes = kStages * kWeightStageBytes;  // per warp
  static constexpr int kActRingBytes = kStages * kActStageBytes;        // per K group
  static constexpr int kRingBytes = kWarps * kWeightRingBytes + kWarpsK * kActRingBytes;
  static constexpr int kReduceBytes = kWarps * kTokenTiles * 4 * 32 * 4;
  static constexpr int kSmemBytes = kRingBytes > kReduceBytes ? kRingBytes : kReduceBytes;
  // Every grid launches with kSmemBytes (the wgmma kernel pads a small grid's: its
  // launch_smem_bytes).
  static constexpr int kSmemSmallGrid = kSmemBytes;
  static int launch_smem_bytes(int64_t, int) { return kSmemBytes; }
  static constexpr int kGroupThreads = 32 * kWarpsN;  // the threads of a K group

  // Both take A and B in the same fragment layout (8-bit values, 32 k an MMA), so the weights and
  // tokens are loaded alike.
  using Mma = cute::conditional_t<kFp8, cute::SM89_16x8x32_F32E4M3E4M3F32_TN,
                                  cute::SM80_16x8x32_S32S8S8S32_TN>;
  using Copy16 = cute::SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<cute::uint128_t>;

  static constexpr int kSegsPerRow = kWeightRowBytes / 16;          // 4 (int4), 8 (int8)
  static constexpr int kKPerSeg = kChunkK / kSegsPerRow;            // 32 (int4), 16 (int8)
  static constexpr int kWeightCopies = kRows * kSegsPerRow / 32;   // per lane and chunk: 2 or 4
  static constexpr int kActSegs = kTokens * 8;                      // 16-byte segments a chunk
  // per thread of the K group and chunk (the last round may leave threads idle)
  static constexpr int kActCopies = (kActSegs + kGroupThreads - 1) / kGroupThreads;
  static_assert(kRows * kSegsPerRow % 32 == 0);

  // A row's 16-byte segment s is stored at s ^ (row % 8) (int8 weights and activations: eight
  // segments a row) so that the lanes' fragment loads are free of bank conflicts; int4 weight
  // rows are 64 bytes, already conflict-free.
  static __device__ int weight_seg(int row, int seg) { return kInt4 ? seg : seg ^ (row & 7); }

  // This thread's share of every chunk's copies, computed once per row tile: a global source
  // that advances by one chunk of K per chunk, a destination in the ring slot, whether the row
  // exists (weight rows past N and rows past the tile are zero-filled, never read), and the K
  // offset of its segment (segments past K, in a last partial chunk, are zero-filled too).
  // Weights: the warp's 16 rows, by its 32 lanes. Activations: the tile's rows, by the K
  // group's threads (`member` 0 .. 32·WarpsN - 1); a copy past the tile's segments is skipped.
  struct CopyPlan {
    unsigned char const* w_src[kWeightCopies];
    unsigned char const* a_src[kActCopies];
    int w_dst[kWeightCopies];
    int a_dst[kActCopies];
    int w_k[kWeightCopies];
    int a_k[kActCopies];
    bool w_ok[kWeightCopies];
    bool a_ok[kActCopies];
    bool a_mine[kActCopies];

    __device__ CopyPlan(Params const& p, unsigned char const* w_expert, int c_begin, int n0,
                        int64_t t0, int64_t t_end, int lane, int member) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kWeightCopies; ++j) {
        int const i = lane + 32 * j;
        int const row = i / kSegsPerRow, seg = i % kSegsPerRow;
        w_ok[j] = n0 + row < p.n;
        w_k[j] = c_begin * kChunkK + seg * kKPerSeg;
        w_src[j] = w_expert + (w_ok[j] ? (int64_t(n0 + row) * p.k + w_k[j]) * kWeightBits / 8 : 0);
        w_dst[j] = row * kWeightRowBytes + weight_seg(row, seg) * 16;
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kActCopies; ++j) {
        int const i = member + kGroupThreads * j;
        a_mine[j] = i < kActSegs;
        int const row = (a_mine[j] ? i : 0) / 8, seg = i % 8;
        a_ok[j] = a_mine[j] && t0 + row < t_end;
        a_k[j] = c_begin * kChunkK + seg * 16;
        a_src[j] = reinterpret_cast<unsigned char const*>(p.x) +
                   (a_ok[j] ? (t0 + row) * p.x_stride + a_k[j] : 0);
        a_dst[j] = row * kActRowBytes + ((seg ^ (row & 7)) * 16);
      }
    }

    // Queue chunk `c_begin + ahead`'s copies into ring slots `weight_slot` and `act_slot`.
    __device__ void issue(char* weight_slot, char* act_slot, int ahead, int k) const {
      int const dk = ahead * kChunkK;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kWeightCopies; ++j) {
        bool const ok = w_ok[j] && w_k[j] + dk < k;
        unsigned char const* src = ok ? w_src[j] + int64_t(ahead) * kWeightRowBytes : w_src[j];
        Copy16::copy(*reinterpret_cast<cute::uint128_t const*>(src),
                     *reinterpret_cast<cute::uint128_t*>(weight_slot + w_dst[j]), ok);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kActCopies; ++j) {
        if (!a_mine[j]) {
          continue;
        }
        bool const ok = a_ok[j] && a_k[j] + dk < k;
        unsigned char const* src = ok ? a_src[j] + int64_t(ahead) * kActRowBytes : a_src[j];
        Copy16::copy(*reinterpret_cast<cute::uint128_t const*>(src),
                     *reinterpret_cast<cute::uint128_t*>(act_slot + a_dst[j]), ok);
      }
    }
  };

  // One weight row's A registers for MMA j of the chunk: {slots 4q.., slots 16+4q..}.
  struct RowFragments {
    uint32_t lo[4], hi[4];
  };

  static __device__ RowFragments load_row(char const* weights, int row, int q) {
    RowFragments f;
    char const* base = weights + row * kWeightRowBytes;
    if constexpr (kInt4) {
      // 16 bytes: word j holds k = 32q + 8j + 0..7, one nibble each, even k in the low nibble
      uint4 const u = *reinterpret_cast<uint4 const*>(base + q * 16);
      uint32_t const words[4] = {u.x, u.y, u.z, u.w};
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        f.lo[j] = (words[j] << 4) & 0xF0F0F0F0u;  // k = 0, 2, 4, 6 (times 16)
        f.hi[j] = words[j] & 0xF0F0F0F0u;         // k = 1, 3, 5, 7 (times 16)
      }
    } else {
      // 32 bytes (segments 2q, 2q + 1): word i holds k = 32q + 4i .. 4i + 3
      uint4 const u0 = *reinterpret_cast<uint4 const*>(base + weight_seg(row, 2 * q) * 16);
      uint4 const u1 = *reinterpret_cast<uint4 const*>(base + weight_seg(row, 2 * q + 1) * 16);
      uint32_t const words[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        f.lo[j] = words[2 * j];
        f.hi[j] = words[2 * j + 1];
      }
    }
    return f;
  }

  // One token's B registers for MMA j, in the same k order as the weights'. mma_order (int4
  // weights with per-group scales, packed in the MMA's own k order): MMA j's k = 32j + 4q ..
  // and + 16, one 32-bit word each.
  static __device__ void token_fragments(char const* act, int row, int q, bool mma_order,
                                         uint32_t (&b)[4][2]) {
    char const* base = act + row * kActRowBytes;
    if (kInt4 && mma_order) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < 4; ++j) {
        b[j][0] = *reinterpret_cast<uint32_t const*>(base + (((2 * j) ^ (row & 7)) * 16) + 4 * q);
        b[j][1] = *reinterpret_cast<uint32_t const*>(base + (((2 * j + 1) ^ (row & 7)) * 16) + 4 * q);
      }
      return;
    }
    uint4 const x0 = *reinterpret_cast<uint4 const*>(base + (((2 * q) ^ (row & 7)) * 16));
    uint4 const x1 = *reinterpret_cast<uint4 const*>(base + (((2 * q + 1) ^ (row & 7)) * 16));
    uint32_t const words[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) {
      if constexpr (kInt4) {
        b[j][0] = __byte_perm(words[2 * j], words[2 * j + 1], 0x6420);  // k = 0, 2, 4, 6
        b[j][1] = __byte_perm(words[2 * j], words[2 * j + 1], 0x7531);  // k = 1, 3, 5, 7
      } else {
        b[j][0] = words[2 * j];
        b[j][1] = words[2 * j + 1];
      }
    }
  }

  // What this kernel needs beyond the op's common checks (OwnSwigluQuant::run): nothing.
  static int check(gemmgen_moe_args const*, char const*) { return GEMMGEN_OK; }

  // The ring barrier: a K group's warps read each other's copies. One warp a K group: the warp's
  // own barrier; else the CTA's (every warp steps through the same number of chunks, see
  // ring_steps), which compute-sanitizer's racecheck follows. Measured on the H100 at the
  // shipped configs (warps_k 1..4, a few chunks a warp) as fast as a named barrier per K group;
  // the mixed family's kernel, with hundreds of chunks a warp and warps_k 8, keeps the latter.
  static __device__ void ring_sync() {
    if constexpr (kWarpsN == 1) {
      __syncwarp();
    } else {
      __syncthreads();
    }
  }

  // The main loop's steps: this warp's chunks, or with several feature warps the most chunks any
  // K range has (a shorter range idles through its last step) so that all reach ring_sync alike.
  static __device__ int ring_steps(int count, int chunks) {
    return kWarpsN == 1 ? count : (chunks + kWarpsK - 1) / kWarpsK;
  }

  // One row tile [t0, t_end) of expert `e` for this CTA's features: C[rows, features].
  static __device__ void row_tile(Params const& p, char* smem, int feature_block, int e, int64_t t0,
                                  int64_t t_end) {
    int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const group_id = lane / 4, q = lane % 4;
    int const n0 = (feature_block * kWarpsN + wn) * kRows;
    int const chunks = (p.k + kChunkK - 1) / kChunkK;
    int const c_begin = static_cast<int>(int64_t(chunks) * wk / kWarpsK);
    int const c_end = static_cast<int>(int64_t(chunks) * (wk + 1) / kWarpsK);
    char* weight_ring = smem + warp * kWeightRingBytes;
    char* act_ring = smem + kWarps * kWeightRingBytes + wk * kActRingBytes;
    bool const per_group = p.groups > 1;
    unsigned char const* w_expert = p.w + int64_t(e) * p.n * p.k * kWeightBits / 8;

    Acc acc[kTokenTiles][4] = {};  // this group's sum (per channel: the whole range's)
    float scaled[kTokenTiles][4] = {};  // per group: Σ over finished groups of w_scale · acc

    int const n_lo = n0 + group_id, n_hi = n_lo + 8;
    // Per group: this lane's two scales (rows n_lo, n_hi) of group g, loaded a group ahead of
    // their use so that the load's latency hides behind the next group's MMAs.
    float const* expert_scales = p.w_scale + int64_t(e) * p.groups * p.n;
    auto group_scales = [&](int g, float (&out)[2]) {
      out[0] = out[1] = 0.f;
      if (per_group && g < p.groups) {
        float const* s = expert_scales + int64_t(g) * p.n;
        out[0] = n_lo < p.n ? s[n_lo] : 0.f;
        out[1] = n_hi < p.n ? s[n_hi] : 0.f;
      }
    };
    float scale_now[2] = {0.f, 0.f}, scale_next[2] = {0.f, 0.f};
    auto finish_group = [&](int g) {
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kTokenTiles; ++t) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) {
          scaled[t][i] += scale_now[i / 2] * static_cast<float>(acc[t][i]);
          acc[t][i] = 0;
        }
      }
      scale_now[0] = scale_next[0], scale_now[1] = scale_next[1];
      group_scales(g + 2, scale_next);
    };

    // Prologue: Stages - 1 chunks in flight (a commit group per chunk, empty past the range).
    CopyPlan const plan(p, w_expert, c_begin, n0, t0, t_end, lane, wn * 32 + lane);
    int const count = c_end - c_begin;
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < count) {
        plan.issue(weight_ring + s * kWeightStageBytes, act_ring + s * kActStageBytes, s, p.k);
      }
      cute::cp_async_fence();
    }

    int group = c_begin / p.chunks_per_group;
    int left_in_group = p.chunks_per_group - (c_begin - group * p.chunks_per_group);
    group_scales(group, scale_now);
    group_scales(group + 1, scale_next);
    int slot = 0, issue_slot = kStages - 1;
    int const steps = ring_steps(count, chunks);
    for (int i = 0; i < steps; ++i) {
      cute::cp_async_wait<kStages - 2>();
      ring_sync();  // chunk i landed for every thread of the K group (its copies are shared)
      // The slots chunk i + Stages - 1 goes to were read for chunk i - 1, by every thread of the
      // K group (before the barrier above).
      if (i + kStages - 1 < count) {
        plan.issue(weight_ring + issue_slot * kWeightStageBytes,
                   act_ring + issue_slot * kActStageBytes, i + kStages - 1, p.k);
      }
      cute::cp_async_fence();
      issue_slot = issue_slot + 1 == kStages ? 0 : issue_slot + 1;
      if (i >= count) {
        continue;  // past this K range's chunks: only the barrier above
      }

      char const* weights = weight_ring + slot * kWeightStageBytes;
      char const* act = act_ring + slot * kActStageBytes;
      slot = slot + 1 == kStages ? 0 : slot + 1;
      RowFragments const w_lo = load_row(weights, group_id, q);
      RowFragments const w_hi = load_row(weights, group_id + 8, q);
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kTokenTiles; ++t) {
        uint32_t b[4][2];
        token_fragments(act, t * 8 + group_id, q, per_group, b);
        if constexpr (kFp8) {  // straight into the accumulator, as the tensor cores add (the
                               // FP8FastAccum way: no promotion, see the file's comment)
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) {
            Mma::fma(acc[t][0], acc[t][1], acc[t][2], acc[t][3], w_lo.lo[j], w_hi.lo[j], w_lo.hi[j],
                     w_hi.hi[j], b[j][0], b[j][1], acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
          }
        } else {
          uint32_t part[4] = {0u, 0u, 0u, 0u};
          CUTLASS_PRAGMA_UNROLL
          for (int j = 0; j < 4; ++j) {
            Mma::fma(part[0], part[1], part[2], part[3], w_lo.lo[j], w_hi.lo[j], w_lo.hi[j],
                     w_hi.hi[j], b[j][0], b[j][1], part[0], part[1], part[2], part[3]);
          }
          CUTLASS_PRAGMA_UNROLL
          for (int v = 0; v < 4; ++v) {  // int4: every product is 16·x·w, so the sum divides by 16
            acc[t][v] += kInt4 ? static_cast<int32_t>(part[v]) >> 4 : static_cast<int32_t>(part[v]);
          }
        }
      }
      if (per_group && --left_in_group == 0) {
        finish_group(group);
        ++group;
        left_in_group = p.chunks_per_group;
      }
    }
    if (per_group && count > 0 && left_in_group != p.chunks_per_group) {
      finish_group(group);  // the range ended inside a group (an empty range adds nothing: a
                            // ±inf scale times its zero sum would be NaN)
    }
    cute::cp_async_wait<0>();
    __syncthreads();  // every ring is drained: the shared memory becomes the reduction buffer

    // Partial sums, [warp k][warp n][token tile][value][lane], added in warp-k order: int32
    // (exact) per channel, float32 per group and with e4m3.
    uint32_t* reduce = reinterpret_cast<uint32_t*>(smem);
    auto at = [&](int k_index, int t, int i) {
      return ((((k_index * kWarpsN) + wn) * kTokenTiles + t) * 4 + i) * 32 + lane;
    };
    CUTLASS_PRAGMA_UNROLL
    for (int t = 0; t < kTokenTiles; ++t) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        if constexpr (kFp8) {
          reduce[at(wk, t, i)] = __float_as_uint(acc[t][i]);
        } else {
          reduce[at(wk, t, i)] = per_group ? __float_as_uint(scaled[t][i])
                                           : static_cast<uint32_t>(acc[t][i]);
        }
      }
    }
    __syncthreads();
    if (wk == 0) {
      float const* w_scale = p.w_scale + int64_t(e) * p.n;  // per channel: [E, N]
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kTokenTiles; ++t) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) {
          int const n = i < 2 ? n_lo : n_hi;
          int64_t const row = t0 + t * 8 + 2 * q + (i & 1);
          if (n >= p.n || row >= t_end) {
            continue;
          }
          float const x_scale = p.x_scale[row];
          float v;
          if constexpr (kFp8) {
            float sum = 0.f;
            for (int w = 0; w < kWarpsK; ++w) {
              sum += __uint_as_float(reduce[at(w, t, i)]);
            }
            v = w_scale[n] * (x_scale * sum);  // as the CUTLASS epilogue
          } else if (per_group) {
            float sum = 0.f;
            for (int w = 0; w < kWarpsK; ++w) {
              sum += __uint_as_float(reduce[at(w, t, i)]);
            }
            v = x_scale * sum;
          } else {
            int32_t sum = 0;
            for (int w = 0; w < kWarpsK; ++w) {
              sum += static_cast<int32_t>(reduce[at(w, t, i)]);
            }
            v = w_scale[n] * (x_scale * static_cast<float>(sum));  // as the CUTLASS epilogue
          }
          p.c[row * p.n + n] = v;
        }
      }
    }
    __syncthreads();  // the reduction buffer is the next row tile's rings
  }
};

// Inline grouping: this CTA's expert, the slot-th non-empty one, from its own scan of the group
// list (scan_groups with the CTA's `Threads` threads; CTA (0, 0, 0) also writes rows_total).
// False when fewer experts than slots are non-empty.
template <int Threads>
__device__ bool find_expert(Params const& p, int slot, int& e, int64_t& start, int64_t& end) {
  __shared__ int found;
  __shared__ int64_t found_start, found_end;
  if (threadIdx.x == 0) {
    found = -1;
  }
  __syncthreads();
  bool const first = blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0;
  scan_groups<Threads>(p.group_list, p.cumsum, p.experts, p.m, first ? p.rows_total : nullptr,
                       nullptr, [&](int64_t i, int64_t s, int64_t t, int64_t index) {
                         if (t > s && index == slot) {
                           found = static_cast<int>(i), found_start = s, found_end = t;
                         }
                       });
  __syncthreads();
  e = found, start = found_start, end = found_end;
  return e >= 0;
}

// The CTA's (feature block, expert slot, token slot) in the grid (feature blocks, expert slots,
// token slots) that OwnSwigluQuant launches. kTokenSlotsFirst: numbered with the token slot
// fastest, so that the CTAs that read one weight tile for the row tiles of an expert run side by
// side and all but the first find it in L2; else as the grid's x, y, z.
template <bool kTokenSlotsFirst>
__device__ uint3 grouped_block() {
  if constexpr (kTokenSlotsFirst) {
    uint32_t const id = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    uint32_t const rest = id / gridDim.z;
    return make_uint3(rest % gridDim.x, rest / gridDim.x, id % gridDim.z);
  } else {
    return blockIdx;
  }
}

// The grouped GEMM's work split, shared by the family's own GEMM kernels (`Gemm`: this header's
// DirectGroupedGemm, wgmma_grouped_gemm.cuh's WgmmaGroupedGemm): a CTA (grouped_block) serves
// one feature block of an expert slot (the y-th non-empty expert, from group_work's lists or
// inline grouping) and a token slot walking that expert's row tiles of Gemm::kTokens rows z,
// z + Z, ... (`extra`: what the Gemm's row_tile takes besides, e.g. the wgmma kernel's TMA boxes)
template <class Gemm, class... Extra>
__device__ void grouped_row_tiles(Params const& p, char* smem, Extra const&... extra) {
  uint3 const block = grouped_block<Gemm::kTokenSlotsFirst>();
  int e;
  int64_t start, end;
  if (p.ends == nullptr) {
    if (!find_expert<Gemm::kThreads>(p, block.y, e, start, end)) {
      return;
    }
  } else {
    if (block.y >= *p.active_total) {
      return;  // fewer non-empty experts than slots
    }
    e = p.active[block.y];
    start = e > 0 ? p.ends[e - 1] : 0, end = p.ends[e];
  }
  for (int64_t t0 = start + int64_t(block.z) * Gemm::kTokens; t0 < end;
       t0 += int64_t(gridDim.z) * Gemm::kTokens) {
    Gemm::row_tile(p, smem, block.x, e, t0, t0 + Gemm::kTokens < end ? t0 + Gemm::kTokens : end,
                   extra...);
  }
}

template <class Config>
__global__ void __launch_bounds__(DirectGroupedGemm<Config>::kThreads)
    direct_grouped_gemm_kernel(Params const params) {
  extern __shared__ __align__(128) char smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  pdl_wait();  // group_work's lists (inline grouping: the group list from the kernel before)
  pdl_release();
  grouped_row_tiles<DirectGroupedGemm<Config>>(params, smem);
#endif
}

// The whole op behind the C ABI for the family's own GEMM kernels: group ends (or inline
// grouping), the grouped GEMM (`Gemm`, launched as `Kernel`: kThreads threads,
// launch_smem_bytes(CTAs, SMs) of dynamic shared memory, a CTA per kFeatures features of an
// expert slot and token slot), SwiGLU + quant.
template <class Gemm, auto Kernel>
struct OwnSwigluQuant {
  using K = Gemm;
  static constexpr size_t kAlign = 256;
  static constexpr size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  // The most CTAs a grid may have for inline grouping (see the header).
  static constexpr int64_t kInlineGroupingCtas = 512;

  // Expert slots: no more experts than rows can be non-empty.
  static int64_t expert_slots(gemmgen_moe_args const* p) { return p->m < p->experts ? p->m : p->experts; }

  // x's permuted copy's row (K rounded up to 128), for a Gemm that reads one.
  static int64_t permuted_row(gemmgen_moe_args const* p) { return (p->k + 127) / 128 * 128; }

  // Workspace: ends [E], active [min(E, M)], rows_total and active_total; for a fused Gemm
  // (kFused) the row maxima [M]; and, for a Gemm that reads x permuted (kPermutedTokens), the
  // copy [M, permuted_row].
  static size_t row_max_bytes(gemmgen_moe_args const* p) {
    return K::kFused ? round_up(sizeof(uint32_t) * static_cast<size_t>(p->m)) : 0;
  }
  static size_t workspace_size(gemmgen_moe_args const* p) {
    size_t const copy = K::kPermutedTokens ? round_up(static_cast<size_t>(p->m) *
                                                      static_cast<size_t>(permuted_row(p)))
                                           : 0;
    return round_up(sizeof(int64_t) * static_cast<size_t>(p->experts)) +
           round_up(sizeof(int32_t) * static_cast<size_t>(expert_slots(p))) +
           2 * round_up(sizeof(int64_t)) + row_max_bytes(p) + copy;
  }

  // A fused Gemm: whether its epilogue stores S (fp32 [M, N/2]) to stay in L2 for the quantize
  // pass, which then drops it once read (s_kept_in_l2, discard_lines).
  static bool s_in_l2(gemmgen_moe_args const* p) {
    return s_kept_in_l2(p->m * (p->n / 2) * int64_t(sizeof(float)), l2_cache_bytes());
  }

  // Token slots per expert slot: about twice the mean rows per non-empty expert (at most
  // min(E, M) of them), in row tiles, so that a skewed expert's tiles still spread over
  // several CTAs.
  static int64_t token_slots(int64_t m, int64_t experts) {
    int64_t const mean = (m + experts - 1) / experts;
    int64_t const wanted = 2 * ((mean + K::kTokens - 1) / K::kTokens);
    int64_t const most = (m + K::kTokens - 1) / K::kTokens;
    int64_t const slots = wanted < most ? wanted : most;
    return slots < 1 ? 1 : (slots > 65535 ? 65535 : slots);
  }

  static int run(gemmgen_moe_args const* p, void* workspace, size_t workspace_bytes, void* stream,
                 char const* kernel_name) {
    int const checked = check_call(p, workspace, workspace_bytes, workspace_size(p), kernel_name);
    if (checked != GEMMGEN_OK) {
      return checked;
    }
    if (p->m == 0) {
      return GEMMGEN_OK;  // no rows: nothing to compute or write
    }
    if (p->group_size < 0 || (p->group_size > 0 && p->group_size != p->k && !K::kInt4)) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "needs group_size 0 (per channel) or, with int4 weights, a group size");
    }
    int64_t const group = p->group_size > 0 ? p->group_size : p->k;
    if (p->k < 1 || p->n < 1 || p->k >= (int64_t(1) << 31) || p->n >= (int64_t(1) << 31) ||
        p->m >= (int64_t(1) << 31) || p->k % (K::kInt4 ? 32 : 16) != 0 || p->n % 8 != 0) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "needs K a positive multiple of 16 (int4 weights: 32), N a multiple of 8, M, N, "
                  "K below 2^31");
    }
    if (group != p->k && (group % K::kChunkK != 0 || p->k % group != 0)) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "needs a group size that is a multiple of 128 and divides K (or per channel)");
    }
    int const supported = K::check(p, kernel_name);
    if (supported != GEMMGEN_OK) {
      return supported;
    }
    int64_t const feature_blocks = (p->n + K::kFeatures - 1) / K::kFeatures;
    if (feature_blocks > 2147483647 || p->experts > 65535) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "N or E too large for the launch grid");
    }
    static std::atomic<bool> raised[detail::kMaxDevices] = {};
    // the largest dynamic shared memory a launch asks for (K::launch_smem_bytes)
    static_assert(K::kSmemSmallGrid >= K::kSmemBytes);
    int const allowed = allow_shared_memory_once(Kernel, K::kSmemSmallGrid, raised, kernel_name);
    if (allowed != GEMMGEN_OK) {
      return allowed;
    }
    int64_t const slots = expert_slots(p);
    char* carved = static_cast<char*>(workspace);
    auto* ends = reinterpret_cast<int64_t*>(carved);
    carved += round_up(sizeof(int64_t) * static_cast<size_t>(p->experts));
    auto* active = reinterpret_cast<int32_t*>(carved);
    carved += round_up(sizeof(int32_t) * static_cast<size_t>(slots));
    auto* rows_total = reinterpret_cast<int64_t*>(carved);
    auto* active_total = reinterpret_cast<int64_t*>(carved + round_up(sizeof(int64_t)));
    carved += 2 * round_up(sizeof(int64_t));
    // a fused Gemm's row maxima, zeroed by the blocks of group_work after its first
    auto* row_max = K::kFused ? reinterpret_cast<uint32_t*>(carved) : nullptr;
    int64_t const zeroed = K::kFused ? p->m : 0;
    int64_t const zero_blocks = setup_zero_blocks(zeroed);
    bool const keep_s = K::kFused && s_in_l2(p);  // S stored evict_last, dropped once quantized
    carved += row_max_bytes(p);
    auto const* x = static_cast<int8_t const*>(p->x);
    int x_stride = static_cast<int>(p->k);
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    bool const pdl = (p->launch_flags & GEMMGEN_LAUNCH_PDL) != 0;
    dim3 const grid(static_cast<unsigned>(feature_blocks), static_cast<unsigned>(slots),
                    static_cast<unsigned>(token_slots(p->m, slots)));
    // (a fused Gemm's row maxima need a launch before it: the permutation's, or group_work's)
    bool const inline_grouping = (!K::kFused || K::kPermutedTokens) &&
                                 int64_t(grid.x) * grid.y * grid.z <= kInlineGroupingCtas;
    if constexpr (K::kPermutedTokens) {  // the permutation, with group_work unless inline
      auto* x_perm = reinterpret_cast<int8_t*>(carved);
      x_stride = static_cast<int>(permuted_row(p));
      int64_t const work = p->m * (x_stride / 8);
      int const blocks = static_cast<int>(work / kSetupThreads + 1 < 4096
                                              ? work / kSetupThreads + 1 : 4096);
      cutlass::FastDivmodU64 const by_groups(static_cast<uint64_t>(x_stride / 8));
      if (inline_grouping) {
        launch_maybe_pdl(permute_tokens_for_mma, dim3(blocks), dim3(kSetupThreads), 0,
                         cuda_stream, pdl, x, x_perm, p->m, static_cast<int>(p->k), x_stride,
                         by_groups, row_max, zeroed);
      } else {
        launch_maybe_pdl(group_work_and_permute, dim3(blocks + 1), dim3(kSetupThreads), 0,
                         cuda_stream, pdl, p->group_list, p->group_list_type, p->experts, p->m,
                         ends, active, rows_total, active_total, x, x_perm,
                         static_cast<int>(p->k), x_stride, by_groups, row_max, zeroed);
      }
      x = x_perm;
    } else if (!inline_grouping) {
      launch_maybe_pdl(group_work, dim3(static_cast<unsigned>(1 + zero_blocks)),
                       dim3(kSetupThreads), 0, cuda_stream, pdl, p->group_list,
                       p->group_list_type, p->experts, p->m, ends, active, rows_total,
                       active_total, row_max, zeroed);
    }
    Params const params{x, static_cast<unsigned char const*>(p->w),
                        p->w_scale, p->x_scale, inline_grouping ? nullptr : ends, active,
                        active_total, p->group_list, rows_total, p->experts, p->group_list_type,
                        static_cast<float*>(p->c),
                        static_cast<int>(p->m), static_cast<int>(p->n), static_cast<int>(p->k),
                        static_cast<int>(p->k / group),
                        static_cast<int>((group + K::kChunkK - 1) / K::kChunkK), x_stride,
                        row_max, keep_s};
    int const sms = hardware_info().sm_count;
    int const smem = K::launch_smem_bytes(int64_t(grid.x) * grid.y * grid.z, sms);
    if constexpr (K::kTmaMaps) {  // the kernel's TMA boxes over this call's tensors
      typename K::Maps maps;
      int const described = K::make_maps(p, x, x_stride, maps, kernel_name);
      if (described != GEMMGEN_OK) {
        return described;
      }
      launch_maybe_pdl(Kernel, grid, dim3(K::kThreads), smem, cuda_stream, pdl, params, maps);
    } else {
      launch_maybe_pdl(Kernel, grid, dim3(K::kThreads), smem, cuda_stream, pdl, params);
    }
    using ElementQ = typename K::ElementQ;
    cudaError_t launched =
        K::kFused ? launch_quantize_rows(static_cast<float const*>(p->c), row_max,
                                         static_cast<ElementQ*>(p->q), p->q_scale, p->m, p->n / 2,
                                         static_cast<int64_t const*>(rows_total), cuda_stream, pdl,
                                         sms, keep_s)
                  : launch_swiglu_quant(static_cast<float const*>(p->c),
                                        static_cast<ElementQ*>(p->q), p->q_scale, p->m, p->n / 2,
                                        static_cast<int64_t const*>(rows_total), cuda_stream, pdl,
                                        sms);
    if (launched == cudaSuccess) {
      launched = cudaGetLastError();  // the launches before it
    }
    if (launched != cudaSuccess) {
      return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
    }
    return GEMMGEN_OK;
  }
};

template <class Config>
using DirectSwigluQuant = OwnSwigluQuant<DirectGroupedGemm<Config>, direct_grouped_gemm_kernel<Config>>;

}  // namespace gemmgen::moe::direct
