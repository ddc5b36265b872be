/*
 * gemmgen/moe/swiglu_quant.cuh — the device kernels of the MoE op around its grouped GEMM:
 *
 *   group_setup   reads the group list on the device (scan_groups) and writes the grouped
 *                 GEMM's per-expert problem sizes, operand pointers and strides (no host
 *                 synchronisation, so the op can be captured in a CUDA graph, and empty experts
 *                 cost nothing);
 *   swiglu_quant  (unfused kernels) SwiGLU of the GEMM result C and dynamic per-row
 *                 quantization (int8 or e4m3): short rows (N/2 <= 1536) one to eight warps a row
 *                 (swiglu_quant_split_rows), longer ones split over a cluster of CTAs when they
 *                 are few, several a CTA when they are many (launch_swiglu_quant);
 *   quantize_rows (fused kernels) quantization of S, whose row maxima the GEMM's epilogue
 *                 already reduced (sm90_swiglu_rowmax_store.hpp), one to many warps a row;
 *
 * and check_call, the host checks every kernel of the op makes before it launches.
 *
 * C's columns come in (act, gate) pairs, act and gate interleaved by the packer (packing.py):
 * C[:, 2j] is act column j, C[:, 2j + 1] gate column j. All are deterministic: the row maximum
 * is order-independent, every other value has one writer.
 */
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <cub/block/block_scan.cuh>

#include "cute/layout.hpp"
#include "cutlass/fast_math.h"
#include "cutlass/float8.h"
#include "cutlass/numeric_types.h"

#include "gemmgen/moe/moe_args.h"
#include "gemmgen/runtime_support.hpp"
#include "gemmgen/shared_memory.cuh"

namespace gemmgen::moe {

// The call's packed-weight layout is the one the library was built for, and the workspace holds
// the kernel's `needed` bytes. GEMMGEN_OK, or the failure recorded by fail().
inline int check_call(gemmgen_moe_args const* p, void* workspace, size_t workspace_bytes,
                      size_t needed, char const* kernel_name) {
  if (p->layout_version != GEMMGEN_MOE_LAYOUT_VERSION) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "the packed weight's layout version differs from the one this library was "
                "built for (re-pack the weights, or rebuild with `gemmgen build`)");
  }
  if (workspace == nullptr || workspace_bytes < needed) {
    return fail(GEMMGEN_WORKSPACE_TOO_SMALL, kernel_name, "workspace smaller than required");
  }
  return GEMMGEN_OK;
}

// ------------------------------------------------------------------------------- group setup

// Per-expert arrays the grouped GEMM reads (device memory, carved from the workspace). The
// kernel's M and N depend on swap-AB: tokens × N, or N × tokens (the weight as operand A).
template <class ProblemShape, class ElementA_, class ElementB_, class ElementD, class StrideA,
          class StrideB, class StrideD>
struct GroupArrays {
  using ElementA = ElementA_;
  using ElementB = ElementB_;
  ProblemShape* shapes;
  ElementA const** a;
  ElementB const** b;
  ElementD** d;                  // per group: C (unfused) or S (fused) of its first row
  float const** x_scales;        // per group: its tokens' x_scale
  float const** w_scales;        // per group: its expert's w_scale row
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  int64_t* rows_total;           // end of the last group: rows past it are outside every group
  uint32_t** row_max;            // fused: per group, the max|S| bits of its first row
  uint32_t* row_max_bits;        // fused: [M] max|S| bits per row (zeroed before the GEMM)
};

constexpr int kSetupThreads = 256;

// The group-list scan, run by one block of Threads threads (kSetupThreads unless the caller
// says): calls visit(i, start, end, active) for every expert i (each by one thread), `active`
// being the number of non-empty experts before i, and writes (each unless null) the end of the
// last group to *rows_total and the number of non-empty experts to *active_total. Ends are
// clamped exactly as grouping.group_offsets(check=False) does:
//   count:  ends = min(cumsum(clamp(g, 0, m)), m);  cumsum: ends = running max of clamp(g, 0, m)
// so 0 <= start_i <= end_i <= m whatever the list holds. Both are block-wide scans (CUB), Threads
// experts a step.
struct MaxOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a > b ? a : b; }
};
struct SumOp {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a + b; }
};

template <int Threads = kSetupThreads, class Visit>
__device__ void scan_groups(int64_t const* group_list, int32_t cumsum, int64_t experts, int64_t m,
                            int64_t* rows_total, int64_t* active_total, Visit&& visit) {
  using Scan = cub::BlockScan<int64_t, Threads, cub::BLOCK_SCAN_WARP_SCANS>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t ends[Threads];
  int64_t carry = 0;         // count: the unclamped sum so far; cumsum: the running max
  int64_t last_end = 0;      // the end of the last group seen so far
  int64_t active_carry = 0;  // non-empty experts seen so far
  for (int64_t base = 0; base < experts; base += Threads) {
    int64_t const i = base + threadIdx.x;
    int64_t v = 0;  // past the last expert: adds nothing to either scan
    if (i < experts) {
      int64_t const g = group_list[i];
      v = g < 0 ? 0 : (g > m ? m : g);
    }
    int64_t scanned, aggregate;
    if (cumsum) {
      Scan(temp).InclusiveScan(v, scanned, MaxOp{}, aggregate);
    } else {
      Scan(temp).InclusiveScan(v, scanned, SumOp{}, aggregate);
    }
    int64_t end;
    if (cumsum) {
      end = scanned > carry ? scanned : carry;
      carry = aggregate > carry ? aggregate : carry;
    } else {
      end = carry + scanned > m ? m : carry + scanned;
      carry += aggregate;
    }
    ends[threadIdx.x] = end;
    __syncthreads();
    int64_t const start = threadIdx.x > 0 ? ends[threadIdx.x - 1] : last_end;
    int64_t const chunk_end = ends[Threads - 1];
    int64_t before, active;
    __syncthreads();  // temp and ends are reused
    Scan(temp).ExclusiveSum(int64_t(i < experts && end > start), before, active);
    if (i < experts) {
      visit(i, start, end, active_carry + before);
    }
    last_end = chunk_end;
    active_carry += active;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (rows_total != nullptr) {
      rows_total[0] = last_end;
    }
    if (active_total != nullptr) {
      active_total[0] = active_carry;
    }
  }
}

// The blocks group_setup adds to write `count` zeros (kSetupZeros a thread, at most a wave of
// an H100's SMs): a fused kernel's row maxima, zeroed in the setup's launch instead of by a
// memset of their own (a graph node and ~1.4 µs fewer, H200, session 55).
constexpr int kSetupZeros = 16;
inline int64_t setup_zero_blocks(int64_t count) {
  int64_t const blocks = (count + kSetupThreads * kSetupZeros - 1) / (kSetupThreads * kSetupZeros);
  return blocks < 132 ? blocks : 132;
}

// `count` zeros to `words`, the share of block `block` of `blocks` (the setup launches' blocks
// after their first: the fused kernels' row maxima, which their epilogues' atomics build).
__device__ __forceinline__ void zero_words(uint32_t* words, int64_t count, int64_t block,
                                           int64_t blocks) {
  int64_t const step = blocks * blockDim.x;
  for (int64_t i = block * blockDim.x + threadIdx.x; i < count; i += step) {
    words[i] = 0u;
  }
}

// Block 0: the grouped GEMM's per-expert arrays from the group list (see scan_groups). The
// weights are addressed in bytes (`w_expert_bytes` per expert), so packed int4 weights work
// alike. `ld_d`: the elements of one row of D (N for C, N/2 for the fused kernels' S). The
// blocks after it (setup_zero_blocks) write `zero_count` zeros to `zeros`.
template <bool SwapAB, class Arrays, class ElementD, class StrideA, class StrideB, class StrideD>
__global__ void group_setup(Arrays arrays, int64_t const* group_list, int32_t cumsum,
                            int64_t experts, int64_t m, int n, int k, void const* x,
                            void const* w, int64_t w_expert_bytes, ElementD* d, int64_t ld_d,
                            float const* x_scale, float const* w_scale, StrideA stride_a,
                            StrideB stride_b, StrideD stride_d, uint32_t* zeros,
                            int64_t zero_count) {
  pdl_release();  // the GEMM may launch: it waits for this kernel before it reads anything
  if (blockIdx.x > 0) {
    zero_words(zeros, zero_count, blockIdx.x - 1, gridDim.x - 1);
    return;
  }
  using ElementX = cute::conditional_t<SwapAB, typename Arrays::ElementB, typename Arrays::ElementA>;
  using ElementW = cute::conditional_t<SwapAB, typename Arrays::ElementA, typename Arrays::ElementB>;
  scan_groups(group_list, cumsum, experts, m, arrays.rows_total, nullptr,
              [&](int64_t i, int64_t start, int64_t end, int64_t) {
    int const rows = static_cast<int>(end - start);
    auto const* x_i = reinterpret_cast<ElementX const*>(static_cast<uint8_t const*>(x) + start * k);
    auto const* w_i = reinterpret_cast<ElementW const*>(static_cast<uint8_t const*>(w) +
                                                        i * w_expert_bytes);
    if constexpr (SwapAB) {
      arrays.shapes[i] = cute::make_shape(n, rows, k);
      arrays.a[i] = w_i;
      arrays.b[i] = x_i;
    } else {
      arrays.shapes[i] = cute::make_shape(rows, n, k);
      arrays.a[i] = x_i;
      arrays.b[i] = w_i;
    }
    arrays.x_scales[i] = x_scale + start;
    arrays.w_scales[i] = w_scale + i * n;
    arrays.d[i] = d + start * ld_d;
    arrays.row_max[i] = arrays.row_max_bits + start;
    arrays.stride_a[i] = stride_a;
    arrays.stride_b[i] = stride_b;
    arrays.stride_d[i] = stride_d;
  });
}

// ----------------------------------------------------------------------------- SwiGLU + quant

// max that keeps NaN (fmaxf drops it): a row holding a NaN gets a NaN q_scale, never a finite one.
__device__ __forceinline__ float max_keep_nan(float a, float b) {
  return (isnan(a) || isnan(b)) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}

// max_keep_nan over each aligned group of `Lanes` lanes (a power of two up to 32), by butterfly
// shuffles of the whole warp: every lane ends with its group's max.
template <int Lanes = 32>
__device__ __forceinline__ float warp_max_keep_nan(float value) {
  for (int offset = Lanes / 2; offset > 0; offset /= 2) {
    value = max_keep_nan(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}

// swish(act) · gate within a few ulps: expf (not __expf, whose error grows with |act|) and the
// fast reciprocal division (__fdividef, 2 ulps; the IEEE division's slow path cost the fused
// epilogue, which runs on the math warps). act < -87.3: the denominator passes 2^126, and the
// result is 0 (exactly -0 past -88.7), where the exact value is below 1e-36 in magnitude.
__device__ __forceinline__ float swiglu(float act, float gate) {
  return __fdividef(act, 1.0f + expf(-act)) * gate;
}

// L2 eviction policies (createpolicy, sm80 and later) for the fused kernels' S: the epilogue
// stores S `evict_last` when it fits in a share of L2 (s_kept_in_l2), so that the quantize pass
// finds it there after the weights have streamed past, and the pass reads S `evict_first`, S
// being dead once read. Each access carries its policy as a cache hint (ld / st .L2::cache_hint).
// With the pass launched as a programmatic dependent of the GEMM, and the GEMM of group_setup:
// the op 0.99-1.07x as fast (geomean 1.02) at 256 and 1024 tokens of the three models, int8 and fp8
// (H200, session 55, benchmarks/RESULTS.md).
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_policy_evict_normal() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// One float of S to global memory with L2 eviction `policy` (the fused epilogues' stores).
__device__ __forceinline__ void store_s1(float* p, float v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.f32 [%0], %1, %2;" :: "l"(p), "f"(v), "l"(policy)
               : "memory");
}

// The bits of |v|, which the fused kernels' row maxima are kept as: non-negative floats order
// like unsigned integers, and a NaN's bits exceed +inf's, so a NaN anywhere in a row wins (as in
// the unfused kernels' max_keep_nan) under an unsigned atomicMax, which is order-independent.
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(fabsf(v)); }

// Whether the fused kernels keep S (`s_bytes` of it) in L2 for the quantize pass: within a
// third of the GPU's L2, the rest left to the weight tiles that an expert's row tiles share
// (on an H200, 60 MiB: a bf16 S of up to 731 Mixtral-8x7B rows, 13653 of Qwen3-30B-A3B).
inline bool s_kept_in_l2(int64_t s_bytes, int l2_bytes) { return 3 * s_bytes <= l2_bytes; }

// The whole 128-byte lines within [from, to), spread over `count` threads (this one `index`),
// dropped from L2 without their write-back (discard.global.L2, sm80 and later; the bytes become
// undefined). For S kept in L2, which is dead once the quantize pass has read it: left dirty, it
// would be written to DRAM when the next kernel's weights evict it. The caller makes sure every
// read of those bytes has returned (the values used, the threads that read them synchronized with
// this one). The op 1.4-1.7% faster where S stayed in L2 (fp8 Mixtral-8x7B 256 tokens, Qwen3-
// 30B-A3B and DeepSeek-V2-Lite 1024 uniform), 0.5-0.7% slower where it did not (int8 Mixtral
// 1024 tokens), level after C in the SwiGLU passes (H200, session 56, benchmarks/RESULTS.md):
// S is dropped only when it was kept.
__device__ __forceinline__ void discard_lines(void const* from, void const* to, int index,
                                              int count) {
  uintptr_t const first = (reinterpret_cast<uintptr_t>(from) + 127) & ~uintptr_t(127);
  uintptr_t const last = reinterpret_cast<uintptr_t>(to) & ~uintptr_t(127);
  for (uintptr_t line = first + 128 * uintptr_t(index); line < last;
       line += 128 * uintptr_t(count)) {
    asm volatile("discard.global.L2 [%0], 128;" : : "l"(line) : "memory");
  }
}

// Four consecutive values as floats: one 16-byte load of float32, one 8-byte load of bf16, with
// L2 eviction `policy` (volatile: never hoisted above the pass's pdl_wait).
__device__ __forceinline__ void load4(float const* p, int64_t vec, float out[4], uint64_t policy) {
  asm volatile("ld.global.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
               : "=f"(out[0]), "=f"(out[1]), "=f"(out[2]), "=f"(out[3])
               : "l"(p + 4 * vec), "l"(policy));
}

__device__ __forceinline__ void load4(cutlass::bfloat16_t const* p, int64_t vec, float out[4],
                                      uint64_t policy) {
  uint2 v;
  asm volatile("ld.global.L2::cache_hint.v2.b32 {%0, %1}, [%2], %3;"
               : "=r"(v.x), "=r"(v.y)
               : "l"(p + 4 * vec), "l"(policy));
  cutlass::bfloat16_t const* h = reinterpret_cast<cutlass::bfloat16_t const*>(&v);
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<float>(h[i]);
  }
}

// The four (act, gate) pairs of S vector `vec` from a row of C, act and gate interleaved
// (two 16-byte loads for fp32, one for bf16).
__device__ __forceinline__ void load_pairs(float const* row, int64_t vec, float act[4],
                                           float gate[4]) {
  float4 const lo = reinterpret_cast<float4 const*>(row)[2 * vec];
  float4 const hi = reinterpret_cast<float4 const*>(row)[2 * vec + 1];
  act[0] = lo.x, gate[0] = lo.y, act[1] = lo.z, gate[1] = lo.w;
  act[2] = hi.x, gate[2] = hi.y, act[3] = hi.z, gate[3] = hi.w;
}

__device__ __forceinline__ void load_pairs(cutlass::bfloat16_t const* row, int64_t vec,
                                           float act[4], float gate[4]) {
  uint4 const v = reinterpret_cast<uint4 const*>(row)[vec];
  cutlass::bfloat16_t const* h = reinterpret_cast<cutlass::bfloat16_t const*>(&v);
  for (int i = 0; i < 4; ++i) {
    act[i] = static_cast<float>(h[2 * i]);
    gate[i] = static_cast<float>(h[2 * i + 1]);
  }
}

template <class ElementQ>
struct Quantizer;

template <>
struct Quantizer<int8_t> {
  static constexpr float kMax = 127.0f;
  __device__ static uint8_t bits(float v) {  // nearest, ties to even (cvt.rni)
    int const q = __float2int_rn(v);
    return static_cast<uint8_t>(static_cast<int8_t>(q > 127 ? 127 : (q < -127 ? -127 : q)));
  }
  // The same bits without the conversion (which runs on the SM's quarter-rate unit): v + 1.5·2^23
  // leaves v rounded to an integer (ties to even) in the float's low mantissa bits, exact for
  // |v| < 2^22 (here |v| <= 127 past a rounding); NaN gives 0, as cvt.rni.
  __device__ static uint8_t bits_by_add(float v) {
    int const q = v == v ? __float_as_int(__fadd_rn(v, 12582912.0f)) - 0x4B400000 : 0;
    return static_cast<uint8_t>(static_cast<int8_t>(q > 127 ? 127 : (q < -127 ? -127 : q)));
  }
  // Four quotients' bits_by_add, little-endian in a word.
  __device__ static uint32_t pack4(float const v[4]) {
    uint32_t packed = 0;
    for (int i = 0; i < 4; ++i) {
      packed |= static_cast<uint32_t>(bits_by_add(v[i])) << (8 * i);
    }
    return packed;
  }
};

template <>
struct Quantizer<cutlass::float_e4m3_t> {
  static constexpr float kMax = 448.0f;
  __device__ static uint8_t bits(float v) {  // nearest, ties to even, saturated to +-448; NaN
    return cutlass::float_e4m3_t(isnan(v) ? v : fminf(fmaxf(v, -kMax), kMax)).storage;
  }
  __device__ static uint8_t bits_by_add(float v) { return bits(v); }
  // Four values' bits, little-endian in a word, two a conversion (cvt's first source goes to the
  // upper byte): `satfinite` saturates past +-448 and keeps NaN, the bits bits() gives.
  __device__ static uint32_t pack4(float const v[4]) {
    uint16_t low, high;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(low) : "f"(v[1]), "f"(v[0]));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(high) : "f"(v[3]), "f"(v[2]));
    return static_cast<uint32_t>(low) | (static_cast<uint32_t>(high) << 16);
  }
};

// A row's quantization scale and, where it allows, its reciprocal r = RN(1 / scale): then the
// IEEE quotient s / scale is q0 = RN(s · r) corrected once, RN(q0 + RN(s − q0 · scale) · r) (two
// FMAs; Markstein's theorem: r within half an ulp of 1 / scale and q0 within an ulp of the
// quotient make the residual exact and the result the correctly rounded quotient, as long as
// nothing leaves the normal range: scales in [2^-90, 2^100] keep every quotient that can round to
// a nonzero q normal). Other scales (0, NaN, inf, extremes) divide. Checked against the IEEE
// division and cvt.rni on 2^32 random pairs, scales 2^-95 .. 2^105, a half of them within 8 ulps
// of a tie: none differ (session 52, benchmarks/prototypes/moe_pass_reciprocal.patch).
struct RowScale {
  float scale;
  float inverse;  // 0: divide
};

__device__ __forceinline__ RowScale row_scale(float scale) {
  bool const reciprocal = scale >= 0x1p-90f && scale <= 0x1p100f;  // false for NaN
  return {scale, reciprocal ? 1.0f / scale : 0.0f};
}

__device__ __forceinline__ float quotient(float s, RowScale const& row) {
  if (row.inverse != 0.0f) {
    float const q0 = __fmul_rn(s, row.inverse);
    float const q = __fmaf_rn(__fmaf_rn(-q0, row.scale, s), row.inverse, q0);
    // ±0 / scale is s itself; the correction would turn -0 into +0 (-0 + +0), and e4m3 keeps
    // the zero's sign (0x80): caught by a fused / unfused pair of test_moe_gpu.py's FUSED_CASES
    return s == 0.0f ? s : q;
  }
  return row.scale == 0.0f ? 0.0f : s / row.scale;  // IEEE division, as the reference
}

// Four quantized values, one 32-bit store (q's rows are N/2 bytes, N/2 a multiple of 4).
template <class ElementQ>
__device__ __forceinline__ void store4(ElementQ* q_row, int64_t vec, float const s[4], float scale) {
  uint32_t packed = 0;
  for (int i = 0; i < 4; ++i) {
    float const v = scale == 0.0f ? 0.0f : s[i] / scale;  // IEEE division, as the reference
    packed |= static_cast<uint32_t>(Quantizer<ElementQ>::bits(v)) << (8 * i);
  }
  reinterpret_cast<uint32_t*>(q_row)[vec] = packed;
}

// store4's bits through the row's reciprocal: no division, and no conversion a value (int8) or
// one per two values (e4m3). The long-row pass takes it, and the fused kernels' quantize pass for
// e4m3 q; the short-row one keeps store4 (with this arithmetic, many short rows after C ran
// slower, unexplained: session 52), and so does the quantize pass for int8 q (there the
// reciprocal measured 7% faster at short rows and 512 Mixtral rows, 2% slower at 2048-8192
// Mixtral rows: session 54, not taken).
template <class ElementQ>
__device__ __forceinline__ void store4(ElementQ* q_row, int64_t vec, float const s[4],
                                       RowScale const& row) {
  float quotients[4];
  for (int i = 0; i < 4; ++i) {
    quotients[i] = quotient(s[i], row);
  }
  reinterpret_cast<uint32_t*>(q_row)[vec] = Quantizer<ElementQ>::pack4(quotients);
}

// q = 0 for vectors first, first + step, ... < end of a row outside every group (4 bytes each).
template <class ElementQ>
__device__ __forceinline__ void zero_vectors(ElementQ* q_row, int first, int end, int step) {
  for (int v = first; v < end; v += step) {
    reinterpret_cast<uint32_t*>(q_row)[v] = 0u;
  }
}

// CTAs of `kernel` (no dynamic shared memory) an SM holds, at least 1; callers keep it in a
// function-local static, so the query runs once a process and kernel.
template <class Kernel>
inline int ctas_per_sm(Kernel kernel, int threads) {
  int ctas = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, 0) != cudaSuccess) {
    cudaGetLastError();
    ctas = 1;
  }
  return ctas > 0 ? ctas : 1;
}

constexpr int kQuantThreads = 512;
constexpr int kQuantVectorsPerThread = 8;  // a CTA's part of a row <= 512 * 4 * 8 = 16384 values
                                           // of S stays in registers
// Several rows a CTA: up to 12 vectors a thread in registers (64 threads hold a row of 3072
// values; rows of at most 1536 values go to swiglu_quant_split_rows). That kernel holds one CTA
// an SM (92 registers a thread);
// the one-row kernels keep 8 and at most 64 registers, two CTAs an SM (built as one kernel with
// 73, one CTA an SM, Mixtral's 2048-8192 rows of 14336 values ran 8-10% slower, H200).
constexpr int kMultiRowVectorsPerThread = 12;
constexpr int kMaxRowParts = 8;            // CTAs a row (a cluster): the portable cluster size

// How many CTAs share a row: one, unless the rows are few and long. One CTA a row leaves most SMs
// idle when a decode step has a few rows, and a Mixtral row (14336 values) then takes a CTA
// ~9 µs, all of it after the GEMM (H200, ncu: 2 rows 9.3 µs, 5.8 in clusters of 8); so the parts
// double while every part keeps at least 256 vectors of 4 values and the grid stays within one
// CTA an SM (at two, 32 Mixtral rows in clusters of 8 took 10.5 µs: not all clusters fit at
// once).
inline int swiglu_row_parts(int64_t m, int64_t n_half, int sm_count) {  // 1, 2, 4 or 8
  int64_t const vectors = n_half / 4;
  int parts = 1;
  while (parts < kMaxRowParts && vectors / (2 * parts) >= 256 && m * 2 * parts <= sm_count) {
    parts *= 2;
  }
  return parts;
}

// Rows a CTA when the rows are many and short: 2^j rows, each by 512 / 2^j threads (whole warps),
// as few as bring the grid within the CTAs the GPU holds at once (`resident`: one wave, each CTA
// holding loads of several rows in flight), while a row's share still fits the register budget.
// One CTA a row ran 2048 rows of Qwen3-30B-A3B (768 values) in 21 µs: ~8 waves of two CTAs an
// SM, whose 512 threads had 192 vectors to read (H200, ncu; C's 12.6 MB take ~3 µs at the copy
// bandwidth).
constexpr int kMaxRowsPerCta = kQuantThreads / 32;  // a warp a row

inline int swiglu_rows_per_cta(int64_t m, int64_t n_half, int64_t resident) {  // 1, 2, ..., 16
  int64_t const vectors = n_half / 4;
  int rows = 1;
  while (rows < kMaxRowsPerCta && (m + rows - 1) / rows > resident &&
         vectors <= int64_t(kQuantThreads / (2 * rows)) * kMultiRowVectorsPerThread) {
    rows *= 2;
  }
  return rows;
}

// Rows grid-strided over clusters of `parts` CTAs (clusters along x: CTA x is part x % parts of
// its cluster's rows; with parts > 1 swiglu_row_parts keeps m · parts within the SMs, so each
// cluster has one row, but the loop holds for more), or, unsplit, over CTAs of 2^rows_log2 rows
// each (swiglu_rows_per_cta: a group of 512 / 2^rows_log2 threads a row), 4 values of S per
// thread and step over the part's share of the row. Pass 1 reads it once (act and gate halves),
// computes S and its max |S|; the row's max is the max over the group's warps (through shared
// memory) and over the parts (through distributed shared memory; order-independent:
// deterministic); pass 2 quantizes S from registers through the row's reciprocal (store4 with a
// RowScale: the IEEE quotient's bits, no division a value; against the division, Mixtral-8x7B's
// rows after C, H200, session 53: 5-10% faster with fp32 C, 13-18% with bf16 C, whose pass spent
// its time on the SM's quarter-rate unit: exp, two reciprocals and a conversion a value). Parts
// longer than the register budget recompute S from C (then still in L2). Needs N/2 % 4 == 0 (the
// op checks N % 8 == 0).
// Split: built for clusters (parts > 1, one row a CTA); the one-part kernel is compiled without
// the cluster code (with it, one token of Qwen3 and DeepSeek-V2-Lite ran 0.1-0.3 µs slower, H200).
// MultiRow: built for several rows a CTA; the one-row kernels keep a row's thread count a
// compile-time constant.
template <class ElementC, class ElementQ, bool Split, bool MultiRow>
__global__ void __launch_bounds__(kQuantThreads)
swiglu_quant(ElementC const* c, ElementQ* q, float* q_scale, int64_t m, int64_t n_half,
             int64_t const* rows_total, int parts_log2, int share, int rows_log2) {
  __shared__ float warp_max[kQuantThreads / 32];
  __shared__ float part_max[2];  // this part's max of the row, by row parity, read by the cluster
  pdl_wait();  // C and the row count come from the kernels before (see runtime_support.hpp)
  pdl_release();
  // parts = 2^parts_log2, share = ceil(vectors / parts) and rows = 2^rows_log2 come from the
  // host: no division here (a 64-bit one cost the one-part launch ~0.3 µs at one token, H200).
  int64_t const total = *rows_total;
  int const vectors = static_cast<int>(n_half / 4);
  if constexpr (!Split) {
    parts_log2 = 0, share = vectors;
  }
  if constexpr (!MultiRow) {
    rows_log2 = 0;
  }
  int const parts = 1 << parts_log2;
  int const part = Split ? static_cast<int>(blockIdx.x) & (parts - 1) : 0;
  int const begin = !Split ? 0 : part * share < vectors ? part * share : vectors;
  int const end = !Split ? vectors : begin + share < vectors ? begin + share : vectors;
  int const group = kQuantThreads >> rows_log2;  // threads a row: whole warps
  int const slot = MultiRow ? static_cast<int>(threadIdx.x) / group : 0;
  int const member = MultiRow ? static_cast<int>(threadIdx.x) & (group - 1)
                              : static_cast<int>(threadIdx.x);
  int const warps_a_row = group / 32;
  constexpr int kKept = MultiRow ? kMultiRowVectorsPerThread : kQuantVectorsPerThread;
  bool const in_registers = share <= group * kKept;
  int parity = 0;
  int64_t const step = int64_t(gridDim.x >> parts_log2) << rows_log2;
  for (int64_t first = int64_t(blockIdx.x >> parts_log2) << rows_log2; first < m;
       first += step, parity ^= 1) {
    // Every thread runs every step (the barriers below); rows past M or past the last group
    // skip the work. With one row a CTA (and in a cluster) the whole CTA takes the same branch.
    int64_t const row = first + slot;
    bool const outside = row < m && row >= total;
    ElementQ* q_row = q + row * n_half;
    if (outside) {  // outside every group: q = 0, q_scale = 0 (the same branch in every part)
      zero_vectors(q_row, begin + member, end, group);
      if (part == 0 && member == 0) {
        q_scale[row] = 0.0f;
      }
    }
    if (!MultiRow && outside) {
      continue;  // one row a CTA (a cluster): no thread (part) reaches a barrier for it
    }
    bool const mine = !MultiRow || (row < total && row < m);  // one row a CTA: inside, here
    ElementC const* c_row = c + row * 2 * n_half;
    float s[kKept][4];
    float amax = 0.0f;
    auto compute = [&](int64_t v, float out[4]) {
      float a[4], g[4];
      load_pairs(c_row, v, a, g);
      for (int i = 0; i < 4; ++i) {
        out[i] = swiglu(a[i], g[i]);
        amax = max_keep_nan(amax, fabsf(out[i]));
      }
    };
    if (mine) {
      if (in_registers) {
#pragma unroll
        for (int j = 0; j < kKept; ++j) {
          int const v = begin + member + j * group;
          if (v < end) {
            compute(v, s[j]);
          }
        }
      } else {
        for (int v = begin + member; v < end; v += group) {
          compute(v, s[0]);
        }
      }
    }
    amax = warp_max_keep_nan(amax);
    if (warps_a_row > 1) {  // the same for every thread of the CTA
      if (threadIdx.x % 32 == 0) {
        warp_max[threadIdx.x / 32] = amax;
      }
      __syncthreads();
      amax = 0.0f;
      for (int w = slot * warps_a_row; w < (slot + 1) * warps_a_row; ++w) {
        amax = max_keep_nan(amax, warp_max[w]);  // max is order-independent: deterministic
      }
      __syncthreads();  // warp_max is rewritten by the next step
    }
    if constexpr (Split) {
      // The parts' maxima: lane r of each warp reads part r's. A part rewrites part_max[parity]
      // two rows later, after the next row's cluster barrier, which every part reaches only once
      // it has read this row's (rows past `total`, which skip the barrier, only come last).
      if (threadIdx.x == 0) {
        part_max[parity] = amax;
      }
      smem::cluster_sync();
      int const lane = static_cast<int>(threadIdx.x % 32);
      float other = 0.0f;
      if (lane < parts) {
        uint32_t const mine_at = static_cast<uint32_t>(__cvta_generic_to_shared(&part_max[parity]));
        other = smem::load_cluster_f32(smem::cluster_address(mine_at, static_cast<uint32_t>(lane)));
      }
      other = warp_max_keep_nan<8>(other);  // parts <= 8 lanes
      amax = __shfl_sync(0xffffffffu, other, 0);  // lanes 0-7 hold the row's max
    }
    if (!mine) {
      continue;
    }
    // A row whose S is all zero (or whose max underflows) gets q = 0, q_scale = 0: never NaN.
    // A row with a NaN in S gets q_scale NaN; with an infinite S, q_scale +inf (q unspecified).
    float const scale = amax / Quantizer<ElementQ>::kMax;
    RowScale const by = row_scale(scale);
    if (in_registers) {
#pragma unroll
      for (int j = 0; j < kKept; ++j) {
        int const v = begin + member + j * group;
        if (v < end) {
          store4(q_row, v, s[j], by);
        }
      }
    } else {
      for (int v = begin + member; v < end; v += group) {
        compute(v, s[0]);
        store4(q_row, v, s[0], by);
      }
    }
    if (part == 0 && member == 0) {
      q_scale[row] = scale;
    }
  }
  if constexpr (Split) {
    smem::cluster_sync_relaxed();  // no part exits while another may still read its part_max
  }
}

// Short rows (at most kSplitRowMaxVectors vectors of 4 values: N/2 <= 1536, every MoE layer but
// Mixtral's), whatever their number: `Parts` warps a row, each a contiguous share of the row's
// vectors (lane l holding vectors share_start + l + 32·u, u < Kept, of S in registers), the row's
// max over its warps through shared memory; a CTA of kSplitRowThreads holds 8 / Parts rows, one
// CTA per such group of rows (no grid-stride). split_row_parts picks Parts: at most 3 vectors a
// lane, then more warps a row while the grid stays within one wave of warps (and a part keeps
// 1.5 vectors a lane, unless the GPU would be under a quarter full). Against the kernels it
// replaced (a warp a row over one wave of CTAs, 4-12 vectors a lane; and, below ~1056 rows,
// several rows or one row a CTA of 512 threads), the pass alone after a kernel that wrote C,
// under PDL, in a CUDA graph (H200, session 52, benchmarks/RESULTS.md): Qwen3-30B-A3B's rows
// (768 values) 1.99 -> 1.47 µs at 8 rows, 8.15 -> 5.16 at 2048, 26.9 -> 17.8 at 8192;
// DeepSeek-V2-Lite's (1408) 12.4 -> 6.3 at 1536, 37.0 -> 25.9 at 6144: one warp a row ran each
// row's 1000-2000 instructions of SwiGLU and quantization on too few warps an SM. Same functions
// and the same order-independent max as swiglu_quant: bit for bit its results.
constexpr int kSplitRowThreads = 256;
constexpr int kSplitRowWarps = kSplitRowThreads / 32;
constexpr int kSplitRowMaxKept = 3;  // vectors a lane
constexpr int kSplitRowMaxParts = kSplitRowWarps;
constexpr int64_t kSplitRowMaxVectors = int64_t(32) * kSplitRowMaxKept * 4;  // 4 warps of 3 a lane

template <class ElementC, class ElementQ, int Parts, int Kept>
__global__ void __launch_bounds__(kSplitRowThreads)
swiglu_quant_split_rows(ElementC const* c, ElementQ* q, float* q_scale, int64_t m, int64_t n_half,
                        int64_t const* rows_total) {
  pdl_wait();  // C and the row count come from the kernels before (see runtime_support.hpp)
  pdl_release();
  __shared__ float part_max[kSplitRowWarps];
  int64_t const total = *rows_total;
  int const vectors = static_cast<int>(n_half / 4);  // <= Parts · 32 · Kept: the launch chose
  int const share = (vectors + Parts - 1) / Parts;
  int const warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  constexpr int kRows = kSplitRowWarps / Parts;
  int64_t const row = int64_t(blockIdx.x) * kRows + warp / Parts;
  int const part = warp % Parts;
  int const begin = part * share;
  int const end = begin + share < vectors ? begin + share : vectors;
  bool const inside = row < m && row < total;
  float act[Kept][4], s[Kept][4];
  float amax = 0.0f;
  if (inside) {
    ElementC const* c_row = c + row * 2 * n_half;
#pragma unroll
    for (int u = 0; u < Kept; ++u) {  // every load first: Kept vectors in flight a lane
      if (begin + lane + 32 * u < end) {
        load_pairs(c_row, begin + lane + 32 * u, act[u], s[u]);  // s holds the gates until SwiGLU
      }
    }
#pragma unroll
    for (int u = 0; u < Kept; ++u) {
      if (begin + lane + 32 * u < end) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[u][i] = swiglu(act[u][i], s[u][i]);
          amax = max_keep_nan(amax, fabsf(s[u][i]));
        }
      }
    }
  }
  amax = warp_max_keep_nan(amax);
  if constexpr (Parts > 1) {  // every thread of the CTA reaches the barrier
    if (lane == 0) {
      part_max[warp] = amax;
    }
    __syncthreads();
    amax = 0.0f;
#pragma unroll
    for (int w = 0; w < Parts; ++w) {  // max is order-independent: deterministic
      amax = max_keep_nan(amax, part_max[warp - part + w]);
    }
  }
  if (row >= m) {
    return;
  }
  ElementQ* q_row = q + row * n_half;
  if (!inside) {  // outside every group: q = 0, q_scale = 0
    zero_vectors(q_row, begin + lane, end, 32);
    if (part == 0 && lane == 0) {
      q_scale[row] = 0.0f;
    }
    return;
  }
  float const scale = amax / Quantizer<ElementQ>::kMax;  // as swiglu_quant: 0 rows give q = 0
#pragma unroll
  for (int u = 0; u < Kept; ++u) {
    if (begin + lane + 32 * u < end) {
      store4(q_row, begin + lane + 32 * u, s[u], scale);
    }
  }
  if (part == 0 && lane == 0) {
    q_scale[row] = scale;
  }
}

// Warps a row for the split-rows pass (1, 2, 4 or 8), on a GPU of `sm_count` SMs of 64 warps.
inline int split_row_parts(int64_t m, int64_t n_half, int sm_count) {
  int64_t const vectors = n_half / 4, warp_slots = int64_t(sm_count) * 64;
  int parts = 1;
  while (parts < kSplitRowMaxParts && (vectors + parts - 1) / parts > 32 * kSplitRowMaxKept) {
    parts *= 2;
  }
  while (parts < kSplitRowMaxParts && m * 2 * parts <= warp_slots &&
         (vectors / (2 * parts) >= 48 || m * 2 * parts <= warp_slots / 4)) {
    parts *= 2;
  }
  return parts;
}

// The split-rows pass at `Parts` warps a row: Parts must leave at most kSplitRowMaxKept vectors a
// lane (split_row_parts' choice does).
template <class ElementC, class ElementQ, int Parts>
cudaError_t launch_swiglu_quant_split_rows_of(ElementC const* c, ElementQ* q, float* q_scale,
                                              int64_t m, int64_t n_half, int64_t const* rows_total,
                                              cudaStream_t stream, bool pdl) {
  int64_t const lane_vectors = ((n_half / 4 + Parts - 1) / Parts + 31) / 32;
  dim3 const grid(static_cast<unsigned>((m + kSplitRowWarps / Parts - 1) / (kSplitRowWarps / Parts)));
  auto launch = [&](auto kernel) {
    return launch_maybe_pdl(kernel, grid, dim3(kSplitRowThreads), 0, stream, pdl, c, q, q_scale,
                            m, n_half, rows_total);
  };
  if (lane_vectors <= 1) {
    return launch(swiglu_quant_split_rows<ElementC, ElementQ, Parts, 1>);
  }
  if (lane_vectors <= 2) {
    return launch(swiglu_quant_split_rows<ElementC, ElementQ, Parts, 2>);
  }
  return launch(swiglu_quant_split_rows<ElementC, ElementQ, Parts, kSplitRowMaxKept>);
}

// The split-rows pass over C [m, 2·n_half] (n_half / 4 <= kSplitRowMaxVectors).
template <class ElementC, class ElementQ>
cudaError_t launch_swiglu_quant_split_rows(ElementC const* c, ElementQ* q, float* q_scale,
                                           int64_t m, int64_t n_half, int64_t const* rows_total,
                                           cudaStream_t stream, bool pdl, int sm_count) {
  switch (split_row_parts(m, n_half, sm_count)) {
    case 1:
      return launch_swiglu_quant_split_rows_of<ElementC, ElementQ, 1>(c, q, q_scale, m, n_half,
                                                                      rows_total, stream, pdl);
    case 2:
      return launch_swiglu_quant_split_rows_of<ElementC, ElementQ, 2>(c, q, q_scale, m, n_half,
                                                                      rows_total, stream, pdl);
    case 4:
      return launch_swiglu_quant_split_rows_of<ElementC, ElementQ, 4>(c, q, q_scale, m, n_half,
                                                                      rows_total, stream, pdl);
    default:
      return launch_swiglu_quant_split_rows_of<ElementC, ElementQ, 8>(c, q, q_scale, m, n_half,
                                                                      rows_total, stream, pdl);
  }
}

// swiglu_quant over C [m, 2·n_half] in `parts` CTAs a row.
template <class ElementC, class ElementQ>
cudaError_t launch_swiglu_quant_parts(ElementC const* c, ElementQ* q, float* q_scale, int64_t m,
                                      int64_t n_half, int64_t const* rows_total,
                                      cudaStream_t stream, bool pdl, int parts, int rows) {
  int const parts_log2 = cutlass::find_log2(parts), rows_log2 = cutlass::find_log2(rows);
  int64_t const vectors = n_half / 4;
  int const share = static_cast<int>((vectors + parts - 1) / parts);
  int64_t const row_ctas = (m + rows - 1) / rows;
  int64_t const clusters = row_ctas < 65535 * 4 ? row_ctas : 65535 * 4;
  return launch_clustered_maybe_pdl(
      parts > 1  ? swiglu_quant<ElementC, ElementQ, true, false>
      : rows > 1 ? swiglu_quant<ElementC, ElementQ, false, true>
                 : swiglu_quant<ElementC, ElementQ, false, false>,
      dim3(static_cast<unsigned>(clusters * parts)), dim3(kQuantThreads), 0, stream, pdl,
      dim3(static_cast<unsigned>(parts), 1, 1), c, q, q_scale, m, n_half, rows_total, parts_log2,
      share, rows_log2);
}

// The unfused kernels' SwiGLU + quant pass over C [m, 2·n_half] (after the GEMM on `stream`; a
// programmatic dependent when `pdl`) on a GPU of `sm_count` SMs. A cluster launch the device
// refuses (e.g. a context given few SMs) falls back to one CTA a row. A failed launch's error is
// returned and cleared, so that it cannot fail the next call's check.
template <class ElementC, class ElementQ>
cudaError_t launch_swiglu_quant(ElementC const* c, ElementQ* q, float* q_scale, int64_t m,
                                int64_t n_half, int64_t const* rows_total, cudaStream_t stream,
                                bool pdl, int sm_count) {
  if (n_half / 4 <= kSplitRowMaxVectors) {  // short rows, any number of them
    cudaError_t const launched = launch_swiglu_quant_split_rows(c, q, q_scale, m, n_half,
                                                                rows_total, stream, pdl, sm_count);
    if (launched != cudaSuccess) {
      cudaGetLastError();
    }
    return launched;
  }
  int const parts = swiglu_row_parts(m, n_half, sm_count);
  // CTAs of the several-rows kernel an SM holds (its registers decide: found once a process)
  static int const per_sm = ctas_per_sm(swiglu_quant<ElementC, ElementQ, false, true>,
                                         kQuantThreads);
  int const rows = parts > 1 ? 1 : swiglu_rows_per_cta(m, n_half, int64_t(per_sm) * sm_count);
  cudaError_t launched =
      launch_swiglu_quant_parts(c, q, q_scale, m, n_half, rows_total, stream, pdl, parts, rows);
  if (launched != cudaSuccess && parts > 1) {
    cudaGetLastError();  // the refused cluster launch's error: not this call's result
    launched = launch_swiglu_quant_parts(c, q, q_scale, m, n_half, rows_total, stream, pdl, 1, 1);
  }
  if (launched != cudaSuccess) {
    cudaGetLastError();
  }
  return launched;
}

// The fused kernels' light pass: q = quantize(S / scale), scale = max|S_row| / QMAX from the
// row maxima the epilogue reduced (bits of |S|); S float32 or bf16 (ElementS). No reduction is
// left, so a row splits freely: `parts` warps a row (2^parts_log2, quantize_row_parts), each a
// contiguous share of the row's vectors of 4 values of S, kQuantizeBatch of them loaded by each
// lane (share start + lane + 32·u) before it quantizes them; warps grid-stride over (row, part).
// Rows past the last group get q = 0, q_scale = 0 (the GEMM wrote nothing there). Against one
// warp a row (H200, session 53, benchmarks/RESULTS.md; the pass alone after a kernel that wrote
// S): Mixtral-8x7B's rows (14336 values) 38.8 -> 10.2 µs at 512 rows, 47.1 -> 22.4 at 1024, 55.9
// -> 40.9 at 2048, 170 -> 137.6 at 8192: a warp a row left most of the GPU idle below ~8000 rows
// and walked its row's 3584 vectors 128 at a time. A vector is 16 bytes of a float S and 8 of a
// bf16 one, whose lanes load twice as many before quantizing: the same bytes in flight. e4m3 q
// through the row's reciprocal, two values a conversion (store4 with a RowScale): the pass after
// S, Mixtral rows, 2048 of bf16 S 38.9 -> 32.4 µs, 8192 134.7 -> 109.7, 512 of fp32 S 10.1 ->
// 8.0 (H200, session 54, benchmarks/prototypes/quantize_pass_types.cu).
constexpr int kQuantizeThreads = 256;
constexpr int kQuantizeWarps = kQuantizeThreads / 32;
template <class ElementS>
constexpr int kQuantizeBatch = 16 / sizeof(ElementS);

template <class ElementS, class ElementQ>
__global__ void __launch_bounds__(kQuantizeThreads)
quantize_rows(ElementS const* s, uint32_t const* row_max_bits, ElementQ* q, float* q_scale,
              int64_t m, int64_t n_half, int64_t const* rows_total, int parts_log2, int share,
              bool discard_s) {
  pdl_wait();  // S, the row maxima and the row count come from the kernels before
  pdl_release();
  int64_t const total = *rows_total;
  int const vectors = static_cast<int>(n_half / 4);  // N < 2^31: the op checks
  uint64_t const dead_after_read = l2_policy_evict_first();  // S is read once
  int const lane = static_cast<int>(threadIdx.x % 32);
  int64_t const warps = m << parts_log2;
  int64_t const stride = int64_t(gridDim.x) * kQuantizeWarps;
  for (int64_t w = int64_t(blockIdx.x) * kQuantizeWarps + threadIdx.x / 32; w < warps;
       w += stride) {
    int64_t const row = w >> parts_log2;
    int const part = static_cast<int>(w & ((int64_t(1) << parts_log2) - 1));
    int const begin = part * share < vectors ? part * share : vectors;
    int const end = begin + share < vectors ? begin + share : vectors;
    ElementQ* q_row = q + row * n_half;
    if (row >= total) {
      zero_vectors(q_row, begin + lane, end, 32);
      if (part == 0 && lane == 0) {
        q_scale[row] = 0.0f;
      }
      continue;
    }
    float const scale = __uint_as_float(row_max_bits[row]) / Quantizer<ElementQ>::kMax;
    RowScale const reciprocal = row_scale(scale);
    ElementS const* s_row = s + row * n_half;
    constexpr int batch = kQuantizeBatch<ElementS>;
    for (int base = begin; base < end; base += 32 * batch) {  // warp-uniform (the __syncwarp)
      int const first = base + lane;
      float values[batch][4];
#pragma unroll
      for (int u = 0; u < batch; ++u) {
        if (first + 32 * u < end) {
          load4(s_row, first + 32 * u, values[u], dead_after_read);
        }
      }
#pragma unroll
      for (int u = 0; u < batch; ++u) {
        if (first + 32 * u < end) {
          if constexpr (cute::is_same_v<ElementQ, int8_t>) {
            store4(q_row, first + 32 * u, values[u], scale);
          } else {
            store4(q_row, first + 32 * u, values[u], reciprocal);
          }
        }
      }
      if (discard_s) {
        __syncwarp();  // every lane's loads of this batch have returned: their values are stored
        int const bound = base + 32 * batch < end ? base + 32 * batch : end;
        discard_lines(s_row + 4 * int64_t(base), s_row + 4 * int64_t(bound), lane, 32);
      }
    }
    if (part == 0 && lane == 0) {
      q_scale[row] = scale;
    }
  }
}

// Warps a row for quantize_rows, on a GPU of `sm_count` SMs of 64 warps: the fewest that keep a
// warp's share at most 16 vectors a lane, then twice as many while the warps stay within one
// wave and a share keeps 2 vectors a lane (measured: at 8192 rows of 14336 values 8 warps a row
// beat 1, 2 and 16; at 24576 rows of 1408 and 32768 of 768 one warp beat two).
inline int quantize_row_parts(int64_t m, int64_t n_half, int sm_count) {
  int64_t const vectors = n_half / 4, wave = int64_t(sm_count) * 64;
  int parts = 1;
  while ((vectors + parts - 1) / parts > 32 * 16) {
    parts *= 2;
  }
  while (m * 2 * parts <= wave && vectors / (2 * parts) >= 32 * 2) {
    parts *= 2;
  }
  return parts;
}

// quantize_rows over S [m, n_half] on `stream`; past 2^20 CTAs the warps stride over the rest.
// `discard_s`: S was kept in L2 (s_kept_in_l2), drop its lines once read (discard_lines).
template <class ElementS, class ElementQ>
cudaError_t launch_quantize_rows(ElementS const* s, uint32_t const* row_max_bits, ElementQ* q,
                                 float* q_scale, int64_t m, int64_t n_half,
                                 int64_t const* rows_total, cudaStream_t stream, bool pdl,
                                 int sm_count, bool discard_s) {
  int const parts = quantize_row_parts(m, n_half, sm_count);
  int const share = static_cast<int>((n_half / 4 + parts - 1) / parts);
  int64_t const ctas = (m * parts + kQuantizeWarps - 1) / kQuantizeWarps;
  if (ctas == 0) {
    return cudaSuccess;
  }
  return launch_maybe_pdl(quantize_rows<ElementS, ElementQ>,
                          dim3(static_cast<unsigned>(ctas < (1 << 20) ? ctas : (1 << 20))),
                          dim3(kQuantizeThreads), 0, stream, pdl, s, row_max_bits, q,
                          q_scale, m, n_half, rows_total, cutlass::find_log2(parts), share,
                          discard_s);
}

}  // namespace gemmgen::moe
