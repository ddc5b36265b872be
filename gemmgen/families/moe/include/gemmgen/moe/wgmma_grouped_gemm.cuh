/*
 * gemmgen/moe/wgmma_grouped_gemm.cuh — the MoE family's sm90a "wgmma" kernel: the grouped GEMM of
 * grouped_matmul_swiglu_quant for A8W4 (int8 activations, int4 weights; per-channel or per-group
 * weight scales) on register-sourced int8 wgmma, for tens to hundreds of tokens per expert. It
 * runs inside the direct kernels' op (direct_grouped_gemm.cuh: group_work or inline grouping,
 * this GEMM writing C in fp32, SwiGLU + quant) and reads the same packed weight as the family's
 * other kernels of its scales (packing.py: [E, N, K/2], two int4 a byte; per channel even k in
 * the low nibble, per group the MMA fragment order), so dispatch can pick it per shape.
 *
 * Why. The direct kernel runs mma.sync, about half wgmma's rate on Hopper: past ~16 tokens an
 * expert its MMAs, not the weight read, set the time (A8W4 with per-group scales measured 2-12x
 * the int4 weight-read floor at 64-1024 tokens per expert, session 11). CUTLASS's mixed-input
 * mainloop applies one scale per output channel only. Here, per expert i:
 *   C_iᵀ[features, tokens] = W_i[features, K] · X_iᵀ[K, tokens]
 * A CTA owns 64·WarpGroups features (each warpgroup 64: the wgmma's M) and Tokens rows of one
 * expert (the wgmma's N) over all of K. K streams in chunks of 128 through a ring of Stages
 * chunks: the weights (64 bytes a feature), the tokens (128 bytes a row, XOR-swizzled in 16-byte
 * pieces by row % 8: wgmma's 128-byte swizzle, K-major) and, with per-group scales, the chunk's
 * group's scales of the CTA's features. Config::Tma chooses what fills it: every thread's
 * cp.async copies, or the TMA (thread 0 queues three boxes a chunk on the slot's mbarrier, the
 * boxes encoded on the host each call: make_maps). On the H200 the TMA ran 1.06-1.14x at
 * 1024-4096 tokens and 5-30% slower at 1-64 (the kernel there waits on its weights, and the
 * TMA's round trip is the longer), so the manifest has both (session 50).
 *
 * Registers. wgmma's int8 A fragment gives lane (g, q) of warp w rows 16w+g and 16w+g+8 and, per
 * 32-K step j, the slots 4q .. 4q+3 and 16+4q .. 16+4q+3. The lane reads its 16 bytes of each row
 * of the chunk (two 16-byte loads), and word j gives step j's two registers with a shift and a
 * mask (low nibbles) and a mask (high nibbles): 3 instructions per 8 values, each nibble in its
 * byte's high half, 16·w, exact in int8. Which k a slot holds depends on the weight's order:
 * per group the MMA order (byte 16q + 4j + i of a row's chunk holds k = 32j + 4q + i and
 * k + 16: the slots' own k, tokens as they are); per channel CUTLASS's order (even k low: word j
 * holds k = 32q + 8j .. + 7, so slot 4q + i holds k = 32q + 8j + 2i and slot 16 + 4q + i the
 * next), and the op gives the kernel x permuted into that order once a call
 * (direct::permute_tokens_for_mma, [M, K rounded up to 128] in the workspace). The int32 sums
 * are 16x the true ones and are shifted back exactly (|16·Σ| < 2^31 for K < 130000).
 *
 * Scales. Per channel: one int32 accumulator set over K; C = w_scale · (x_scale · Σ) in float32,
 * as the CUTLASS kernels' epilogue. Per group (a multiple of 128 dividing K): the group's first
 * wgmma starts from zero (wgmma's scale-d = 0), and after its last chunk's wgmmas retire
 * (wait_group 0: ptxas serializes every wgmma of a loop that reads an accumulator behind a
 * wait_group 1, so the exact sum is read only once nothing is in flight) it is promoted:
 * F += s_g · float(Σ_g), a conversion and a fused multiply-add a value; C = x_scale · F. The
 * tensor cores idle for that promotion only.
 *
 * Fused (Config::Fused): the epilogue does SwiGLU itself (fused_epilogue: act and gate of a pair
 * sit in lanes g and g ^ 1), stores S [M, N/2] in fp32 and reduces each token's max |S| over
 * the CTA's warps in shared memory, then over the N tiles by one global atomicMax a token and
 * tile into maxima zeroed by the launch before; the op's pass is then quantize_rows. Against the
 * unfused twin on the H200: 1.02-1.06x at 16-1024 tokens of Mixtral-8x7B (C of 14336-wide rows
 * no longer written and re-read in fp32), 1.01-1.05x at 64-256 tokens of the narrower layers,
 * slower at 1 token and 1024 (benchmarks/RESULTS.md, session 57).
 *
 * Pipeline. wgmma reads its A registers while it runs, and a register it reads may be rewritten
 * only after a wait_group retires it (ptxas does not check this across loop iterations), so
 * chunks alternate between two fragment sets, the loop body written twice: chunk i's four
 * wgmmas are one commit group; wait_group 1 retires chunk i − 1's, and the next chunk is
 * converted into its fragment set while the tensor cores run chunk i. Before that conversion,
 * chunk i + 1's slot is waited for (cp.async: its copies, a proxy fence, a CTA barrier; TMA: its
 * mbarrier's phase, then a proxy fence and a CTA barrier) and chunk i + Stages − 1 queued into
 * the slot of chunk i − 1, retired by then in both warpgroups. A ring of 7 or 8
 * chunks waits and queues every second chunk (`SyncChunks` 2, as the mixed family's wgmma kernel:
 * one barrier for two chunks, one chunk less in flight): the per-group [64, 16] tile with 8
 * chunks (decode) measured 3% faster on the H200, 0.5% on the H100 (session 22).
 */
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <tuple>
#include <utility>

#include "cute/arch/copy_sm80.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma_ext.hpp"  // the wgmmas of N = 48, 80, 112 (Int8RsWgmma)
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"

#include "gemmgen/c_api.h"
#include "gemmgen/moe/direct_grouped_gemm.cuh"
#include "gemmgen/moe/moe_args.h"
#include "gemmgen/runtime_support.hpp"
#include "gemmgen/shared_memory.cuh"

namespace gemmgen::moe::wgmma {

using direct::Params;
using smem::cp_async16;
using smem::lds128;
using smem::lds32;

template <class ElementW_, bool PerGroup_, int WarpGroups_, int Tokens_, int Stages_,
          bool Tma_ = false, bool Fused_ = false, int SyncChunks_ = (Stages_ >= 7 ? 2 : 1)>
struct WgmmaConfig {
  using ElementW = ElementW_;  // cutlass::int4b_t; activations are int8
  static constexpr bool PerGroup = PerGroup_;     // weight scales per group of K (else per channel)
  static constexpr int WarpGroups = WarpGroups_;  // 64 features each
  static constexpr int Tokens = Tokens_;          // the wgmma's N: an expert's rows a tile
  static constexpr int Stages = Stages_;
  static constexpr bool Tma = Tma_;  // the ring filled by the TMA (else by every thread's cp.async)
  static constexpr bool Fused = Fused_;  // SwiGLU + the row maxima in the epilogue (S, not C)
  static constexpr int SyncChunks = SyncChunks_;  // chunks made ready by one ring barrier
};

template <class Config>
struct WgmmaGroupedGemm {
  static_assert(cute::is_same_v<typename Config::ElementW, cutlass::int4b_t>,
                "the wgmma kernel reads int4 weights");
  static constexpr bool kInt4 = true;
  using ElementQ = int8_t;  // x's and q's type (A8W4)
  static constexpr bool kPerGroup = Config::PerGroup;
  static constexpr int kWarpGroups = Config::WarpGroups;
  static constexpr int kTokens = Config::Tokens;
  static constexpr int kStages = Config::Stages;
  static constexpr int kSyncChunks = Config::SyncChunks;
  static constexpr bool kTma = Config::Tma;
  static constexpr bool kFused = Config::Fused;
  static_assert(kWarpGroups == 1 || kWarpGroups == 2, "one or two warpgroups a CTA");
  static_assert(kSyncChunks == 1 || kSyncChunks == 2, "one or two chunks a ring barrier");
  static_assert(kStages >= 2 * kSyncChunks + 1 && kStages <= 8,
                "a ring of 3 (5 with two chunks a barrier) to 8 chunks");

  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kFeatures = 64 * kWarpGroups;  // output features a CTA
  // An expert's row tiles of one feature block run side by side (grouped_block)
  static constexpr bool kTokenSlotsFirst = true;
  // Per channel the weights are in CUTLASS's nibble order: the op gives this kernel x permuted
  // (direct::permute_tokens_for_mma) so that the same cheap conversion serves both orders.
  static constexpr bool kPermutedTokens = !kPerGroup;
  static constexpr bool kTmaMaps = true;  // the kernel takes the call's TMA boxes (make_maps)
  static constexpr int kChunkK = 128;
  static constexpr int kSteps = kChunkK / 32;          // wgmmas a chunk (K 32 each)
  static constexpr int kWeightRowBytes = kChunkK / 2;  // 64
  static constexpr int kWeightStageBytes = kFeatures * kWeightRowBytes;
  static constexpr int kActRowBytes = kChunkK;  // one 128-byte swizzle row a token
  static constexpr int kActStageBytes = kTokens * kActRowBytes;
  static constexpr int kScaleStageBytes = kPerGroup ? kFeatures * 4 : 0;
  // The ring's slots in three regions: every slot's tokens (each 1024-aligned: the swizzle's
  // period), then every slot's weights, then every slot's scales. Slots of all three in one
  // 1024-aligned piece took 57 KB for the per-group [64, 16] ring of 8 (three CTAs an SM), the
  // regions 51 KB (four).
  static constexpr int kActSlotBytes = (kActStageBytes + 1023) / 1024 * 1024;
  static constexpr int kWeightsAt = kStages * kActSlotBytes;
  static constexpr int kScalesAt = kWeightsAt + kStages * kWeightStageBytes;
  static constexpr int kBarriersAt = kScalesAt + kStages * kScaleStageBytes;  // a slot's mbarrier
  static constexpr uint32_t kChunkBytes = kWeightStageBytes + kActStageBytes + kScaleStageBytes;
  // Chunks queued ahead of the one converted: at the barrier before chunk i every warpgroup has
  // retired chunk i - 2, whose slot chunk i + kAhead + kSyncChunks - 1 reuses at the latest.
  static constexpr int kAhead = kStages - 1 - kSyncChunks;
  // + 1024: the ring starts at the first 1024-byte boundary of the dynamic shared memory
  static constexpr int kSmemBytes = kBarriersAt + (kTma ? kStages * 8 : 0) + 1024;
  // A grid of up to three CTAs an SM launches with its dynamic shared memory padded so that
  // three fit an SM, not four: at one token of DeepSeek-V2-Lite (264 CTAs of the per-group
  // [64, 16]) four an SM measured 11.7 µs against three's 10.5 (H200, in a CUDA graph with PDL;
  // likely the CTAs bunching onto fewer SMs, not profiled), while grids of thousands gain from
  // the fourth (16-64 tokens 4-9%). H100 / H200: 228 KB an SM, 1 KB of it reserved a CTA (the
  // scan's static shared memory, ~3 KB, only makes four fit less; three still fit).
  static constexpr int kSmemThreeAnSm = 228 * 1024 / 4 - 1024 + 1;  // four do not fit
  static constexpr int kSmemSmallGrid = kSmemBytes > kSmemThreeAnSm ? kSmemBytes : kSmemThreeAnSm;
  static int launch_smem_bytes(int64_t ctas, int sms) {
    return ctas <= 3 * int64_t(sms) ? kSmemSmallGrid : kSmemBytes;
  }
  static constexpr int kAccRegs = kTokens / 2;  // 64 × Tokens int32 over a warpgroup's 128 threads
  // Two CTAs an SM (at most 128 registers a thread with two warpgroups) up to 80 tokens a tile
  // per channel, 64 per group (its float32 sums beside the accumulators: measured 441 vs 563 µs
  // at 64 tokens, Mixtral, 256 tokens, H100, over one CTA an SM). Per group one warpgroup of 80
  // tokens runs three CTAs an SM (at most 170 registers a thread, no spill with a ring of 4):
  // Mixtral-8x7B at 256 tokens 265 vs the two-warpgroup [128, 64]'s 321 µs (H200, session 48).
  static constexpr int kMinBlocks =
      kPerGroup && kWarpGroups == 1 && kTokens > 64 ? 3 : kTokens <= (kPerGroup ? 64 : 80) ? 2 : 1;
  static constexpr int kWeightCopies = kWeightStageBytes / 16 / kThreads;  // 2 a thread and chunk
  static constexpr int kActSegs = kActStageBytes / 16;
  static constexpr int kActCopies = (kActSegs + kThreads - 1) / kThreads;
  static constexpr int kScaleSegs = kScaleStageBytes / 16;  // copied by threads 0 .. segs − 1
  static_assert(kWeightStageBytes / 16 % kThreads == 0 && kScaleSegs <= kThreads);

  // With kTma, the TMA boxes of a chunk: the weights' [kFeatures rows of 64 bytes] of [E, N, K/2]
  // bytes, the tokens' [Tokens rows of 128 bytes] of x [M, x_stride] in 128-byte swizzle and, per
  // group, the chunk's group's [kFeatures] scales of w_scale [E, groups, N]: encoded on the host
  // for each call (make_maps) and passed by value to the kernel (zeroed and unread without).
  struct Maps {
    CUtensorMap w, x, s;
  };

  // The int8 wgmma of N = Tokens, A (the weights) from registers. Named, not chosen by CUTE's
  // rs_op_selector: CUTE declares (and the selector offers) N = 48, 80 and 112 only with
  // CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, which would change CUTLASS's own choices too; the
  // header of those shapes stands alone.
  static_assert(kTokens % 16 == 0 && kTokens >= 16 && kTokens <= 128,
                "an expert's rows a tile: 16, 32, 48, ... 128 (the int8 wgmma's N)");
  using Mma = std::tuple_element_t<  // N = 16, 32, ... 128
      kTokens / 16 - 1,
      std::tuple<cute::SM90::GMMA::MMA_64x16x32_S32S8S8_RS_TN,
                 cute::SM90::GMMA::MMA_64x32x32_S32S8S8_RS_TN,
                 cute::SM90::GMMA::MMA_64x48x32_S32S8S8_RS_TN,
                 cute::SM90::GMMA::MMA_64x64x32_S32S8S8_RS_TN,
                 cute::SM90::GMMA::MMA_64x80x32_S32S8S8_RS_TN,
                 cute::SM90::GMMA::MMA_64x96x32_S32S8S8_RS_TN,
                 cute::SM90::GMMA::MMA_64x112x32_S32S8S8_RS_TN,
                 cute::SM90::GMMA::MMA_64x128x32_S32S8S8_RS_TN>>;
  static_assert(sizeof(typename Mma::CRegisters) == kAccRegs * sizeof(uint32_t));

  template <size_t... I>
  static __device__ void mma(uint32_t const (&a)[4], uint64_t desc, uint32_t (&acc)[kAccRegs],
                             cute::SM90::GMMA::ScaleOut scale_out, std::index_sequence<I...>) {
    Mma::fma(a[0], a[1], a[2], a[3], desc, acc[I]..., scale_out);
  }

  static __device__ void fence(uint32_t (&acc)[kAccRegs]) {
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kAccRegs; ++r) {
      cute::warpgroup_fence_operand(acc[r]);
    }
  }

  // What this kernel needs beyond the op's common checks (OwnSwigluQuant::run).
  static int check(gemmgen_moe_args const* p, char const* kernel_name) {
    if (!kPerGroup && p->group_size > 0 && p->group_size != p->k) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "is built for per-channel weight scales (group_size 0); use a kernel of the "
                  "per-group family");
    }
    if (kPerGroup && p->group_size <= 0) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "is built for per-group weight scales (int4 in the MMA order, packing.py); use "
                  "a kernel of the per-channel family");
    }
    if (kPerGroup && p->k % kChunkK != 0) {  // the packer's groups are multiples of 128
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "needs K a multiple of 128 with per-group scales (it copies whole 128-K chunks)");
    }
    if (kPerGroup && reinterpret_cast<uintptr_t>(p->w_scale) % 16 != 0) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "needs 16-byte aligned w_scale (16-byte copies of 4 features' scales)");
    }
    return GEMMGEN_OK;
  }

  // The call's TMA boxes (Maps) over the packed weight, x as the kernel reads it (`x`, rows of
  // `x_stride` bytes: the user's x, or per channel its permuted copy) and, per group, w_scale.
  // Past the tensors' ends (weight rows past N, token rows past M, per channel k past K) the
  // boxes are zero-filled.
  static int make_maps(gemmgen_moe_args const* p, void const* x, int64_t x_stride, Maps& maps,
                       char const* kernel_name) {
    maps = Maps{};
    if constexpr (!kTma) {  // cp.async copies: the kernel takes (and reads) no boxes
      return GEMMGEN_OK;
    } else {
      auto encode = [](CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                       void const* base, cuuint64_t const* dims, cuuint64_t const* strides,
                       cuuint32_t const* box, CUtensorMapSwizzle swizzle) {
        cuuint32_t const unit[3] = {1, 1, 1};
        return cuTensorMapEncodeTiled(map, type, rank, const_cast<void*>(base), dims, strides, box,
                                      unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
      };
      auto const row_bytes = static_cast<cuuint64_t>(p->k / 2), n = static_cast<cuuint64_t>(p->n);
      cuuint64_t const w_dims[3] = {row_bytes, n, static_cast<cuuint64_t>(p->experts)};
      cuuint64_t const w_strides[2] = {row_bytes, row_bytes * n};
      cuuint32_t const w_box[3] = {kWeightRowBytes, kFeatures, 1};
      cuuint64_t const x_dims[2] = {static_cast<cuuint64_t>(x_stride),
                                    static_cast<cuuint64_t>(p->m)};
      cuuint64_t const x_strides[1] = {static_cast<cuuint64_t>(x_stride)};
      cuuint32_t const x_box[2] = {kChunkK, kTokens};
      bool ok = encode(&maps.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, p->w, w_dims, w_strides, w_box,
                       CU_TENSOR_MAP_SWIZZLE_NONE) &&
                encode(&maps.x, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, x, x_dims, x_strides, x_box,
                       CU_TENSOR_MAP_SWIZZLE_128B);
      if (kPerGroup && ok) {
        auto const groups = static_cast<cuuint64_t>(p->k / p->group_size);
        cuuint64_t const s_dims[3] = {n, groups, static_cast<cuuint64_t>(p->experts)};
        cuuint64_t const s_strides[2] = {n * 4, groups * n * 4};
        cuuint32_t const s_box[3] = {kFeatures, 1, 1};
        ok = encode(&maps.s, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, p->w_scale, s_dims, s_strides,
                    s_box, CU_TENSOR_MAP_SWIZZLE_NONE);
      }
      if (!ok) {
        return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                    "could not describe the weights, x or w_scale to the TMA "
                    "(cuTensorMapEncodeTiled failed: each needs a 16-byte aligned start)");
      }
      return GEMMGEN_OK;
    }
  }

  // The fused epilogue (kFused): S = swish(act) · gate into p.c as [M, N/2] float32, and each
  // token's max |S| over the lane's pairs into `token_max` (the tile's tokens, shared memory).
  // The packed weight interleaves act and gate (feature 2j act j, 2j + 1 gate j: packing.py),
  // so lanes g and g ^ 1 (lane ^ 4) hold a pair's two features for the same tokens: of each two
  // registers (tokens 2q and 2q + 1 of a token slot) the even lane takes the first token and the
  // odd lane the second, each sending its partner the value it lacks (one shuffle, two outputs).
  // C's values are the unfused store's and S is swiglu() as the SwiGLU pass computes it, so q
  // and q_scale equal the unfused kernel's bit for bit. A lane's two stores of its token (pairs
  // g / 2 and g / 2 + 4 of its warp's 8) and those of the three lanes of the same q and parity
  // fill one whole 32-byte sector. The maxima:
  // per lane over its two pairs, over the four lanes of a token (xor 8, 16), then one shared
  // atomicMax a token and warp; the caller adds the tile's to the rows' in global memory.
  template <class Value>
  static __device__ void fused_epilogue(Params const& p, int n_lo, int64_t t0, int64_t t_end,
                                        int g, int q, Value const& value, uint32_t* token_max) {
    bool const odd = (g & 1) != 0;
    int64_t const n_half = p.n / 2;
    uint64_t const policy = p.keep_s ? l2_policy_evict_last() : l2_policy_evict_normal();
    CUTLASS_PRAGMA_UNROLL
    for (int u = 0; u < kAccRegs / 4; ++u) {  // token slot u: tokens 8u + 2q and 8u + 2q + 1
      int64_t const first = t0 + 8 * u + 2 * q;
      float const xs0 = first < t_end ? p.x_scale[first] : 0.f;
      float const xs1 = first + 1 < t_end ? p.x_scale[first + 1] : 0.f;
      int64_t const row = first + (odd ? 1 : 0);  // this lane's token
      uint32_t held = 0u;
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < 2; ++h) {  // features n_lo + 8h (act or gate) and its partner's
        int const n = n_lo + 8 * h;
        bool const inside = n < p.n;  // N is even: both of a pair or neither
        float const v0 = inside ? value(4 * u + 2 * h, n, xs0) : 0.f;
        float const v1 = inside ? value(4 * u + 2 * h + 1, n, xs1) : 0.f;
        float const got = __shfl_xor_sync(0xffffffffu, odd ? v0 : v1, 4);
        if (inside && row < t_end) {
          float const s = odd ? swiglu(got, v1) : swiglu(v0, got);
          store_s1(p.c + row * n_half + (n >> 1), s, policy);
          held = max(held, abs_bits(s));
        }
      }
      held = max(held, __shfl_xor_sync(0xffffffffu, held, 8));
      held = max(held, __shfl_xor_sync(0xffffffffu, held, 16));
      if (g < 2 && held != 0u) {
        atomicMax(token_max + 8 * u + 2 * q + (odd ? 1 : 0), held);
      }
    }
  }

  // One row tile [t0, t_end) of expert `e` for this CTA's features: C[rows, features] (kFused:
  // S[rows, features / 2] and the rows' maxima).
  static __device__ void row_tile(Params const& p, char* smem_raw, int feature_block, int e,
                                  int64_t t0, int64_t t_end, Maps const& maps) {
    int const tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    int const g = lane / 4, q = lane % 4;
    int const n0 = feature_block * kFeatures;
    // kFused: the tile's max |S| a token, over the CTA's warps. Thread t < kTokens zeroes entry
    // t here and reads it after the tile's end barrier (so after every warp's atomics): its read
    // of the last tile's precedes this in program order, and the mainloop's chunk barriers (one
    // a chunk or two, K > 0) order this before any warp's atomics of this tile.
    __shared__ uint32_t token_max[kFused ? kTokens : 1];
    if constexpr (kFused) {
      if (tid < kTokens) {
        token_max[tid] = 0u;
      }
    }
    uint32_t const ring = (cute::cast_smem_ptr_to_uint(smem_raw) + 1023u) & ~1023u;
    int const count = (p.k + kChunkK - 1) / kChunkK;
    int64_t const row_bytes = p.k / 2;
    unsigned char const* w_expert = p.w + int64_t(e) * p.n * row_bytes;
    uint32_t const barriers = ring + kBarriersAt;  // kTma: slot s's mbarrier at + 8 s
    if constexpr (kTma) {
      if (tid == 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int slot = 0; slot < kStages; ++slot) {
          smem::mbarrier_init(barriers + 8 * slot);
        }
      }
      __syncthreads();
    }

    // cp.async: this thread's copies a chunk (the sources advance a chunk a call of `issue`):
    // weight rows past N, token rows past the tile and 16-byte pieces past K are zero-filled from
    // a source that exists. (Unused with kTma: the compiler drops them.)
    unsigned char const* w_src[kWeightCopies];
    uint32_t w_dst[kWeightCopies];
    int w_k[kWeightCopies];
    bool w_ok[kWeightCopies];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kWeightCopies; ++j) {
      int const i = tid + kThreads * j, row = i / 4, seg = i % 4;
      w_ok[j] = n0 + row < p.n;
      w_k[j] = seg * 32;
      w_src[j] = w_expert + (w_ok[j] ? int64_t(n0 + row) * row_bytes + seg * 16 : 0);
      w_dst[j] = kWeightsAt + row * kWeightRowBytes + seg * 16;
    }
    unsigned char const* a_src[kActCopies];
    uint32_t a_dst[kActCopies];
    int a_k[kActCopies];
    bool a_ok[kActCopies], a_mine[kActCopies];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kActCopies; ++j) {
      int const i = tid + kThreads * j;
      a_mine[j] = kActSegs % kThreads == 0 || i < kActSegs;  // every thread's, or a check
      int const row = (a_mine[j] ? i : 0) / 8, seg = i % 8;
      a_ok[j] = a_mine[j] && t0 + row < t_end;
      a_k[j] = seg * 16;
      a_src[j] = reinterpret_cast<unsigned char const*>(p.x) +
                 (a_ok[j] ? (t0 + row) * p.x_stride + seg * 16 : 0);
      a_dst[j] = row * kActRowBytes + ((seg ^ (row & 7)) * 16);
    }
    // Per group: 4 features' scales of the queued chunk's group (threads below kScaleSegs; N is
    // a multiple of 8, so a piece is wholly inside N or past it).
    bool const s_ok = kPerGroup && tid < kScaleSegs && n0 + 4 * tid < p.n;
    float const* s_src = p.w_scale + (s_ok ? int64_t(e) * p.groups * p.n + n0 + 4 * tid : 0);
    uint32_t const s_dst = kScalesAt + 16 * tid;
    int s_left = p.chunks_per_group;  // chunks queued before the scales move to the next group
    int issued = 0, issued_group = 0;
    // The queued chunk's copies into ring slot `slot`. kTma: thread 0 issues three boxes, the
    // weights, the tokens (rows from t0 on: those of the next expert, or zeros past M, fill a
    // short tile's unused wgmma columns, which are never stored) and, per group, the group's
    // scales, all completing on the slot's mbarrier.
    auto issue = [&](int slot) {
      int const dk = issued * kChunkK;
      int64_t const dw = int64_t(issued) * kWeightRowBytes;
      if constexpr (kTma) {
        if (tid == 0) {
          uint32_t const bar = barriers + 8 * slot;
          smem::mbarrier_expect_tx(bar, kChunkBytes);
          smem::tma_load_3d(ring + kWeightsAt + slot * kWeightStageBytes, &maps.w, bar,
                            issued * kWeightRowBytes, n0, e);
          smem::tma_load_2d(ring + slot * kActSlotBytes, &maps.x, bar, dk, static_cast<int>(t0));
          if constexpr (kPerGroup) {
            smem::tma_load_3d(ring + kScalesAt + slot * kScaleStageBytes, &maps.s, bar, n0,
                              issued_group, e);
          }
        }
      } else if constexpr (kPerGroup) {
        // K is a whole number of chunks (check): no piece is past K, so a copy is an address add
        // and the copy, zero-filled only for a weight row past N or a token row past the tile
        // (the K checks and their source selects measured 3-4% slower, H200, session 49; per
        // channel, which may end K in a partial chunk, dropping them only where K is whole
        // measured level, so it keeps them)
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kWeightCopies; ++j) {
          cp_async16(ring + slot * kWeightStageBytes + w_dst[j], w_src[j] + dw, w_ok[j] ? 16u : 0u);
        }
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kActCopies; ++j) {
          if (a_mine[j]) {
            cp_async16(ring + slot * kActSlotBytes + a_dst[j], a_src[j] + dk, a_ok[j] ? 16u : 0u);
          }
        }
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kWeightCopies; ++j) {
          bool const ok = w_ok[j] && w_k[j] + dk < p.k;
          cp_async16(ring + slot * kWeightStageBytes + w_dst[j], ok ? w_src[j] + dw : w_src[j],
                     ok ? 16u : 0u);
        }
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kActCopies; ++j) {
          if (a_mine[j]) {
            bool const ok = a_ok[j] && a_k[j] + dk < p.x_stride;
            cp_async16(ring + slot * kActSlotBytes + a_dst[j], ok ? a_src[j] + dk : a_src[j],
                       ok ? 16u : 0u);
          }
        }
      }
      if constexpr (kPerGroup) {
        if (!kTma && tid < kScaleSegs) {
          cp_async16(ring + slot * kScaleStageBytes + s_dst, s_src, s_ok ? 16u : 0u);
        }
        if (--s_left == 0) {
          s_left = p.chunks_per_group;
          s_src += s_ok ? p.n : 0;
          ++issued_group;
        }
      }
      ++issued;
    };
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kAhead; ++s) {
      if (s < count) {
        issue(s);
      }
      if constexpr (!kTma) {
        cute::cp_async_fence();
      }
    }

    int const row_lo = 16 * warp + g;  // this lane's rows: row_lo and row_lo + 8 (tile-local)
    uint32_t const weight_lane = ring + kWeightsAt + row_lo * kWeightRowBytes;
    uint32_t const scale_lane = ring + kScalesAt + row_lo * 4;

    // acc: the wgmma accumulators (per channel over all of K; per group over the group, from
    // zero at its first chunk). scaled: per group, Σ over finished groups of s_g · Σ_g.
    uint32_t acc[kAccRegs];
    float scaled[kPerGroup ? kAccRegs : 1];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kAccRegs; ++r) {
      acc[r] = 0u;
      if constexpr (kPerGroup) {
        scaled[r] = 0.f;
      }
    }
    fence(acc);

    // Per group, and per channel up to 32 tokens a tile, the loop is unrolled over kUnroll
    // chunks, a whole number of rings and of fragment-set pairs: chunk u of an unrolled round
    // uses ring slot u % kStages and fragment set u % 2, so every shared-memory address and
    // descriptor in it is a constant offset from the ring (as in the mixed family's wgmma
    // kernel: 37 -> 31 instructions a wgmma for [64, 16]). Per group at 64 and 80 tokens that
    // is 3.6% and 1.8% faster (the 80-token tile: 211 instructions a chunk and warp against 238
    // rolled; H200, session 49; 0.5-1.2% slower in session 22, before the copies lost their K
    // checks); per channel at 64 and 80 tokens the loop body stays two chunks with the slots
    // counted at run time (unrolled over 6 or 10 chunks: 1.1% slower and level).
    constexpr bool kUnrolled = kPerGroup || kTokens <= 32;
    constexpr int kUnroll = !kUnrolled ? 2 : kStages % 2 == 0 ? kStages : 2 * kStages;
    static_assert(kUnroll % kSyncChunks == 0, "a round ends on a barrier chunk");
    int read_slot = 0, write_slot = kAhead;  // the rolled loop's slots (of the next chunk)
    uint32_t phases = 0;  // bit s: the parity of slot s's next phase to wait for
    uint64_t const desc_ring = smem::sw128_k_major_descriptor(ring);  // slot 0, step 0
    // Chunk i at position u of a round: every kSyncChunks chunks wait for the slots of chunks
    // i .. i + kSyncChunks - 1 (one barrier for them all) and queue chunks i + kAhead .. (a
    // commit group each). Then convert chunk i's fragments into `a` and (per group) read its
    // rows' scales into `scale`.
    auto load_chunk = [&](int i, int u, uint32_t (&a)[kSteps][4], float (&scale)[2]) {
      if (kSyncChunks == 1 || u % kSyncChunks == 0) {
        if constexpr (kTma) {
          CUTLASS_PRAGMA_UNROLL
          for (int c = 0; c < kSyncChunks; ++c) {  // chunks i .. landed
            int const landing = kUnrolled ? (u + c) % kStages : (read_slot + c) % kStages;
            if (i + c < count) {
              smem::mbarrier_wait(barriers + 8 * landing, (phases >> landing) & 1u);
              phases ^= 1u << landing;
            }
          }
          // every warp is past its reads of the slots queued next (the fence orders the weights'
          // generic-proxy loads before the TMA's async-proxy writes)
          smem::fence_proxy_async();
          __syncthreads();
        } else {
          smem::cp_async_wait_for_wgmma<kAhead - kSyncChunks>();
        }
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kSyncChunks; ++c) {
          if (i + kAhead + c < count) {
            issue(kUnrolled ? (u + kAhead + c) % kStages : write_slot);
          }
          if constexpr (!kTma) {
            cute::cp_async_fence();
          }
          write_slot = write_slot + 1 == kStages ? 0 : write_slot + 1;
        }
      }
      int const slot = kUnrolled ? u % kStages : read_slot;
      uint32_t const weights = weight_lane + slot * kWeightStageBytes;
      if constexpr (kPerGroup) {
        scale[0] = lds32(scale_lane + slot * kScaleStageBytes);
        scale[1] = lds32(scale_lane + slot * kScaleStageBytes + 8 * 4);
      }
      read_slot = read_slot + 1 == kStages ? 0 : read_slot + 1;
      // The lane's 16 bytes of each row; word j gives step j's slots 4q .. (low nibbles) and
      // 16 + 4q .. (high nibbles): per group k = 32j + 4q + i and + 16 (the MMA order), per
      // channel k = 32q + 8j + 2i and + 1 (CUTLASS's order; the tokens permuted to match)
      uint4 const lo = lds128(weights + 16 * q), hi = lds128(weights + 8 * kWeightRowBytes + 16 * q);
      uint32_t const lo_words[kSteps] = {lo.x, lo.y, lo.z, lo.w};
      uint32_t const hi_words[kSteps] = {hi.x, hi.y, hi.z, hi.w};
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSteps; ++j) {
        a[j][0] = (lo_words[j] << 4) & 0xF0F0F0F0u;
        a[j][1] = (hi_words[j] << 4) & 0xF0F0F0F0u;
        a[j][2] = lo_words[j] & 0xF0F0F0F0u;
        a[j][3] = hi_words[j] & 0xF0F0F0F0u;
      }
    };
    // The group's exact sum (acc = 16·Σ_g) promoted: scaled += (s_g / 16) · float(acc). The
    // conversion is one instruction (an integer add and a float subtraction, the exponent trick,
    // measured 2-6% slower: one more instruction a value); float(acc) = 16 · float(Σ_g) exactly
    // (the rounding commutes with the power of two; exact outright for |acc| < 2^24, groups up
    // to 1024), and so is (s_g / 16) · 16 = s_g inside the fused multiply-add.
    auto promote = [&](float const (&scale)[2]) {
      cute::warpgroup_wait<0>();
      fence(acc);
      float const s16[2] = {scale[0] * 0.0625f, scale[1] * 0.0625f};
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kAccRegs; ++r) {
        float const v = static_cast<float>(static_cast<int32_t>(acc[r]));
        scaled[r] = fmaf(s16[(r % 4) / 2], v, scaled[r]);
      }
      fence(acc);
    };
    // Chunk i at position u of a round: issue its wgmmas (per group from zero at the group's
    // first chunk), retire chunk i − 1's, convert chunk i + 1 into `a_next` while the
    // tensor cores run chunk i, and (per group) promote at the group's last chunk.
    int group_left = p.chunks_per_group;  // chunks of the current group not yet issued
    auto step = [&](int i, int u, uint32_t (&a)[kSteps][4], float const (&scale)[2],
                    uint32_t (&a_next)[kSteps][4], float (&scale_next)[2]) {
      // its tokens in slot u % kStages, or the slot before read_slot (the start address field,
      // in 16-byte units, never overflows its 14 bits in 227 KB)
      int const slot = kUnrolled ? u % kStages : (read_slot == 0 ? kStages - 1 : read_slot - 1);
      uint64_t const desc = kUnrolled
                                ? desc_ring + uint64_t(slot * (kActSlotBytes / 16))
                                : smem::sw128_k_major_descriptor(ring + slot * kActSlotBytes);
      bool const fresh = kPerGroup && group_left == p.chunks_per_group;
      cute::warpgroup_arrive();  // the fragments were just written
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSteps; ++j) {  // + 32 bytes a step
        mma(a[j], desc + 2 * j, acc,
            fresh && j == 0 ? cute::SM90::GMMA::ScaleOut::Zero : cute::SM90::GMMA::ScaleOut::One,
            std::make_index_sequence<kAccRegs>{});
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<1>();  // chunk i − 1's wgmmas are done with a_next
      if (i + 1 < count) {
        load_chunk(i + 1, (u + 1) % kUnroll, a_next, scale_next);
      }
      if constexpr (kPerGroup) {
        if (--group_left == 0 || i + 1 == count) {
          promote(scale);
          group_left = p.chunks_per_group;
        }
      }
    };

    uint32_t frag[2][kSteps][4];  // chunk u of a round converts into frag[u % 2]
    float scales[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    if (count > 0) {
      load_chunk(0, 0, frag[0], scales[0]);
    }
    if constexpr (kUnrolled) {
      for (int round = 0; round < count; round += kUnroll) {
        CUTLASS_PRAGMA_UNROLL
        for (int u = 0; u < kUnroll; ++u) {
          if (round + u < count) {
            step(round + u, u, frag[u % 2], scales[u % 2], frag[(u + 1) % 2], scales[(u + 1) % 2]);
          }
        }
      }
    } else {
      for (int i = 0; i < count; i += 2) {
        step(i, 0, frag[0], scales[0], frag[1], scales[1]);
        if (i + 1 < count) {
          step(i + 1, 1, frag[1], scales[1], frag[0], scales[0]);
        }
      }
    }
    cute::warpgroup_wait<0>();
    fence(acc);

    // Register r: rows (tile-local) row_lo (r % 4 < 2) or row_lo + 8, token 8·(r / 4) + 2q +
    // r % 2 of the tile. C = w_scale · (x_scale · Σ) per channel, x_scale · F per group.
    float const* w_scale = p.w_scale + int64_t(e) * p.n;  // per channel: [E, N]
    auto value = [&](int r, int n, float x_scale) {
      if constexpr (kPerGroup) {
        return x_scale * scaled[r];
      } else {
        return w_scale[n] * (x_scale * static_cast<float>(static_cast<int32_t>(acc[r]) >> 4));
      }
    };
    if constexpr (kFused) {
      fused_epilogue(p, n0 + row_lo, t0, t_end, g, q, value, token_max);
    } else {
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kAccRegs; ++r) {
        int const n = n0 + row_lo + ((r % 4) < 2 ? 0 : 8);
        int64_t const row = t0 + 8 * (r / 4) + 2 * q + (r % 2);
        if (n < p.n && row < t_end) {
          p.c[row * p.n + n] = value(r, n, p.x_scale[row]);
        }
      }
    }
    if constexpr (kTma) {
      __syncthreads();  // both warpgroups are done with the ring: the next row tile may refill it
      if (tid == 0) {   // every queued chunk landed (each was waited for): the next tile re-inits
        CUTLASS_PRAGMA_UNROLL
        for (int slot = 0; slot < kStages; ++slot) {
          smem::mbarrier_inval(barriers + 8 * slot);
        }
      }
    } else {
      cute::cp_async_wait<0>();
      __syncthreads();  // both warpgroups are done with the ring: the next row tile may refill it
    }
    if constexpr (kFused) {  // every warp's maxima are in token_max: the tile's into the rows'
      if (tid < kTokens && t0 + tid < t_end && token_max[tid] != 0u) {
        atomicMax(p.row_max + t0 + tid, token_max[tid]);
      }
    }
  }
};

template <class Config>
__global__ void __launch_bounds__(WgmmaGroupedGemm<Config>::kThreads,
                                  WgmmaGroupedGemm<Config>::kMinBlocks)
    wgmma_grouped_gemm_kernel(Params const params,
                              __grid_constant__
                              typename WgmmaGroupedGemm<Config>::Maps const maps) {
  extern __shared__ __align__(1024) char smem[];
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  pdl_wait();  // group_work's lists (inline grouping: the group list from the kernel before)
  pdl_release();
  direct::grouped_row_tiles<WgmmaGroupedGemm<Config>>(params, smem, maps);
#endif
}

template <class Config>
using WgmmaSwigluQuant =
    direct::OwnSwigluQuant<WgmmaGroupedGemm<Config>, wgmma_grouped_gemm_kernel<Config>>;

}  // namespace gemmgen::moe::wgmma
