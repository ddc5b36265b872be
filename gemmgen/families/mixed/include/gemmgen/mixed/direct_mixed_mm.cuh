/*
 * gemmgen/mixed/direct_mixed_mm.cuh — the mixed-input family's "direct" kernel: a weight-streaming
 * GEMM on mma.sync (sm80 and later, so also sm90a) for few tokens, where the weight read is the
 * whole cost. It reads the same packed weight as the CUTLASS 3.x kernels (layout version 2:
 * int4 in blocks of 16 rows x 64 k in the MMA's fragment order, int8 [N, K] K-major).
 *
 * Work split. A warp owns 16 or 32 output features (RowTiles MMA tiles of 16, the MMA's M; two
 * tiles share the tokens' fragments, the Σx MMAs and the loop's overhead) and one contiguous
 * range of K; a CTA has WarpsN × WarpsK warps (WarpsN feature blocks, each K split WarpsK ways) and Tokens tokens
 * (the MMA's N, 8 per tile; with 1, 2 or 4 tokens at decode the ring holds only those rows, and
 * the MMA's other columns are zero (int8) or repeat the last token (int4), never stored). The WarpsN warps that share a K range (a "K group") stream it
 * in chunks of ChunkK (64 or 128: one or two 64-K "steps") through cp.async rings of Stages
 * chunks: each warp its own 16 weight rows, the K group one shared ring of the tokens'
 * activations (read from L2 once per CTA, not once per warp), with one barrier of the K group's
 * warps a chunk (a named barrier). Shared memory is addressed by 32-bit offsets (no generic-to-
 * shared conversion in the loop) and rows past N or M are zero-filled by byte count. Each warp
 * converts its weights in registers (exact: every stored value is a small integer; int8 with
 * CUTLASS's converter) and feeds mma.sync m16n8k16 with fp32 accumulation. The CTA's WarpsK
 * partial sums are added in a fixed order through shared memory: results are bit-identical run
 * to run.
 *
 * K order inside a step. int4 weights come packed in the MMA's fragment order (packing.py): a
 * lane's 16 bytes of a row block's 64-K step are its A registers of the step's four MMAs, rows
 * g and g + 8 (one 16-byte shared-memory load); its tokens' B registers are read in natural k
 * order (two ldmatrix.x4 a token tile, conflict-free through the 128-byte swizzle). int8
 * weights are K-major, and the MMA sums over its 16 k slots, so any bijection between slots and
 * the step's 64 k values gives the same sum if both operands use it: for the lane with
 * q = lane % 4, MMA j ∈ 0..3 and fragment slots {2q, 2q+1, 2q+8, 2q+9} map to
 * k = 16q + 4j + {0, 1, 2, 3}, so each lane's 16 k values of a weight row, and of a token, are
 * contiguous (one 16-byte shared-memory load each).
 *
 * int4 conversion. A shift and one LOP3 put a register's nibble pair (nibbles i and i + 4 of the
 * step's word) under the exponent of the 16-bit float B = 128 (bf16) or 1024 (fp16), whose
 * spacing there is 1, XOR-ing each nibble with 8 (int4 → unsigned): B + 8 + stored, exact
 * (layout version 1 needed a byte permute a register more). With scales alone one packed FMA then subtracts
 * B + 8. With zero points the MMA takes B + 8 + stored as it is: the kernel already sums x per
 * token for the zero point (one more MMA a k16 step, against a ones fragment), so (B + 8)·Σx
 * joins the zero point's term and the subtraction goes (with scales alone, computing Σx for it
 * cost more than the subtraction saves: 3-7% slower on the H100 and the H200, even with 32
 * features a warp).
 *
 * Scales. Every step's MMA result is accumulated per segment in fp32 and scaled in fp32 when the
 * segment ends: out = Σ_seg scale[g] · Σ_{k∈seg} x·w' + (zp[g] − bias·scale[g]) · Σ_{k∈seg} x,
 * where w' is what the MMA saw (stored, or bias + stored) and the second term exists with zero
 * points. A segment is the group, or with the bias and groups longer than 512 (per-channel is one
 * group) the group's largest divisor up to 512: the biased sum grows with it, and 512 keeps its
 * cancellation near 2^-16 relative at fp16's bias. This is more exact than rounding
 * scale·stored to 16 bits before the MMA. A group's scales (and zero points) are loaded when the
 * group starts and used when it ends, so their latency hides behind its steps (loaded at the
 * end, they were the kernel's largest stall: 10-20% of its time). Group 32 (GroupK 32, the
 * `_g32` schemes): a step holds two groups, so MMAs 0-1 and 2-3 sum into partial sums of their
 * own, each scaled by its group's factors when the step ends (both groups' factors travel with
 * the weights through the warp's ring: loaded from global memory a step ahead instead, the
 * kernel ran 1.33x slower at one token on the H200); int4's MMA j takes k 16j .. 16j + 15
 * anyway, and int8's slots map to k = 32·(j / 2) + 8q + 4·(j % 2) + {0, 1, 2, 3} instead (two
 * 8-byte loads a row and two token segments), so that no MMA mixes the two groups.
 *
 * PDL. The prologue queues its chunks' weight copies and the first group's factors before
 * griddepcontrol.wait (the packed weights never come from the kernel before), the tokens' after
 * it: the weight read overlaps the previous kernel's tail (session 17: 2-7% at 1-16 tokens on the
 * H100, back to back).
 *
 * Measured (H100 and H200, benchmarks/RESULTS.md): at one token the loop issues an instruction
 * on ~80% of cycles, so instructions per weight byte bound int4; int8 reaches ~95% of the copy
 * bandwidth on large weights. 32 features a warp cut the instructions a weight byte by ~25%: 13%
 * faster at 16 tokens, and 20% with zero points at 1-8 tokens; with scales alone at 1-8 tokens
 * level on the H100 and 5% faster on the H200 since layout version 2 (session 16). Tried and
 * dropped: Σx for scales alone (above; again in session 16), deeper rings, fewer registers for
 * more CTAs an SM (`ctas_per_sm`), a token ring sized to one token, and 128-K chunks: none faster on the Llama shapes (the last three stay as
 * manifest knobs).
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
#include "gemmgen/shared_memory.cuh"

namespace gemmgen::mixed::direct {

template <class ElementA_, class ElementW_, bool WithZero_, int WarpsN_, int WarpsK_,
          int Tokens_, int ChunkK_, int Stages_, int CtasPerSm_ = 0, int RowTiles_ = 1,
          int GroupK_ = 64>
struct DirectConfig {
  using ElementA = ElementA_;  // activations = MMA, scale, zero and output type
  using ElementW = ElementW_;  // cutlass::int4b_t or int8_t
  static constexpr bool WithZero = WithZero_;
  static constexpr int WarpsN = WarpsN_;
  static constexpr int WarpsK = WarpsK_;
  static constexpr int Tokens = Tokens_;  // tokens a CTA: 1, 2, 4 or a multiple of 8
  static constexpr int ChunkK = ChunkK_;  // K a ring slot holds: 64 or 128
  static constexpr int Stages = Stages_;
  // CTAs an SM must hold at once (__launch_bounds__' minimum, capping the registers); 0: no cap
  static constexpr int CtasPerSm = CtasPerSm_;
  static constexpr int RowTiles = RowTiles_;  // 16-feature MMA tiles a warp: 1 or 2
  // The group sizes it serves: 64 (any multiple of 64 that divides K, per-channel included) or
  // 32 (group 32 exactly: each 64-K step holds two groups)
  static constexpr int GroupK = GroupK_;
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

inline Params make_params(gemmgen_mixed_mm_args const& a) {
  return Params{a.a, static_cast<unsigned char const*>(a.w), a.scale, a.zero, a.bias, a.d,
                static_cast<int>(a.m), static_cast<int>(a.n), static_cast<int>(a.k),
                static_cast<int>(a.group_size), a.lda, a.ldd};
}

// What the family's own kernels (this one and wgmma_mixed_mm.cuh) need of the arguments: K a
// multiple of the 64-K step, the group a multiple of it that divides K (`group_k` 64) or 32
// exactly (`group_k` 32), sizes below 2^31, the tensors there and 16-byte aligned. GEMMGEN_OK or
// the failure recorded by fail().
inline int check_args(gemmgen_mixed_mm_args const& a, bool with_zero, int group_k,
                      char const* kernel_name) {
  constexpr int kStepK = 64;
  auto aligned = [](void const* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (a.m < 1 || a.n < 1 || a.k < kStepK || a.k % kStepK != 0 || a.k >= (int64_t(1) << 31) ||
      a.m >= (int64_t(1) << 31) || a.n >= (int64_t(1) << 31)) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs M, N >= 1 and K a positive multiple of 64, all below 2^31");
  }
  if (group_k == 32 && a.group_size != 32) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs group size 32 (a kernel of the _g32 schemes; other sizes take the others)");
  }
  if (group_k != 32 && (a.group_size < kStepK || a.group_size % kStepK != 0 ||
                        a.k % a.group_size != 0)) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs a group size that is a multiple of 64 and divides K (group 32 takes a "
                "kernel of the _g32 schemes)");
  }
  if (a.a == nullptr || a.w == nullptr || a.scale == nullptr || a.d == nullptr) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "needs activations, weight, scales, output");
  }
  if (!aligned(a.a) || !aligned(a.w) || a.lda % 8 != 0 || a.lda < a.k || a.ldd < a.n) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs 16-byte aligned activations and weight, lda a multiple of 8 (>= K), ldd >= N");
  }
  if (with_zero && a.zero == nullptr) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "needs the zero-point tensor");
  }
  // the wgmma kernel's factors, and the direct kernel's with group 32, are 16-byte copies of 8
  // rows (the op asks as much of every call)
  if (a.n % 8 != 0 || !aligned(a.scale) || (with_zero && !aligned(a.zero))) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs N a multiple of 8 and 16-byte aligned scales and zero terms (16-byte "
                "copies of 8 rows' factors)");
  }
  return GEMMGEN_OK;
}

// Shared memory by 32-bit address (gemmgen/shared_memory.cuh), shared with wgmma_mixed_mm.cuh.
using smem::cp_async16;
using smem::lds128;

template <class Config>
struct DirectMixedMm {
  using ElementA = typename Config::ElementA;
  using ElementW = typename Config::ElementW;
  static constexpr bool kWithZero = Config::WithZero;
  static constexpr int kWarpsN = Config::WarpsN;
  static constexpr int kWarpsK = Config::WarpsK;
  static constexpr int kTokens = Config::Tokens;             // tokens per CTA
  static constexpr int kTokenTiles = (kTokens + 7) / 8;       // the MMA's N, 8 per tile
  static constexpr int kStages = Config::Stages;
  static_assert(kStages >= 2, "the ring needs at least two stages");
  static_assert(kTokens == 1 || kTokens == 2 || kTokens == 4 || kTokens % 8 == 0,
                "tokens a CTA: 1, 2, 4 or a multiple of 8");

  static constexpr int kWarps = kWarpsN * kWarpsK;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCtasPerSm = Config::CtasPerSm > 0 ? Config::CtasPerSm : 1;
  // K is walked in steps of 64 (four MMAs a token tile); a ring slot (a chunk) holds kSteps of
  // them, each laid out in shared memory as a slot of the 64-K kernel would be.
  static constexpr int kStepK = 64;
  static constexpr int kChunkK = Config::ChunkK;
  static constexpr int kSteps = kChunkK / kStepK;
  static_assert(kChunkK == 64 || kChunkK == 128, "a chunk is 64 or 128 K");
  static constexpr int kGroupK = Config::GroupK;
  static_assert(kGroupK == 64 || kGroupK == 32, "groups of a multiple of 64, or of 32");
  // Groups a step holds: 1, or 2 with group 32 (MMAs 0-1 sum its first 32 k, 2-3 the rest, each
  // pair into its own partial sums, scaled by its own group's factors)
  static constexpr int kHalves = kStepK / kGroupK;
  static constexpr int kRowTiles = Config::RowTiles;  // the MMA's M tiles of 16 features a warp
  static_assert(kRowTiles == 1 || kRowTiles == 2, "a warp owns 16 or 32 features");
  static constexpr int kRows = 16 * kRowTiles;        // output features per warp
  static constexpr int kWeightBits = cutlass::sizeof_bits<ElementW>::value;
  static constexpr int kWeightRowBytes = kStepK * kWeightBits / 8;  // a row's step: 32 (int4), 64
  static constexpr int kWeightStepBytes = kRows * kWeightRowBytes;
  static constexpr int kWeightStageBytes = kSteps * kWeightStepBytes;
  static constexpr int kActRowBytes = kStepK * 2;                   // 128: 8 × 16 bytes
  static constexpr int kActStepBytes = kTokens * kActRowBytes;
  static constexpr int kActStageBytes = kSteps * kActStepBytes;
  static constexpr int kWeightRingBytes = kStages * kWeightStageBytes;  // per warp
  static constexpr int kActRingBytes = kStages * kActStageBytes;        // per K group
  // Group 32: every step needs two groups' factors, so they travel with the weights (the warp's
  // rows' scales of both groups, then their zero points, a ring slot each step) instead of being
  // loaded from global memory a step ahead (session 33: 1.33x slower at one token that way).
  static constexpr bool kStagedFactors = kHalves == 2;
  static constexpr int kFactorStepBytes =
      kStagedFactors ? kHalves * kRows * 2 * (kWithZero ? 2 : 1) : 0;
  static constexpr int kFactorSegs = kFactorStepBytes / 16;  // a warp's 16-byte copies a step
  static_assert(kFactorSegs <= 32, "one factor copy a lane and step");
  static constexpr int kFactorStageBytes = kSteps * kFactorStepBytes;
  static constexpr int kFactorRingBytes = kStages * kFactorStageBytes;  // per warp
  static constexpr int kRingBytes =
      kWarps * kWeightRingBytes + kWarpsK * kActRingBytes + kWarps * kFactorRingBytes;
  static constexpr int kReduceBytes = kWarps * kRowTiles * kTokenTiles * 4 * 32 * 4;
  static constexpr int kSmemBytes = kRingBytes > kReduceBytes ? kRingBytes : kReduceBytes;
  static constexpr int kGroupThreads = 32 * kWarpsN;  // the threads of a K group

  static constexpr bool kIsBf16 = cute::is_same_v<ElementA, cutlass::bfloat16_t>;
  using Mma = cute::conditional_t<kIsBf16, cute::SM80_16x8x16_F32BF16BF16F32_TN,
                                  cute::SM80_16x8x16_F32F16F16F32_TN>;
  using Converter = cutlass::NumericArrayConverter<ElementA, ElementW, 16>;

  static constexpr bool kInt4 = kWeightBits == 4;
  static constexpr int kBlockBytes = 512;  // int4: a row block's 64-K step (16 rows, fragment order)
  static constexpr int kSegsPerStep = kWeightRowBytes / 16;         // a weight row's, 2 or 4
  static constexpr int kSegsPerRow = kSteps * kSegsPerStep;           // in a chunk
  // per lane and chunk: 1 to 4 (int4: one 16-byte piece of each row block and step)
  static constexpr int kWeightCopies = kRows * kSegsPerRow / 32;
  static constexpr int kActSegsPerRow = kSteps * 8;                   // a token's, in a chunk
  static constexpr int kActSegs = kTokens * kActSegsPerRow;
  // per thread of the K group and chunk (the last round may leave threads idle)
  static constexpr int kActCopies = (kActSegs + kGroupThreads - 1) / kGroupThreads;
  static_assert(kRows * kSegsPerRow % 32 == 0 && 32 % kSegsPerRow == 0);
  static_assert(kGroupThreads % kActSegsPerRow == 0);  // a thread's copies are all of one step

  // This thread's share of every chunk's copies, computed once: a global source at chunk
  // c_begin that advances by one chunk of K per chunk, a destination offset in the ring slot,
  // and the bytes to read (0 where the row does not exist: weight rows past N and token rows
  // past M are zero-filled, their source a row that exists). int8 weights: the warp's kRows
  // rows, 16-byte segments in row order, by its 32 lanes (copy j is rows 32/kSegsPerRow·j
  // further). int4 weights: copy j is row block j % kRowTiles of step j / kRowTiles, lane l's
  // 16 bytes at 16·l of the block (stored in the slot as in global memory: the fragment order).
  // Tokens: the CTA's rows, by the K group's threads (`member` 0 .. 32·WarpsN - 1; a copy past
  // the segments is skipped), each row's eight 16-byte segments of a step XOR-swizzled by
  // (token % 8) so that the lanes' fragment loads are free of bank conflicts. With 128-K chunks
  // and K an odd number of 64-K steps, the last chunk's second step is zero-filled
  // (`tail_ahead`: that chunk, -1 when there is none; `w_tail`, `a_tail`: this thread's copies
  // are of that step).
  struct CopyPlan {
    static constexpr int kWeightRowsPerCopy = 32 / kSegsPerRow;  // rows between a lane's copies
    unsigned char const* w_src[kWeightCopies];   // the range's first chunk
    unsigned char const* w_next[kWeightCopies];  // the next chunk to queue (a pointer bump a chunk)
    unsigned char const* a_src[kActCopies];
    uint32_t a_dst[kActCopies];
    uint32_t w_dst;  // copy j: + j · kWeightRowsPerCopy rows (int4: + the copy's block offset)
    int64_t w_chunk_bytes;  // how far a weight source advances a chunk
    uint32_t w_bytes[kWeightCopies], a_bytes[kActCopies];
    int tail_ahead;
    bool a_mine[kActCopies];
    // staged factors (group 32): this lane's 16 bytes of a step's factors (8 rows of a group's
    // scales or zero points), at the range's first step and the next chunk's; rows past N are
    // zero-filled
    unsigned char const* f_src = nullptr;
    unsigned char const* f_next = nullptr;
    int64_t f_step_bytes = 0;  // how far the factors advance a step: two groups' rows of N
    uint32_t f_dst = 0, f_bytes = 0;
    bool f_mine = false;
    bool w_tail = false, a_tail;  // w_tail: int8 only (an int4 copy's step is j / kRowTiles)

    __device__ CopyPlan(Params const& p, int c_begin, int n0, int t0, int lane, int member) {
      int const steps = p.k / kStepK;
      tail_ahead = steps % kSteps != 0 ? (steps - 1) / kSteps - c_begin : -1;
      a_tail = (member % kActSegsPerRow) / 8 >= steps % kSteps;
      if constexpr (kInt4) {
        // blocks [K/64][ceil(N/16)] of 512 bytes; rows past N inside a block are zero
        int64_t const row_blocks = (p.n + 15) / 16;
        w_chunk_bytes = kSteps * row_blocks * kBlockBytes;
        w_dst = lane * 16;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kWeightCopies; ++j) {
          int const r = j % kRowTiles, h = j / kRowTiles;
          bool const ok = n0 + 16 * r < p.n;
          w_bytes[j] = ok ? 16 : 0;
          w_src[j] = p.w + ((int64_t(c_begin) * kSteps + h) * row_blocks + (ok ? n0 / 16 + r : 0)) *
                               kBlockBytes + lane * 16;
        }
      } else {
        int const seg = lane % kSegsPerRow;
        w_tail = seg / kSegsPerStep >= steps % kSteps;
        w_chunk_bytes = kSegsPerRow * 16;
        w_dst = (seg / kSegsPerStep) * kWeightStepBytes + (lane / kSegsPerRow) * kWeightRowBytes +
                (seg % kSegsPerStep) * 16;
        CUTLASS_PRAGMA_UNROLL
        for (int j = 0; j < kWeightCopies; ++j) {
          int const n = n0 + lane / kSegsPerRow + kWeightRowsPerCopy * j;
          bool const ok = n < p.n;
          w_bytes[j] = ok ? 16 : 0;
          w_src[j] = p.w + (int64_t(ok ? n : 0) * p.k + int64_t(c_begin) * kChunkK) +
                     seg * 16;
        }
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kActCopies; ++j) {
        int const i = member + kGroupThreads * j;
        a_mine[j] = i < kActSegs;
        int const row = (a_mine[j] ? i : 0) / kActSegsPerRow, a_seg = i % kActSegsPerRow;
        bool const ok = a_mine[j] && t0 + row < p.m;
        a_bytes[j] = ok ? 16 : 0;
        a_src[j] = static_cast<unsigned char const*>(p.a) +
                   (int64_t(ok ? t0 + row : 0) * p.lda + int64_t(c_begin) * kChunkK + a_seg * 8) *
                       int64_t(sizeof(ElementA));
        a_dst[j] = (a_seg / 8) * kActStepBytes + row * kActRowBytes + (((a_seg % 8) ^ (row & 7)) * 16);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kWeightCopies; ++j) {
        w_next[j] = w_src[j];
      }
      if constexpr (kStagedFactors) {
        // segment `lane`: 8 rows (row8) of group `half` of the step, scales then zero points
        constexpr int kRows8 = kRows / 8;
        f_mine = lane < kFactorSegs;
        int const seg = f_mine ? lane : 0;
        int const row8 = seg % kRows8, half = (seg / kRows8) % kHalves;
        bool const zero_part = seg >= kRows8 * kHalves;
        bool const ok = f_mine && n0 + 8 * row8 < p.n;
        f_bytes = ok ? 16 : 0;
        f_step_bytes = int64_t(kHalves) * p.n * 2;
        f_src = static_cast<unsigned char const*>(zero_part ? p.zero : p.scale) +
                ((int64_t(c_begin) * kSteps * kHalves + half) * p.n + (ok ? n0 + 8 * row8 : 0)) * 2;
        f_next = f_src;
        f_dst = ((zero_part ? kHalves : 0) + half) * (kRows * 2) + row8 * 16;
      }
    }

    // Queue chunk `c_begin + ahead`'s copies into the ring slots at shared addresses
    // `weight_slot` and `act_slot`: its weights, then its tokens (the prologue queues the
    // weights before the PDL wait: they never depend on the kernel before).
    // Chunks are queued in order, `ahead` = 0, 1, 2, ... (the weights' sources advance a chunk a
    // call).
    __device__ void issue(uint32_t weight_slot, uint32_t factor_slot, uint32_t act_slot, int ahead) {
      issue_weights(weight_slot, factor_slot, ahead);
      issue_tokens(act_slot, ahead);
    }
    __device__ void issue_weights(uint32_t weight_slot, uint32_t factor_slot, int ahead) {
      bool const in_tail = kSteps > 1 && ahead == tail_ahead;  // a step past K: zero-filled
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kWeightCopies; ++j) {
        // int4: the copy's step is j / kRowTiles, past K in the tail chunk when it is the second
        bool const cut = in_tail && (kInt4 ? j / kRowTiles > 0 : w_tail);
        uint32_t const dst = kInt4 ? (j / kRowTiles) * kWeightStepBytes + (j % kRowTiles) * kBlockBytes
                                   : j * kWeightRowsPerCopy * kWeightRowBytes;
        // a cut copy reads nothing; its source is still one that exists (int4: the same row
        // block's first step of the range, whose second step may lie past the weight's end)
        cp_async16(weight_slot + w_dst + dst, cut ? w_src[kInt4 ? j % kRowTiles : j] : w_next[j],
                   cut ? 0u : w_bytes[j]);
        w_next[j] += w_chunk_bytes;
      }
      if constexpr (kStagedFactors) {
        if (f_mine) {
          CUTLASS_PRAGMA_UNROLL
          for (int h = 0; h < kSteps; ++h) {
            bool const cut = in_tail && h > 0;  // the step past K: zero-filled, never read
            cp_async16(factor_slot + h * kFactorStepBytes + f_dst,
                       cut ? f_src : f_next + h * f_step_bytes, cut ? 0u : f_bytes);
          }
          f_next += kSteps * f_step_bytes;
        }
      }
    }
    __device__ void issue_tokens(uint32_t act_slot, int ahead) const {
      bool const in_tail = kSteps > 1 && ahead == tail_ahead;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kActCopies; ++j) {
        if (a_mine[j]) {
          bool const cut = in_tail && a_tail;
          cp_async16(act_slot + a_dst[j],
                     cut ? a_src[j] : a_src[j] + int64_t(ahead) * (kActSegsPerRow * 16),
                     cut ? 0u : a_bytes[j]);
        }
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

  // Biased only where Σx is computed anyway, for the zero points (see the file's comment).
  static constexpr bool kBiased = kInt4 && kWithZero;
  static constexpr float kBias = !kBiased ? 0.f : kIsBf16 ? 136.f : 1032.f;
  // 1.0 in both halves, bf16 or fp16: the A fragment whose MMA sums the tokens' x
  static constexpr uint32_t kOnes = kIsBf16 ? 0x3F803F80u : 0x3C003C00u;

  // int4: a row block's step of this lane (`addr` its 16 bytes in shared memory: word j holds
  // MMA j's A registers, register i in nibbles i and i + 4) as rows g (`lo`) and g + 8 (`hi`),
  // 8 words of two 16-bit floats each, in the order the MMA loop takes them: lo[2j], hi[2j],
  // lo[2j + 1], hi[2j + 1] are MMA j's registers 0-3 (biased by kBias).
  static __device__ void load_block(uint32_t addr, uint32_t (&lo)[8], uint32_t (&hi)[8]) {
    uint4 const stored = lds128(addr);
    // the exponent of 128 (bf16) or 1024 (fp16), and 8: the nibble's XOR to unsigned
    constexpr uint32_t kMagic = kIsBf16 ? 0x43084308u : 0x64086408u;
    uint32_t const words[4] = {stored.x, stored.y, stored.z, stored.w};
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < 4; ++j) {
      uint32_t regs[4];
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        // (word >> 4i & 0x000F000F) ^ kMagic: the shift, then one LOP3
        asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(regs[i]) : "r"(words[j] >> (4 * i)),
            "n"(0x000F000F), "n"(kMagic));
        if constexpr (!kBiased) {  // subtract the magic: the stored value itself
          if constexpr (kIsBf16) {
            // x · 1 − magic (sub.bf16x2 needs sm90; fma.rn.bf16x2 is sm80's)
            asm("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(regs[i]) : "r"(kOnes), "r"(kMagic ^ 0x80008000u));
          } else {
            asm("sub.f16x2 %0, %0, %1;" : "+r"(regs[i]) : "r"(kMagic));
          }
        }
      }
      lo[2 * j] = regs[0];
      hi[2 * j] = regs[1];
      lo[2 * j + 1] = regs[2];
      hi[2 * j + 1] = regs[3];
    }
  }

  // int8: one weight row's 16 values of this lane (k = 16q .. 16q+15 of the step, or with group
  // 32 k = 8q .. 8q+7 and 32+8q .. 32+8q+7; `addr` their shared address) as 8 words of two
  // 16-bit floats, word i holding values 2i and 2i+1.
  static __device__ void load_row(uint32_t addr, uint32_t (&out)[8]) {
    using Packed = cutlass::Array<ElementW, 16>;
    uint4 raw;
    if constexpr (kHalves == 2) {
      uint2 const first = smem::lds64(addr), second = smem::lds64(addr + 32);
      raw = uint4{first.x, first.y, second.x, second.y};
    } else {
      raw = lds128(addr);
    }
    Packed stored;
    static_assert(sizeof(stored) == sizeof(raw));
    memcpy(&stored, &raw, sizeof(raw));
    auto const converted = Converter::convert(stored);
    static_assert(sizeof(converted) == sizeof(out));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 8; ++i) {
      out[i] = reinterpret_cast<uint32_t const*>(&converted)[i];
    }
  }

  // A biased group's segment (see the file's comment): its largest divisor up to 8 steps.
  static __device__ int segment_steps(int steps_per_group) {
    int seg = steps_per_group < 8 ? steps_per_group : 8;
    while (steps_per_group % seg != 0) {
      --seg;
    }
    return seg;
  }

  static __device__ float to_float(ElementA v) { return static_cast<float>(v); }
  static __device__ ElementA lds_factor(uint32_t addr) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
    return ElementA::bitcast(v);
  }

  static __device__ void kernel_body(Params const& p, char* smem) {
    int const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int const wn = warp % kWarpsN, wk = warp / kWarpsN;
    int const group_id = lane / 4, q = lane % 4;
    int const n0 = (blockIdx.y * kWarpsN + wn) * kRows;
    int const t0 = blockIdx.x * kTokens;
    int const steps = p.k / kStepK;
    int const chunks = (steps + kSteps - 1) / kSteps;  // the last may hold fewer steps
    int const c_begin = static_cast<int>(int64_t(chunks) * wk / kWarpsK);
    int const c_end = static_cast<int>(int64_t(chunks) * (wk + 1) / kWarpsK);
    // the factors' unit: a group, or with group 32 a step (its two groups)
    int const steps_per_group = kHalves == 2 ? 1 : p.group / kStepK;
    int const steps_per_segment = kBiased ? segment_steps(steps_per_group) : steps_per_group;
    uint32_t const smem_base = cute::cast_smem_ptr_to_uint(smem);
    uint32_t const weight_ring = smem_base + warp * kWeightRingBytes;
    uint32_t const act_ring = smem_base + kWarps * kWeightRingBytes + wk * kActRingBytes;
    uint32_t const factor_ring =
        smem_base + kWarps * kWeightRingBytes + kWarpsK * kActRingBytes + warp * kFactorRingBytes;
    // this lane's fragments in a step: int4, its 16 bytes of each row block; int8, its 16 k of
    // weight rows group_id and group_id + 8, and of token rows group_id + 8t (two 16-byte
    // segments, swizzled as the copies are): k 16q .. 16q+15, or with group 32 k 8q .. 8q+7 and
    // 32+8q .. 32+8q+7 (segments q and 4+q), so that MMAs 0-1 take the step's first group only
    uint32_t const weight_lane =
        kInt4 ? lane * 16 : group_id * kWeightRowBytes + q * (kHalves == 2 ? 8 : 16);
    int const act_seg0 = kHalves == 2 ? q : 2 * q, act_seg1 = kHalves == 2 ? 4 + q : 2 * q + 1;
    uint32_t const act_lane0 = group_id * kActRowBytes + ((act_seg0 ^ group_id) * 16);
    uint32_t const act_lane1 = group_id * kActRowBytes + ((act_seg1 ^ group_id) * 16);
    // int4: the tokens' B registers in natural k order by ldmatrix: MMA j's are the 8 x 8 b16
    // matrices of 16-byte segments 2j and 2j + 1 (k 16j .. 16j + 15) of the tile's 8 token rows,
    // which ldmatrix hands out as the MMA wants them (lane (g, q): token g, k 2q and 2q + 1 of
    // the segment). Each ldmatrix.x4 reads four segments: this lane gives the address of row
    // lane % 8 of segment 4h + lane / 8 (swizzled as the copies are). With fewer than 8 tokens
    // the rows past them read the last token again (their MMA columns are never stored).
    int const ldm_row = kTokens >= 8 ? lane % 8 : min(lane % 8, kTokens - 1);
    uint32_t const ldm_lane0 = ldm_row * kActRowBytes + (((lane / 8) ^ ldm_row) * 16);
    uint32_t const ldm_lane1 = ldm_row * kActRowBytes + (((4 + lane / 8) ^ ldm_row) * 16);

    float acc[kRowTiles][kTokenTiles][4] = {};   // scaled sum over finished segments
    // this segment's unscaled sum, per group of the step (group 32: two)
    float part[kHalves][kRowTiles][kTokenTiles][4] = {};
    float xsum[kHalves][kTokenTiles][4] = {};  // its per-token sum of x (zero-point scheme)

    // this lane's rows: n_lo(r) and n_lo(r) + 8 of row tile r
    auto n_lo = [&](int r) { return n0 + 16 * r + group_id; };
    ElementA const* scale = static_cast<ElementA const*>(p.scale);
    ElementA const* zero = static_cast<ElementA const*>(p.zero);
    // The current group's scales and zero points of this lane's rows, loaded when the group
    // starts and converted when its first segment ends: the loads' latency hides behind the
    // group's steps (loaded at the end, they were the kernel's largest stall).
    // `g` counts the factors' units (groups, or steps with group 32: groups 2g and 2g + 1).
    ElementA factors[kHalves][kRowTiles][kWithZero ? 4 : 2];
    auto load_factors = [&](int g) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < kHalves; ++h) {
        int64_t const row = (int64_t(g) * kHalves + h) * p.n;
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRowTiles; ++r) {
          int const lo = n_lo(r), hi = lo + 8;
          factors[h][r][0] = lo < p.n ? scale[row + lo] : ElementA(0);
          factors[h][r][1] = hi < p.n ? scale[row + hi] : ElementA(0);
          if constexpr (kWithZero) {
            factors[h][r][2] = lo < p.n ? zero[row + lo] : ElementA(0);
            factors[h][r][3] = hi < p.n ? zero[row + hi] : ElementA(0);
          }
        }
      }
    };
    // Staged factors (group 32): a step's two groups' factors of this lane's rows from its slot.
    auto read_factors = [&](uint32_t at) {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < kHalves; ++h) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRowTiles; ++r) {
          uint32_t const row = at + (h * kRows + 16 * r + group_id) * 2;
          factors[h][r][0] = lds_factor(row);
          factors[h][r][1] = lds_factor(row + 16);
          if constexpr (kWithZero) {
            factors[h][r][2] = lds_factor(row + kHalves * kRows * 2);
            factors[h][r][3] = lds_factor(row + kHalves * kRows * 2 + 16);
          }
        }
      }
    };
    auto finish_segment = [&]() {
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < kHalves; ++h) {
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRowTiles; ++r) {
          float const s_lo = to_float(factors[h][r][0]), s_hi = to_float(factors[h][r][1]);
          // Σx's factor: the zero point, less the bias the scale would otherwise apply
          float z_lo = 0.f, z_hi = 0.f;
          if constexpr (kWithZero) {
            z_lo = to_float(factors[h][r][2]) - kBias * s_lo;
            z_hi = to_float(factors[h][r][3]) - kBias * s_hi;
          }
          CUTLASS_PRAGMA_UNROLL
          for (int t = 0; t < kTokenTiles; ++t) {
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < 4; ++i) {
              acc[r][t][i] += (i < 2 ? s_lo : s_hi) * part[h][r][t][i];
              part[h][r][t][i] = 0.f;
              if constexpr (kWithZero) {
                acc[r][t][i] += (i < 2 ? z_lo : z_hi) * xsum[h][t][i];
              }
            }
          }
        }
        if constexpr (kWithZero) {
          CUTLASS_PRAGMA_UNROLL
          for (int t = 0; t < kTokenTiles; ++t) {
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < 4; ++i) {
              xsum[h][t][i] = 0.f;
            }
          }
        }
      }
    };

    // No division in the loop: ring slots advance by one, the group and segment by countdowns
    // of steps; `left` counts the range's steps still to do.
    CopyPlan plan(p, c_begin, n0, t0, lane, wn * 32 + lane);
    int const count = c_end - c_begin;
    int const s_begin = c_begin * kSteps;
    int left = min(c_end * kSteps, steps) - s_begin;
    int group = s_begin / steps_per_group;
    int const in_group = s_begin - group * steps_per_group;
    int left_in_group = steps_per_group - in_group;
    int left_in_segment = steps_per_segment - in_group % steps_per_segment;

    // Prologue: Stages - 1 chunks in flight, a commit group per chunk (empty past the range).
    // The weights and the first group's factors never depend on the kernel before (packed
    // weights are constant): they are queued before the PDL wait, so their read overlaps that
    // kernel's tail; the first commit group holds every prologue chunk's weights.
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < count) {
        plan.issue_weights(weight_ring + s * kWeightStageBytes, factor_ring + s * kFactorStageBytes, s);
      }
    }
    if (!kStagedFactors && count > 0) {
      load_factors(group);
    }
    pdl_wait();  // the activations may come from the previous kernel; its reads of our output
    pdl_release();
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < count) {
        plan.issue_tokens(act_ring + s * kActStageBytes, s);
      }
      cute::cp_async_fence();
    }

    int slot = 0, issue_slot = kStages - 1;
    for (int i = 0; i < count; ++i) {
      cute::cp_async_wait<kStages - 2>();
      k_group_sync(wk);  // chunk i landed for every thread of the K group (its copies are shared)
      // The slots chunk i + Stages - 1 goes to were read for chunk i - 1, by every thread of the
      // K group (before the barrier above).
      if (i + kStages - 1 < count) {
        plan.issue(weight_ring + issue_slot * kWeightStageBytes,
                   factor_ring + issue_slot * kFactorStageBytes,
                   act_ring + issue_slot * kActStageBytes, i + kStages - 1);
      }
      cute::cp_async_fence();
      issue_slot = issue_slot + 1 == kStages ? 0 : issue_slot + 1;

      uint32_t const weight_slot = weight_ring + slot * kWeightStageBytes + weight_lane;
      uint32_t const factor_slot = factor_ring + slot * kFactorStageBytes;
      uint32_t const act_slot = act_ring + slot * kActStageBytes;
      slot = slot + 1 == kStages ? 0 : slot + 1;
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < kSteps; ++h) {
        if (kSteps > 1 && h > 0 && left == 0) {
          break;  // K ended inside the chunk (its zero-filled step adds nothing)
        }
        uint32_t const weights = weight_slot + h * kWeightStepBytes;
        uint32_t const act = act_slot + h * kActStepBytes;
        // the tokens' fragments, shared by the row tiles
        uint32_t x[kTokenTiles][8];
        CUTLASS_PRAGMA_UNROLL
        for (int t = 0; t < kTokenTiles; ++t) {
          if constexpr (kInt4) {
            smem::ldmatrix_x4(act + ldm_lane0 + t * 8 * kActRowBytes, x[t][0], x[t][1], x[t][2], x[t][3]);
            smem::ldmatrix_x4(act + ldm_lane1 + t * 8 * kActRowBytes, x[t][4], x[t][5], x[t][6], x[t][7]);
          } else {
            uint4 x0 = {0, 0, 0, 0}, x1 = {0, 0, 0, 0};  // fewer than 8 tokens: the rest are zero
            if (kTokens >= 8 || group_id < kTokens) {
              x0 = lds128(act + act_lane0 + t * 8 * kActRowBytes);
              x1 = lds128(act + act_lane1 + t * 8 * kActRowBytes);
            }
            uint32_t const words[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < 8; ++i) {
              x[t][i] = words[i];
            }
          }
          if constexpr (kWithZero) {
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < 4; ++j) {
              uint32_t const ones = kOnes;  // (the MMA takes references)
              float (&sum)[4] = xsum[j * kHalves / 4][t];  // MMA j's group of the step
              Mma::fma(sum[0], sum[1], sum[2], sum[3], ones, ones, ones, ones,
                       x[t][2 * j], x[t][2 * j + 1], sum[0], sum[1], sum[2], sum[3]);
            }
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int r = 0; r < kRowTiles; ++r) {
          uint32_t w_lo[8], w_hi[8];
          if constexpr (kInt4) {
            load_block(weights + r * kBlockBytes, w_lo, w_hi);
          } else {
            load_row(weights + 16 * r * kWeightRowBytes, w_lo);
            load_row(weights + (16 * r + 8) * kWeightRowBytes, w_hi);
          }
          CUTLASS_PRAGMA_UNROLL
          for (int t = 0; t < kTokenTiles; ++t) {
            CUTLASS_PRAGMA_UNROLL
            for (int j = 0; j < 4; ++j) {
              float (&sum)[4] = part[j * kHalves / 4][r][t];  // MMA j's group of the step
              Mma::fma(sum[0], sum[1], sum[2], sum[3],
                       w_lo[2 * j], w_hi[2 * j], w_lo[2 * j + 1], w_hi[2 * j + 1],
                       x[t][2 * j], x[t][2 * j + 1], sum[0], sum[1], sum[2], sum[3]);
            }
          }
        }
        --left;
        --left_in_group;
        if (--left_in_segment == 0) {
          if constexpr (kStagedFactors) {
            read_factors(factor_slot + h * kFactorStepBytes);
          }
          finish_segment();
          left_in_segment = steps_per_segment;
          if (left_in_group == 0) {
            ++group;
            left_in_group = steps_per_group;
            if (!kStagedFactors && left > 0) {
              load_factors(group);
            }
          }
        }
      }
    }
    if (count > 0 && left_in_segment != steps_per_segment) {
      finish_segment();  // the range ended inside a segment (an empty range adds nothing:
                         // a ±inf scale times its zero sum would be NaN)
    }
    cute::cp_async_wait<0>();
    __syncthreads();  // every ring is drained: the shared memory becomes the reduction buffer

    // Partial sums, [warp k][warp n][row tile][token tile][value][lane], added in warp-k order.
    float* reduce = reinterpret_cast<float*>(smem);
    auto at = [&](int k_index, int r, int t, int i) {
      return (((((k_index * kWarpsN) + wn) * kRowTiles + r) * kTokenTiles + t) * 4 + i) * 32 + lane;
    };
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRowTiles; ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kTokenTiles; ++t) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) {
          reduce[at(wk, r, t, i)] = acc[r][t][i];
        }
      }
    }
    __syncthreads();
    if (wk != 0) {
      return;
    }
    ElementA const* bias = static_cast<ElementA const*>(p.bias);
    ElementA* d = static_cast<ElementA*>(p.d);
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kRowTiles; ++r) {
      CUTLASS_PRAGMA_UNROLL
      for (int t = 0; t < kTokenTiles; ++t) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 4; ++i) {
          float v = 0.f;
          for (int w = 0; w < kWarpsK; ++w) {
            v += reduce[at(w, r, t, i)];
          }
          int const n = n_lo(r) + (i < 2 ? 0 : 8);
          int const local = t * 8 + 2 * q + (i & 1), token = t0 + local;
          if (n < p.n && token < p.m && (kTokens >= 8 || local < kTokens)) {
            if (bias != nullptr) {
              v += to_float(bias[n]);
            }
            d[int64_t(token) * p.ldd + n] = ElementA(v);
          }
        }
      }
    }
  }

  static size_t workspace_size(gemmgen_mixed_mm_args const*) { return 0; }
};

template <class Config>
__global__ void __launch_bounds__(DirectMixedMm<Config>::kThreads, DirectMixedMm<Config>::kCtasPerSm)
    direct_mixed_mm_kernel(Params const params) {
  extern __shared__ __align__(128) char smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  DirectMixedMm<Config>::kernel_body(params, smem);  // it waits for the previous kernel
#endif
}

// The C-ABI entry: checks what the kernel relies on, then launches. `PdlCapable`: the library's
// arch has griddepcontrol (sm90a; the sm80 library's PTX has no wait, so it never launches as a
// programmatic dependent, whatever the arguments ask).
template <class Config, bool PdlCapable>
int run(gemmgen_mixed_mm_args const* args, void*, size_t, void* stream, char const* kernel_name) {
  using K = DirectMixedMm<Config>;
  auto const& a = *args;
  int const valid = check_args(a, K::kWithZero, K::kGroupK, kernel_name);
  if (valid != GEMMGEN_OK) {
    return valid;
  }
  int64_t const feature_blocks = (a.n + K::kRows * K::kWarpsN - 1) / (K::kRows * K::kWarpsN);
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
                   static_cast<cudaStream_t>(stream), pdl, make_params(a));
  cudaError_t const launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
  }
  return GEMMGEN_OK;
}

}  // namespace gemmgen::mixed::direct
