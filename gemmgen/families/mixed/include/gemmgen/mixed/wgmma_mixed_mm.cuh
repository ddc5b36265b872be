/*
 * gemmgen/mixed/wgmma_mixed_mm.cuh — the mixed-input family's sm90a kernel for a few dozen to a
 * few hundred tokens: the int4 weights dequantized in registers and fed to wgmma as its register
 * operand A, the tokens' activations read by wgmma from shared memory as B. It reads the same
 * packed weight as the other kernels (layout version 2: blocks of 16 rows x 64 k in the MMA's
 * fragment order), so dispatch can pick it per M.
 *
 * Why. The direct kernel (direct_mixed_mm.cuh) runs mma.sync, whose rate on Hopper is about half
 * of wgmma's: past ~32 tokens its MMAs cost more than the weight read. CUTLASS's mixed-input
 * collective runs wgmma but was measured at 3.6x the weight-read floor at 64 tokens (it stages
 * scales per K block and converts with more instructions a value). Here:
 *   Dᵀ[features, tokens] = dequant(W)[features, K] · Xᵀ[K, tokens]
 * A CTA owns 64·WarpGroups features (each warpgroup 64, the wgmma's M) and Tokens tokens (its N)
 * and one range of K; a 64-K chunk of the weights (32 bytes a feature) and of the tokens (128
 * bytes a token, XOR-swizzled in 16-byte pieces by token % 8: wgmma's 128-byte swizzle, K-major)
 * streams through a cp.async ring of Stages chunks filled by all the CTA's threads.
 *
 * Registers. wgmma's A fragment gives lane (g, q) of warp w rows 16w+g and 16w+g+8 and, per 16-K
 * step j, k = 16j+2q, 16j+2q+1 and k+8, k+9. The packed layout holds exactly these values of a
 * row block's 64-K chunk in the lane's 16 bytes of the block (one 16-byte load), step j's four
 * registers in word j, register i in nibbles i and i + 4: a shift puts them in bits 0-3 and 16-19
 * (layout version 1 took four loads and a byte permute a register); one LOP3 puts them under the exponent of
 * 128 (bf16) or 1024 (fp16), XOR-ing each with 8: B + 8 + stored, exact; one packed FMA (bf16)
 * or subtraction (fp16) takes B + 8 off (stored, exact) and one packed multiply or FMA applies
 * the group's scale (and
 * the packed zero term −scale·(zero − 8)), rounded once to 16 bits as CUTLASS's mixed-input
 * kernels do. The group's factors travel with the chunk (a cp.async of the CTA's rows into the
 * ring slot), so the loop has no global load; this needs N a multiple of 8 (as the op does).
 * Group 32 (GroupK 32, the `_g32` schemes): a chunk holds two groups, both groups' factors
 * travel with it, and steps 0-1 (k 0-31) take the first one's.
 *
 * Pipeline. wgmma reads its A registers while it runs: a register it reads may be rewritten only
 * after a wait_group retires it (ptxas does not check this across loop iterations: one register
 * set rewritten while the last chunk's wgmmas ran gave wrong sums, more often with wider tiles).
 * So chunks alternate between two fragment sets, the loop body written twice: chunk i's four
 * wgmmas are issued as one group, wait_group 1 retires chunk i − 1's, and the next chunk is
 * converted into that set while the tensor cores run chunk i. Before that conversion, chunk
 * i + 1's slot is waited for (cp.async, proxy fence, barrier) and chunk i + Stages − 1 queued
 * into the slot of chunk i − 1, retired by then in every warpgroup. A ring of 7 or 8 chunks
 * waits and queues every second chunk instead (`SyncChunks` 2: chunks i + 1 and i + 2 waited
 * for with one barrier, chunks i + Stages − 2 and i + Stages − 1 queued into the slots of
 * i − 2 and i − 1): half the barriers and proxy fences for one chunk less in flight, measured
 * at 17-32 tokens ([64, 32], 8 chunks) 1.3-2.5% faster with GPTQ and 0.2-1.3% with AWQ on both
 * GPUs; on a 5-chunk ring the lost chunk in flight cost up to 17% where one CTA holds an SM
 * (8192 x 28672 at 64 tokens, H200; session 22; 6-chunk rings were not measured).
 *
 * Measured (benchmarks/RESULTS.md): 1.65x bf16 mm at 64 tokens with [128, 64] tiles on the
 * H100 (session 17), ahead of CUTLASS stream-K (1.52x), so dispatch picks it at 33-64 tokens; it
 * was 1.50x before session 17's two changes below (ncu at 64 tokens on 4096 x 4096, K split 5
 * ways: ~40% of the warps' stall samples were the split's epilogue, each register read from
 * every CTA with one or two round trips of its own; ~15% the prologue). A [256, 64] tile (four
 * warpgroups, the tokens' shared-memory traffic halved) measured 1.20x: one CTA an SM hides
 * less latency than two of [128, 64]. Session 12 measured that the best K split per shape (the
 * tuner's split knob) gains ~12% at 64 tokens over the launch-time rule below. 136+ registers
 * at 128 tokens a tile leave one CTA an SM.
 *
 * PDL. The prologue queues its chunks' weight and factor copies before griddepcontrol.wait (the
 * packed weights never come from the kernel before), the tokens' after it; the first commit
 * group holds every prologue chunk's weights.
 *
 * K split. Few feature tiles (N = 4096 makes 32 of 128 features) would leave most SMs idle, so
 * the K range is split over the CTAs of a thread-block cluster (1, 1, S), S chosen at launch for
 * the fewest tiles' worth of work an SM (or `split_k_slices`). Each CTA leaves its fp32 partial
 * sums in its shared memory; after a cluster barrier CTA r adds slice r of every CTA's sums in
 * rank order (distributed shared memory: a 16-byte piece from every CTA at once) and writes it:
 * bit-identical run to run, no workspace, no second kernel.
 */
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "cute/arch/copy_sm80.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"

#include "gemmgen/c_api.h"
#include "gemmgen/mixed/direct_mixed_mm.cuh"
#include "gemmgen/mixed/mixed_mm_args.h"
#include "gemmgen/runtime_support.hpp"

namespace gemmgen::mixed::wgmma {

using direct::cp_async16;
using direct::lds128;
using direct::Params;

template <class ElementA_, class ElementW_, bool WithZero_, int WarpGroups_, int Tokens_,
          int Stages_, int GroupK_ = 64, int CtasPerSm_ = 1, int SyncChunks_ = (Stages_ >= 7 ? 2 : 1)>
struct WgmmaConfig {
  using ElementA = ElementA_;  // activations = MMA, scale, zero and output type
  using ElementW = ElementW_;  // cutlass::int4b_t
  static constexpr bool WithZero = WithZero_;
  static constexpr int WarpGroups = WarpGroups_;  // 64 features each
  static constexpr int Tokens = Tokens_;          // the wgmma's N
  static constexpr int Stages = Stages_;
  // The group sizes it serves: 64 (multiples of 64 dividing K) or 32 (group 32 exactly)
  static constexpr int GroupK = GroupK_;
  // CTAs an SM must hold at once (__launch_bounds__' minimum: 2 caps two warpgroups' threads at
  // 128 registers)
  static constexpr int CtasPerSm = CtasPerSm_;
  static constexpr int SyncChunks = SyncChunks_;  // chunks made ready by one ring barrier
};

inline constexpr int kMaxSplits = 8;  // the portable cluster size

// The K split's cluster (1, 1, S): the partial sums moved through distributed shared memory
// (barriers: smem::cluster_sync, smem::cluster_sync_relaxed).
__device__ __forceinline__ void store_shared4(uint32_t addr, float const* v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};"
               :: "r"(addr), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]) : "memory");
}
// The 16 bytes at shared address `addr` of the cluster's CTA `rank`.
__device__ __forceinline__ void load_from_cta4(uint32_t addr, uint32_t rank, float (&v)[4]) {
  uint32_t const remote = smem::cluster_address(addr, rank);
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "r"(remote) : "memory");
}

// The K split's sums: once every wgmma has retired, each thread that holds sums leaves its
// registers in its CTA's shared memory, four (one token tile) a 16-byte piece, piece j of every
// thread together; after a cluster barrier, CTA `rank` owns a range of pieces and adds each over
// every CTA (this function), then a relaxed cluster barrier keeps every CTA until the others'
// reads have returned (relaxed: a release would also wait for this CTA's global stores to drain).
//
// add_split_piece: piece `addr` of every CTA of the cluster (S = `splits`), read at once (one
// round trip) and added in rank order: bit-identical run to run.
__device__ __forceinline__ void add_split_piece(uint32_t addr, int splits, float (&sum)[4]) {
  float parts[kMaxSplits][4];
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < kMaxSplits; ++s) {
    if (s < splits) {
      load_from_cta4(addr, s, parts[s]);
    }
  }
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < 4; ++i) {
    sum[i] = 0.f;
  }
  CUTLASS_PRAGMA_UNROLL
  for (int s = 0; s < kMaxSplits; ++s) {  // rank order
    if (s < splits) {
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        sum[i] += parts[s][i];
      }
    }
  }
  // the sums exist here, whether or not they are stored (tokens past M): every remote read has
  // returned before the exit barrier (a volatile asm keeps its place among them)
  asm volatile("" ::"f"(sum[0]), "f"(sum[1]), "f"(sum[2]), "f"(sum[3]));
}

template <class Config>
struct WgmmaMixedMm {
  using ElementA = typename Config::ElementA;
  using ElementW = typename Config::ElementW;
  static_assert(cutlass::sizeof_bits<ElementW>::value == 4, "the wgmma kernel reads int4 weights");
  static constexpr bool kWithZero = Config::WithZero;
  static constexpr int kWarpGroups = Config::WarpGroups;
  static constexpr int kTokens = Config::Tokens;
  static constexpr int kStages = Config::Stages;
  static constexpr int kSyncChunks = Config::SyncChunks;
  static_assert(Config::GroupK == 64 || Config::GroupK == 32, "groups of a multiple of 64, or 32");
  // Groups a chunk holds: 1, or 2 with group 32 (wgmma steps 0-1 take the first one's factors)
  static constexpr int kHalves = 64 / Config::GroupK;
  static_assert(kWarpGroups == 1 || kWarpGroups == 2, "one or two warpgroups a CTA");
  static_assert(kTokens % 8 == 0 && kTokens >= 8 && kTokens <= 256, "tokens: 8 to 256, by 8");
  static_assert(kSyncChunks == 1 || kSyncChunks == 2, "one or two chunks a ring barrier");
  static_assert(kStages >= 2 * kSyncChunks + 1 && kStages <= 8,
                "a ring of 3 (5 with two chunks a barrier) to 8 chunks");

  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kRows = 64 * kWarpGroups;  // features a CTA
  static constexpr int kStepK = 64;               // K a chunk
  static constexpr int kWeightRowBytes = kStepK / 2;
  static constexpr int kBlockBytes = 16 * kWeightRowBytes;  // a row block's chunk: 16 rows
  static constexpr int kWeightStageBytes = kRows * kWeightRowBytes;
  static constexpr int kActRowBytes = kStepK * 2;  // one 128-byte swizzle row a token
  static constexpr int kActStageBytes = kTokens * kActRowBytes;  // a multiple of 1024
  // Chunks queued ahead of the one converted. At the barrier before chunk i every warpgroup has
  // retired chunk i - 2 (chunk i - 1's wgmmas may run): chunk i + kAhead + kSyncChunks - 1
  // reuses the slot of chunk i - 2 at the latest.
  static constexpr int kAhead = kStages - 1 - kSyncChunks;
  static constexpr int kActRingBytes = kStages * kActStageBytes;
  static constexpr int kWeightRingBytes = kStages * kWeightStageBytes;
  // a chunk's group factors: the CTA's rows' scales of each of its groups, then their zero terms
  static constexpr int kFactorRowsBytes = kRows * 2;  // one group's factors of one kind
  static constexpr int kFactorStageBytes = kFactorRowsBytes * kHalves * (kWithZero ? 2 : 1);
  static constexpr int kFactorSegs = kFactorStageBytes / 16;  // copied by threads 0 .. segs-1
  static_assert(kFactorSegs <= kThreads);
  static constexpr int kRingBytes = kActRingBytes + kWeightRingBytes + kStages * kFactorStageBytes;
  static constexpr int kAccRegs = kTokens / 2;  // 64 × Tokens fp32 over a warpgroup's 128 threads
  static constexpr int kPartialBytes = kAccRegs * kThreads * 4;
  // + 1024: the ring is placed at the first 1024-byte boundary (the swizzle's period)
  static constexpr int kSmemBytes = (kRingBytes > kPartialBytes ? kRingBytes : kPartialBytes) + 1024;
  static constexpr int kActSegs = kTokens * kActRowBytes / 16;
  static constexpr int kActCopies = (kActSegs + kThreads - 1) / kThreads;
  static_assert(kRows * kWeightRowBytes / 16 == kThreads, "one weight copy a thread and chunk");

  static constexpr bool kIsBf16 = cute::is_same_v<ElementA, cutlass::bfloat16_t>;
  using Mma = decltype(cute::SM90::GMMA::rs_op_selector<
                       ElementA, ElementA, float, cute::Shape<cute::_64, cute::Int<kTokens>, cute::_16>,
                       cute::SM90::GMMA::Major::K, cute::SM90::GMMA::Major::K>());
  static_assert(sizeof(typename Mma::CRegisters) == kAccRegs * sizeof(float),
                "no wgmma of N = Tokens: use a multiple of 16 up to 256");

  // B + 8 in both halves: the exponent of 128 (bf16) or 1024 (fp16), and the nibble's XOR
  static constexpr uint32_t kMagic = kIsBf16 ? 0x43084308u : 0x64086408u;
  static constexpr uint32_t kOnes = kIsBf16 ? 0x3F803F80u : 0x3C003C00u;

  static __device__ uint32_t lds16(uint32_t addr) {
    uint16_t v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr) : "memory");
    return v;
  }

  // One register of the A fragment, its two int4 in bits 0-3 and 16-19 of `pair` (the word
  // shifted), dequantized to two 16-bit floats: scale · stored (+ zero term), `scale2`/`zero2`
  // the row's in both halves.
  static __device__ uint32_t dequant(uint32_t pair, uint32_t scale2, uint32_t zero2) {
    uint32_t x;
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(x) : "r"(pair), "n"(0x000F000F), "n"(kMagic));
    if constexpr (kIsBf16) {
      asm("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(x) : "r"(kOnes), "r"(kMagic ^ 0x80008000u));
      if constexpr (kWithZero) {
        asm("fma.rn.bf16x2 %0, %0, %1, %2;" : "+r"(x) : "r"(scale2), "r"(zero2));
      } else {
        asm("mul.rn.bf16x2 %0, %0, %1;" : "+r"(x) : "r"(scale2));
      }
    } else {
      asm("sub.f16x2 %0, %0, %1;" : "+r"(x) : "r"(kMagic));
      if constexpr (kWithZero) {
        asm("fma.rn.f16x2 %0, %0, %1, %2;" : "+r"(x) : "r"(scale2), "r"(zero2));
      } else {
        asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(x) : "r"(scale2));
      }
    }
    return x;
  }

  template <size_t... I>
  static __device__ void mma(uint32_t const (&a)[4], uint64_t desc, float (&acc)[kAccRegs],
                             std::index_sequence<I...>) {
    Mma::fma(a[0], a[1], a[2], a[3], desc, acc[I]..., cute::SM90::GMMA::ScaleOut::One);
  }

  static __device__ void kernel_body(Params const& p, char* smem_raw) {
    int const tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    int const g = lane / 4, q = lane % 4;
    int const t0 = blockIdx.x * kTokens, n0 = blockIdx.y * kRows;
    int const splits = gridDim.z, rank = blockIdx.z;  // clusters (1, 1, splits): rank = z
    uint32_t const raw = cute::cast_smem_ptr_to_uint(smem_raw);
    uint32_t const smem = (raw + 1023u) & ~1023u;
    uint32_t const act_ring = smem, weight_ring = smem + kActRingBytes;
    uint32_t const factor_ring = weight_ring + kWeightRingBytes;

    int const chunks = p.k / kStepK;
    int const c_begin = static_cast<int>(int64_t(chunks) * rank / splits);
    int const c_end = static_cast<int>(int64_t(chunks) * (rank + 1) / splits);
    int const count = c_end - c_begin;

    // This thread's copies a chunk: one 16-byte piece of a weight row block (blocks [K/64]
    // [ceil(N/16)] of 512 bytes, stored in the slot as in global memory), kActCopies of the
    // tokens (blocks past N and rows past M zero-filled, their source one that exists).
    int const w_block = tid / 32;
    int64_t const row_blocks = (p.n + 15) / 16;
    bool const w_ok = n0 + 16 * w_block < p.n;
    unsigned char const* w_src =
        p.w + (int64_t(c_begin) * row_blocks + (w_ok ? n0 / 16 + w_block : 0)) * kBlockBytes +
        (tid % 32) * 16;
    uint32_t const w_dst = w_block * kBlockBytes + (tid % 32) * 16;
    unsigned char const* a_src[kActCopies];
    uint32_t a_dst[kActCopies], a_bytes[kActCopies];
    bool a_mine[kActCopies];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kActCopies; ++j) {
      int const i = tid + kThreads * j;
      a_mine[j] = kActSegs % kThreads == 0 || i < kActSegs;  // every thread's, or a check
      int const row = (a_mine[j] ? i : 0) / 8, seg = i % 8;
      bool const ok = a_mine[j] && t0 + row < p.m;
      a_bytes[j] = ok ? 16 : 0;
      a_src[j] = static_cast<unsigned char const*>(p.a) +
                 (int64_t(ok ? t0 + row : 0) * p.lda + int64_t(c_begin) * kStepK + seg * 8) *
                     int64_t(sizeof(ElementA));
      a_dst[j] = row * kActRowBytes + ((seg ^ (row & 7)) * 16);
    }
    // The factors' copy of this thread (threads below kFactorSegs): 8 rows of the scales or the
    // zero terms of the chunk's group, or with group 32 of one of its two groups (`f_half`)
    // (run() checked that N is a multiple of 8 and the factors 16-byte aligned; a segment past N
    // is zero-filled). The factors advance by a unit: a group, or a chunk's two groups.
    int const chunks_per_group = kHalves == 2 ? 1 : p.group / kStepK;
    bool const f_zero = kWithZero && tid >= kFactorSegs / 2;
    int const f_row = (tid % (kRows / 8)) * 8;  // first of the segment's rows
    int const f_half = (tid / (kRows / 8)) % kHalves;
    int issue_group = c_begin / chunks_per_group;  // the unit of the next chunk to queue
    int issue_group_left = chunks_per_group - (c_begin - issue_group * chunks_per_group);
    bool const f_ok = n0 + f_row < p.n;
    uint16_t const* f_src =
        static_cast<uint16_t const*>(f_zero ? p.zero : p.scale) +
        (f_ok ? (int64_t(issue_group) * kHalves + f_half) * p.n + n0 + f_row : 0);
    uint32_t const f_dst = ((f_zero ? kHalves : 0) + f_half) * kFactorRowsBytes + f_row * 2;
    // Queue the next chunk's copies into ring slot `slot` (the sources advance a chunk a call):
    // the weights and their group's factors, then the tokens. The first never depend on the
    // kernel before (packed weights are constant), so the prologue queues them before the PDL
    // wait and the weight read overlaps the previous kernel's tail.
    auto issue_weights = [&](int slot) {
      cp_async16(weight_ring + slot * kWeightStageBytes + w_dst, w_src, w_ok ? 16u : 0u);
      w_src += row_blocks * kBlockBytes;
      if (tid < kFactorSegs) {
        cp_async16(factor_ring + slot * kFactorStageBytes + f_dst, f_src, f_ok ? 16u : 0u);
      }
      if (--issue_group_left == 0) {
        ++issue_group;
        issue_group_left = chunks_per_group;
        if (f_ok) {
          f_src += kHalves * p.n;
        }
      }
    };
    auto issue_tokens = [&](int slot) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kActCopies; ++j) {
        if (a_mine[j]) {
          cp_async16(act_ring + slot * kActStageBytes + a_dst[j], a_src[j], a_bytes[j]);
        }
        a_src[j] += kActRowBytes;
      }
    };
    // Prologue: kAhead chunks in flight, a commit group each (the first also holds every
    // prologue chunk's weights: a wait for chunk i still covers its weights).
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kAhead; ++s) {
      if (s < count) {
        issue_weights(s);
      }
    }
    pdl_wait();  // the activations may come from the previous kernel; its reads of our output
    pdl_release();
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kAhead; ++s) {
      if (s < count) {
        issue_tokens(s);
      }
      cute::cp_async_fence();
    }

    // This lane's rows (tile-local): 16w + g and 16w + g + 8 of its warpgroup's 64.
    int const row_lo = 16 * warp + g;  // warp counts over both warpgroups: 64·wg + 16·(warp % 4)
    int const n_lo = n0 + row_lo, n_hi = n_lo + 8;

    float acc[kAccRegs];
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kAccRegs; ++r) {
      acc[r] = 0.f;
      cute::warpgroup_fence_operand(acc[r]);
    }
    uint32_t const weight_lane = weight_ring + warp * kBlockBytes + lane * 16;  // its block: warp's
    // The pipeline. wgmma reads its A registers while it runs, and a register it reads may be
    // rewritten only after a wait_group that retires it; the compiler keeps two chunks' A
    // fragments in distinct registers only if the code says so. So chunks alternate between two
    // fragment sets (the loop body twice): chunk i's four wgmmas are issued and committed, then
    // wait_group 1 retires chunk i − 1's, whose set the next chunk is converted into while the
    // tensor cores run chunk i; before that conversion, chunk i + 1's ring slot is waited for
    // and chunk i + Stages − 1 queued into the slot of chunk i − 1 (retired before the barrier),
    // or with kSyncChunks 2, every second chunk, chunks i + 1 and i + 2 waited for and two queued
    // (see the file's comment).
    constexpr int kSteps = kStepK / 16;
    // Up to 32 tokens a tile the loop is unrolled over kUnroll chunks, a whole number of rings
    // and of fragment-set pairs: chunk u of an unrolled round uses ring slot u % kStages and
    // fragment set u % 2, so every shared-memory address and descriptor in the loop is a
    // constant offset from the ring (143 -> 118 instructions a chunk for [64, 32]: 3-7% faster
    // at 17-32 tokens on both GPUs). With 64 tokens and more the loop body stays two chunks with
    // the slots counted at run time: unrolled, [128, 64] measured 1-2.5% slower (GPTQ, 33-64
    // tokens, H100 and H200; session 22).
    constexpr bool kUnrolled = kTokens <= 32;
    constexpr int kUnroll = !kUnrolled ? 2 : kStages % 2 == 0 ? kStages : 2 * kStages;
    static_assert(kUnroll % kSyncChunks == 0, "a round ends on a barrier chunk");
    int read_slot = 0, write_slot = kAhead;  // the rolled loop's slots (of the next chunk)
    uint64_t const desc_ring = smem::sw128_k_major_descriptor(act_ring);  // slot 0, step 0
    // Chunk i at position u of a round: every kSyncChunks chunks wait for the slots of chunks
    // i .. i + kSyncChunks - 1 (one barrier for them all) and queue chunks i + kAhead .. (a
    // commit group each); then convert chunk i's fragments into `a`.
    auto load_chunk = [&](int i, int u, uint32_t (&a)[kSteps][4]) {
      if (kSyncChunks == 1 || i % kSyncChunks == 0) {
        smem::cp_async_wait_for_wgmma<kAhead - kSyncChunks>();
        CUTLASS_PRAGMA_UNROLL
        for (int c = 0; c < kSyncChunks; ++c) {
          if (i + kAhead + c < count) {
            issue_weights(kUnrolled ? (u + kAhead + c) % kStages : write_slot);
            issue_tokens(kUnrolled ? (u + kAhead + c) % kStages : write_slot);
          }
          cute::cp_async_fence();
          write_slot = write_slot + 1 == kStages ? 0 : write_slot + 1;
        }
      }
      int const slot = kUnrolled ? u % kStages : read_slot;
      uint4 const packed = lds128(weight_lane + slot * kWeightStageBytes);
      uint32_t const words[kSteps] = {packed.x, packed.y, packed.z, packed.w};
      // this lane's rows' factors of the chunk's group (or groups), in both halves of a word
      uint32_t const factor_slot = factor_ring + slot * kFactorStageBytes + row_lo * 2;
      uint32_t scale_lo[kHalves], scale_hi[kHalves], zero_lo[kHalves], zero_hi[kHalves];
      CUTLASS_PRAGMA_UNROLL
      for (int h = 0; h < kHalves; ++h) {
        uint32_t const at = factor_slot + h * kFactorRowsBytes;
        scale_lo[h] = lds16(at) * 0x10001u;
        scale_hi[h] = lds16(at + 16) * 0x10001u;
        zero_lo[h] = zero_hi[h] = 0u;
        if constexpr (kWithZero) {
          zero_lo[h] = lds16(at + kHalves * kFactorRowsBytes) * 0x10001u;
          zero_hi[h] = lds16(at + kHalves * kFactorRowsBytes + 16) * 0x10001u;
        }
      }
      read_slot = read_slot + 1 == kStages ? 0 : read_slot + 1;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSteps; ++j) {  // registers 0, 2: row g; 1, 3: row g + 8
        int const h = j * kHalves / kSteps;  // step j's group of the chunk (k 16j .. 16j + 15)
        a[j][0] = dequant(words[j], scale_lo[h], zero_lo[h]);
        a[j][1] = dequant(words[j] >> 4, scale_hi[h], zero_hi[h]);
        a[j][2] = dequant(words[j] >> 8, scale_lo[h], zero_lo[h]);
        a[j][3] = dequant(words[j] >> 12, scale_hi[h], zero_hi[h]);
      }
    };
    // Issue the wgmmas of the chunk at position u (its tokens in slot u % kStages, or the slot
    // before read_slot: the start address field, in 16-byte units, moves by the slot's offset
    // and 32 bytes a step; it never overflows its 14 bits in 227 KB) and retire the previous
    // chunk's.
    auto run_chunk = [&](int u, uint32_t (&a)[kSteps][4]) {
      int const slot = kUnrolled ? u % kStages : (read_slot == 0 ? kStages - 1 : read_slot - 1);
      uint64_t const desc =
          kUnrolled ? desc_ring + uint64_t(slot * (kActStageBytes / 16))
                    : smem::sw128_k_major_descriptor(act_ring + slot * kActStageBytes);
      cute::warpgroup_arrive();  // the fragments were just written
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < kSteps; ++j) {
        mma(a[j], desc + 2 * j, acc, std::make_index_sequence<kAccRegs>{});
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<1>();
    };
    uint32_t a_even[kSteps][4], a_odd[kSteps][4];  // chunk u of a round: even or odd u
    if (count > 0) {
      load_chunk(0, 0, a_even);
    }
    if constexpr (kUnrolled) {
      for (int round = 0; round < count; round += kUnroll) {
        CUTLASS_PRAGMA_UNROLL
        for (int u = 0; u < kUnroll; ++u) {
          int const i = round + u;
          if (i < count) {
            run_chunk(u, u % 2 == 0 ? a_even : a_odd);
            if (i + 1 < count) {
              load_chunk(i + 1, (u + 1) % kUnroll, u % 2 == 0 ? a_odd : a_even);
            }
          }
        }
      }
    } else {
      for (int i = 0; i < count; i += 2) {
        run_chunk(0, a_even);
        if (i + 1 < count) {
          load_chunk(i + 1, 1, a_odd);
          run_chunk(1, a_odd);
          if (i + 2 < count) {
            load_chunk(i + 2, 0, a_even);
          }
        }
      }
    }
    cute::warpgroup_wait<0>();
    CUTLASS_PRAGMA_UNROLL
    for (int r = 0; r < kAccRegs; ++r) {
      cute::warpgroup_fence_operand(acc[r]);
    }

    // Register r of the accumulator: token tile r / 4, row lo (r % 4 < 2) or hi, token 2q or
    // 2q + 1 of the tile. The bias of this lane's two rows is read once.
    ElementA const* bias = static_cast<ElementA const*>(p.bias);
    ElementA* d = static_cast<ElementA*>(p.d);
    float bias_lo = 0.f, bias_hi = 0.f;
    if (bias != nullptr) {
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
      CUTLASS_PRAGMA_UNROLL
      for (int r = 0; r < kAccRegs; ++r) {
        store(r, acc[r]);
      }
      return;
    }
    // The K split's sums (see add_split_piece): the ring becomes the partial sums.
    cute::cp_async_wait<0>();
    __syncthreads();  // every warpgroup's wgmmas are done
    constexpr int kPieces = kAccRegs / 4;
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kPieces; ++j) {
      store_shared4(smem + uint32_t(j * kThreads + tid) * 16u, acc + 4 * j);
    }
    smem::cluster_sync();  // every CTA's partial sums are written
    int const j_begin = kPieces * rank / splits, j_end = kPieces * (rank + 1) / splits;
    for (int j = j_begin; j < j_end; ++j) {
      float sum[4];
      add_split_piece(smem + uint32_t(j * kThreads + tid) * 16u, splits, sum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < 4; ++i) {
        store(4 * j + i, sum[i]);
      }
    }
    smem::cluster_sync_relaxed();
  }
};

template <class Config>
__global__ void __launch_bounds__(WgmmaMixedMm<Config>::kThreads, Config::CtasPerSm)
    wgmma_mixed_mm_kernel(Params const params) {
  extern __shared__ __align__(1024) char smem[];
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  WgmmaMixedMm<Config>::kernel_body(params, smem);  // it waits for the previous kernel
#endif
}

// The K split: the fewest CTAs of a cluster (1 to 8) that give every SM a tile's share of work
// (tiles × S ≥ SMs), with at least 4 chunks a CTA; `forced` > 1 (the split_k_slices knob) wins,
// capped at 8 and at the chunks. (Balancing the busiest SM's tiles over every S instead chose
// 5-7 on shapes with more tiles than SMs, where two CTAs an SM already overlap: measured up to
// 1.7x slower than no split on the H100.)
inline int choose_splits(int64_t tiles, int chunks, int sms, int forced) {
  int const most = chunks / 4 < 1 ? 1 : (chunks / 4 < kMaxSplits ? chunks / 4 : kMaxSplits);
  if (forced > 1) {
    int const capped = forced < kMaxSplits ? forced : kMaxSplits;
    return capped < chunks ? capped : chunks;
  }
  int64_t const wanted = (sms + tiles - 1) / tiles;
  return static_cast<int>(wanted < most ? wanted : most);
}

template <class Config>
int run(gemmgen_mixed_mm_args const* args, void*, size_t, void* stream, char const* kernel_name) {
  using K = WgmmaMixedMm<Config>;
  auto const& a = *args;
  int const valid = direct::check_args(a, K::kWithZero, Config::GroupK, kernel_name);
  if (valid != GEMMGEN_OK) {
    return valid;
  }
  int64_t const feature_tiles = (a.n + K::kRows - 1) / K::kRows;
  int64_t const token_tiles = (a.m + K::kTokens - 1) / K::kTokens;
  if (feature_tiles > 65535) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, "N too large for the launch grid");
  }
  static std::atomic<bool> raised[detail::kMaxDevices] = {};
  int const allowed =
      allow_shared_memory_once(wgmma_mixed_mm_kernel<Config>, K::kSmemBytes, raised, kernel_name);
  if (allowed != GEMMGEN_OK) {
    return allowed;
  }
  int const sms = hardware_info().sm_count;
  int const splits = choose_splits(feature_tiles * token_tiles,
                                   static_cast<int>(a.k / K::kStepK), sms, a.split_k_slices);
  dim3 const grid(static_cast<unsigned>(token_tiles), static_cast<unsigned>(feature_tiles),
                  static_cast<unsigned>(splits));
  bool const pdl = (a.launch_flags & GEMMGEN_LAUNCH_PDL) != 0;
  cudaError_t launched = launch_clustered_maybe_pdl(
      wgmma_mixed_mm_kernel<Config>, grid, dim3(K::kThreads), K::kSmemBytes,
      static_cast<cudaStream_t>(stream), pdl, dim3(1, 1, splits), direct::make_params(a));
  cudaError_t const last = cudaGetLastError();
  launched = launched != cudaSuccess ? launched : last;
  if (launched != cudaSuccess) {
    return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
  }
  return GEMMGEN_OK;
}

}  // namespace gemmgen::mixed::wgmma
