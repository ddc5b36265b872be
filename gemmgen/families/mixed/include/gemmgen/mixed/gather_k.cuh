/*
 * gemmgen/mixed/gather_k.cuh — act-order (GPTQ desc_act) for every kernel of the mixed-input
 * family: a weight packed with its K in group order (`k_perm`, packing.py) needs the activations'
 * columns in that order too. When the arguments carry `k_perm`, the entry point first gathers
 * a[:, k_perm] into the front of its workspace with the small kernel below, then runs the GEMM
 * kernel on that copy (lda = K), unchanged.
 *
 * Launch. The gather and then the GEMM run in stream order, neither as a programmatic dependent
 * (PDL). Measured on the H200 (session 24, benchmarks/prototypes/act_order_gather.py, RESULTS.md
 * "Act-order"): with the GEMM as a dependent of the gather, or the gather as one of the kernel
 * before, calls were faster at short K (4096 x 4096, one token: 6.9-8.0 µs against 10.0) and up
 * to 1.8x slower at long K (8192 x 28672, 64 tokens: 139 against 90 µs), whether the gather
 * released its dependent before or after its own wait; stream order is as fast as PDL off
 * everywhere. Against torch's index_select before the op (session 23) it saves 1.1-4.1 µs a call:
 * act-order costs 1.26-1.42x the same weight without it (geomean, 1-64 tokens), index_select
 * 1.33-1.67x.
 *
 * Two gathers. `gather_columns`: a thread writes 8 consecutive kernel positions of a row (16
 * bytes) from 8 reads of a's row at k_perm's positions (k_perm is read 32 bytes at a time; its [K]
 * int32 stays in L1/L2 across rows). `gather_columns_staged`: a CTA first copies its row into
 * shared memory with 16-byte coalesced reads, then writes its slice of the row's outputs from
 * there. Timed alone on the H200 (session 25, benchmarks/prototypes/gather_variants.cu, CUDA
 * events, µs): the first is as fast or faster at 1-16 tokens (K 4096-28672: 5.8-7.9 against
 * 6.0-8.6) and at 64 tokens x K 4096 (6.1 against 6.4); the staged one is level at 64 x 8192
 * and ahead past it: 64 x 28672 10.5 against 14.6, 256 x 14336 10.4 / 16.7, 1024 x 28672 52.9 /
 * 153.6, 4096 x 28672 186 / 679, 4096 x 4096 30.6 / 36.0 (the scattered 2-byte reads cost an L1
 * or L2 access each once a row outgrows L1). `stages_rows` picks between them.
 */
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "gemmgen/c_api.h"
#include "gemmgen/mixed/mixed_mm_args.h"
#include "gemmgen/runtime_support.hpp"

namespace gemmgen::mixed::gather {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;
constexpr size_t kAlign = 256;  // the GEMM's own workspace starts at this alignment after the copy

// Kernel positions j .. j + 7 of one row: row[k_perm[j + e]] for e = 0..7, packed into 16 bytes
// (row: a's row in global memory, or its copy in shared memory). k_perm is a permutation
// (PackedWeight checks it); clamped all the same, so a k_perm changed after packing, or passed
// to the custom op directly, cannot read outside the row.
__device__ __forceinline__ uint4 gather_piece(uint16_t const* row, int32_t const* k_perm, int j,
                                              int k) {
  int4 const lo = __ldg(reinterpret_cast<int4 const*>(k_perm + j));
  int4 const hi = __ldg(reinterpret_cast<int4 const*>(k_perm + j + 4));
  unsigned const last = static_cast<unsigned>(k - 1);
  auto at = [&](int index) { return uint32_t(row[min(static_cast<unsigned>(index), last)]); };
  return make_uint4(at(lo.x) | (at(lo.y) << 16), at(lo.z) | (at(lo.w) << 16),
                    at(hi.x) | (at(hi.y) << 16), at(hi.z) | (at(hi.w) << 16));
}

// out[row, j] = a[row, k_perm[j]] for 16-bit elements; out is [m, k] contiguous, k % 8 == 0.
// Internal linkage: every translation unit that includes this header has its own.
static __global__ void __launch_bounds__(kThreads)
gather_columns(uint16_t const* a, int64_t lda, int32_t const* k_perm, uint16_t* out, int64_t m,
               int k) {
  // Launched in stream order, as is the GEMM after it (no programmatic dependent launch on
  // either side): the kernel before has finished, written a and read the workspace.
  int64_t const per_row = k / 8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * per_row;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t const row = i / per_row;
    int const j = static_cast<int>(i % per_row) * 8;
    *reinterpret_cast<uint4*>(out + row * k + j) = gather_piece(a + row * lda, k_perm, j, k);
  }
}

// The same gather for many tokens and long rows (see the header's comment): CTA (s, row) first
// copies its row of a into shared memory (16-byte coalesced reads, `k` * 2 bytes), then writes
// slice s of the row's outputs (gridDim.x slices of 8-value pieces) from the copy. a's rows are
// 16-byte aligned (lda % 8 == 0, a 16-byte aligned).
static __global__ void __launch_bounds__(kThreads)
gather_columns_staged(uint16_t const* a, int64_t lda, int32_t const* k_perm, uint16_t* out, int k) {
  extern __shared__ __align__(16) uint16_t row_copy[];
  int64_t const row = blockIdx.y;
  auto const* src = reinterpret_cast<uint4 const*>(a + row * lda);
  for (int i = threadIdx.x; i < k / 8; i += blockDim.x) {
    reinterpret_cast<uint4*>(row_copy)[i] = src[i];
  }
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k / 8; i += gridDim.x * blockDim.x) {
    int const j = i * 8;
    *reinterpret_cast<uint4*>(out + row * k + j) = gather_piece(row_copy, k_perm, j, k);
  }
}

// When the staged gather runs (measured, the header's comment): K up to kStagedMaxK (the row
// copy's shared memory), rows 16-byte aligned, and 64 tokens or more at K >= 8192, 256 or more
// at K >= 4096.
constexpr int kStagedMaxK = 49152;  // a 96 KB row copy

inline bool stages_rows(gemmgen_mixed_mm_args const& a) {
  bool const many_tokens = (a.m >= 64 && a.k >= 8192) || (a.m >= 256 && a.k >= 4096);
  return many_tokens && a.k <= kStagedMaxK && a.lda % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.a) % 16 == 0;
}

// Bytes of the gathered copy at the front of the workspace (0 without k_perm).
inline size_t copy_bytes(gemmgen_mixed_mm_args const* args) {
  if (args->k_perm == nullptr || args->m < 1 || args->k < 1) {
    return 0;
  }
  size_t const bytes = size_t(args->m) * size_t(args->k) * 2;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// Gathers the activations of `args` (k_perm set) into the front of the workspace, in stream
// order; GEMMGEN_OK or the failure recorded by fail(). One function for every GEMM entry point of
// a translation unit (static, as the gather kernels are): its checks, the staged kernel's
// shared-memory attribute (once per device) and the launch are compiled once, not per kernel.
static int gather_into_workspace(gemmgen_mixed_mm_args const& a, void* workspace,
                                 size_t workspace_bytes, void* stream, char const* kernel_name) {
  size_t const bytes = copy_bytes(&a);
  if (a.m < 1 || a.k < 8 || a.k % 8 != 0 || a.k >= (int64_t(1) << 31) || a.lda < a.k ||
      a.a == nullptr || reinterpret_cast<uintptr_t>(a.a) % 2 != 0 ||
      reinterpret_cast<uintptr_t>(a.k_perm) % 16 != 0) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "act-order needs M >= 1, K a multiple of 8 below 2^31, lda >= K, 2-byte aligned "
                "activations and a 16-byte aligned k_perm");
  }
  if (workspace == nullptr || workspace_bytes < bytes ||
      reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "act-order needs the workspace that gemmgen_workspace_<kernel> asks for, "
                "256-byte aligned");
  }
  // NOTES: the GEMM checks its own arguments after this launch; a GEMM that then refuses leaves
  // the gather's copy unused in the workspace, nothing else (no output is written).
  auto* copy = static_cast<uint16_t*>(workspace);
  auto const* a_in = static_cast<uint16_t const*>(a.a);
  auto const cuda_stream = static_cast<cudaStream_t>(stream);
  static std::atomic<bool> raised[detail::kMaxDevices] = {};
  if (stages_rows(a) && a.m <= 65535 &&
      allow_shared_memory_once(gather_columns_staged, kStagedMaxK * 2, raised, kernel_name) ==
          GEMMGEN_OK) {
    // about two CTAs an SM: rows split into slices while there are fewer rows than that
    int const sms = hardware_info().sm_count;
    int64_t const slices = std::max<int64_t>(1, std::min<int64_t>(16, 2 * int64_t(sms) / a.m));
    launch_maybe_pdl(gather_columns_staged, dim3(static_cast<unsigned>(slices),
                                                 static_cast<unsigned>(a.m)),
                     dim3(kThreads), static_cast<int>(a.k * 2), cuda_stream, /*pdl=*/false, a_in,
                     a.lda, a.k_perm, copy, static_cast<int>(a.k));
  } else {
    int64_t const work = a.m * (a.k / 8);
    int const blocks = static_cast<int>(work / kThreads + 1 < kMaxBlocks ? work / kThreads + 1
                                                                          : kMaxBlocks);
    launch_maybe_pdl(gather_columns, dim3(blocks), dim3(kThreads), 0, cuda_stream, /*pdl=*/false,
                     a_in, a.lda, a.k_perm, copy, a.m, static_cast<int>(a.k));
  }
  cudaError_t const launched = cudaGetLastError();
  if (launched != cudaSuccess) {
    return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
  }
  return GEMMGEN_OK;
}

// Runs `run(args, workspace, workspace_bytes)` (a GEMM entry point), first gathering the
// activations when `args->k_perm` is set: then `run` sees the copy as `a`, no k_perm, and the
// workspace after the copy.
template <class Run>
int run_in_k_order(gemmgen_mixed_mm_args const* args, void* workspace, size_t workspace_bytes,
                   void* stream, char const* kernel_name, Run&& run) {
  if (args->k_perm == nullptr) {
    return run(args, workspace, workspace_bytes);
  }
  int const gathered = gather_into_workspace(*args, workspace, workspace_bytes, stream, kernel_name);
  if (gathered != GEMMGEN_OK) {
    return gathered;
  }
  size_t const bytes = copy_bytes(args);
  gemmgen_mixed_mm_args in_k_order = *args;
  in_k_order.a = workspace;
  in_k_order.lda = args->k;
  in_k_order.k_perm = nullptr;
  in_k_order.launch_flags &= ~GEMMGEN_LAUNCH_PDL;  // see the header's comment
  return run(&in_k_order, static_cast<char*>(workspace) + bytes, workspace_bytes - bytes);
}

}  // namespace gemmgen::mixed::gather
