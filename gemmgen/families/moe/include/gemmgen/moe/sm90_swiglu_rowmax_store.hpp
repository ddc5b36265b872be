/*
 * gemmgen/moe/sm90_swiglu_rowmax_store.hpp — the fused MoE kernels' epilogue root: a CUTLASS 3.x
 * sm90 epilogue visitor node that turns the scaled GEMM tile C (float32) into S = swish(act) ·
 * gate, stores S (half the columns of C; float32, or bf16 for half the bytes) straight to global
 * memory, and reduces every row's max |S| across the N tiles with atomic max into a per-row
 * buffer; a light pass then quantizes S (swiglu_quant.cuh: quantize_rows). The collective
 * epilogue runs with a void D: no C is ever written, which is the point of fusing. A bf16 S is
 * rounded once, before the row max, so that the max is one of the stored values (as an unfused
 * kernel's row max is of the S it computes from its stored C).
 *
 * The weights are packed with act and gate interleaved (packing.py: packed row 2j is act column
 * j, row 2j+1 gate column j), so each (act, gate) pair is two adjacent columns of C. The wgmma
 * accumulator gives every thread its columns in adjacent pairs (2j, 2j+1), and the epilogue
 * hands them to visit() as adjacent fragment elements (i, i+1), i even. visit() relies on more of
 * that layout: each 16 elements of a fragment (a 32-column block) hold pair 2·k + h at row r + 8·h
 * and columns c + 8·k, r and c the thread's first, the four lanes of a quad holding the same
 * rows; so a block needs one address and two bounds, its pairs' offsets being compile-time
 * constants (hoisting them made the GEMM 2-7% faster, benchmarks/RESULTS.md, session 40). When a
 * fragment is the whole tile (sm90_grouped_swiglu_quant.hpp: tiles up to 128 columns) the quad
 * transposes each row's 4 x 4 block of S so that every lane stores 4 adjacent floats, a warp
 * 8 rows of 64 contiguous bytes where pair by pair it stored 8 rows of 16. The GPU tests
 * compare every fused kernel with an unfused one bit for bit, which checks the layout.
 *
 * The row max is kept as the bits of |S| (non-negative floats order like unsigned integers, and
 * a NaN's bits exceed +inf's, so a NaN anywhere in a row wins, as in the unfused kernel), per
 * thread in registers across the tile's blocks, then per quad (two butterfly shuffles) and one
 * atomicMax per row and quad. Max is order-independent: the result is deterministic.
 */
#pragma once

#include <stdint.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"

#include "gemmgen/moe/swiglu_quant.cuh"

namespace gemmgen::moe::sm90 {

// A 4 x 4 block M spread over the four lanes of a quad (lanes 4·j .. 4·j + 3, q = lane % 4):
// lane q holds x[k] = M[k][q] on entry and x[k] = M[q][k] on return. Two butterfly steps, one
// index bit each: over lane bit 0 (partner q ^ 1) and then bit 1 (q ^ 2), each lane sends the
// two values its partner needs and puts the two it gets where they belong. Every lane of the
// warp must call it (the shuffles take the whole warp).
__device__ __forceinline__ void transpose_quad(float (&x)[4], int q) {
  CUTLASS_PRAGMA_UNROLL
  for (int bit = 0; bit < 2; ++bit) {
    int const step = 1 << bit;            // the index bit exchanged: 1, then 2
    bool const upper = (q & step) != 0;   // this lane keeps the entries whose bit is set
    CUTLASS_PRAGMA_UNROLL
    for (int other = 0; other < 2; ++other) {
      // the pair of entries differing only in `bit`; `other` numbers the remaining bit
      int const lo = bit == 0 ? 2 * other : other;
      int const hi = lo + step;
      float const sent = upper ? x[lo] : x[hi];
      float const got = __shfl_xor_sync(0xffffffffu, sent, step);
      if (upper) {
        x[lo] = got;
      } else {
        x[hi] = got;
      }
    }
  }
}

// S's element type rounding: float32 keeps the value, bf16 rounds it to nearest even.
template <class ElementS>
__device__ __forceinline__ float stored_value(float v) {
  return static_cast<float>(static_cast<ElementS>(v));
}
template <>
__device__ __forceinline__ float stored_value<float>(float v) {
  return v;
}

// Four S values (already rounded to ElementS) to 4 consecutive elements: one 16-byte store for
// float32, one 8-byte store for bf16, with L2 eviction `policy` (one float: store_s1, and the
// row maxima's abs_bits, in swiglu_quant.cuh).
__device__ __forceinline__ void store_s4(float* p, float const (&v)[4], uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;"
               :: "l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "l"(policy) : "memory");
}
__device__ __forceinline__ void store_s4(cutlass::bfloat16_t* p, float const (&v)[4],
                                         uint64_t policy) {
  cutlass::Array<cutlass::bfloat16_t, 4> packed;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < 4; ++k) {
    packed[k] = static_cast<cutlass::bfloat16_t>(v[k]);  // exact: v is already a bf16 value
  }
  uint2 const bits = *reinterpret_cast<uint2 const*>(&packed);
  asm volatile("st.global.L2::cache_hint.v2.b32 [%0], {%1, %2}, %3;" :: "l"(p), "r"(bits.x),
               "r"(bits.y), "l"(policy) : "memory");
}

// ElementS: float or cutlass::bfloat16_t, the type S is stored in.
template <class ElementS>
struct Sm90SwigluRowMaxStore {
  // No D: the collective sizes its (unused) D staging with this type, as for an aux store.
  using ElementAux = float;

  struct SharedStorage {};

  struct Arguments {
    ElementS* const* s = nullptr;        // per group: S of its first row, rows of ld_s elements
    uint32_t* const* row_max = nullptr;  // per group: max|S| bits of its first row (zeroed)
    int64_t ld_s = 0;                    // N / 2
    bool keep_in_l2 = false;             // store S evict_last (s_kept_in_l2), else evict_normal
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.ld_s > 0;
  }

  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90SwigluRowMaxStore() {}
  CUTLASS_HOST_DEVICE Sm90SwigluRowMaxStore(Params const& params, SharedStorage const&)
      : params(params) {}

  Params params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(
      cutlass::epilogue::fusion::detail::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  // RowMaxGmem / RowMaxRegs: (CPY, CPY_M, CPY_N, EPI_M, EPI_N) views of the group's row-max
  // buffer and the thread's registers, both stride 0 along N (one register per row held);
  // Coords: the thread's tile-relative coordinates; Residue: (M, N) minus its first coordinate.
  template <class RowMaxGmem, class RowMaxRegs, class Coords, class Residue>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(RowMaxGmem gmem_max, RowMaxRegs reg_max, Coords coords,
                                          Residue residue, ElementS* s, int64_t ld_s,
                                          int64_t first_row, int64_t first_col, uint64_t policy)
        : gmem_max(gmem_max), reg_max(reg_max), coords(coords), residue(residue), s(s),
          ld_s(ld_s), first_row(first_row), first_col(first_col), policy(policy) {}

    RowMaxGmem gmem_max;
    RowMaxRegs reg_max;
    Coords coords;
    Residue residue;
    ElementS* s;        // the group's S
    int64_t ld_s;
    int64_t first_row;  // the thread's first (row, column) of the group's C
    int64_t first_col;
    uint64_t policy;    // S's stores' L2 eviction policy

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                              int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& c) {
      static_assert(FragmentSize % 16 == 0, "the fragment is whole 32-column blocks of wgmma");
      // Several blocks a fragment (a whole-tile subtile): their stores are vectors, the quad's
      // shuffles hidden behind the other blocks' math; one block (a 32-column subtile between
      // the collective's barriers): a float S a pair at a time, which measured faster there, a
      // bf16 S in vectors too (pair by pair, 2-byte stores made the 64x256 tile up to 11% slower
      // at thousands of rows; benchmarks/RESULTS.md, session 54).
      constexpr bool VectorStores = FragmentSize >= 64 || !cute::is_same_v<ElementS, float>;
      using cute::_;
      auto coords_mn = coords(_, _, _, epi_m, epi_n);
      auto max_mn = reg_max(_, _, _, epi_m, epi_n);
      int const q = static_cast<int>(threadIdx.x % 4);  // the thread's place in its quad
      CUTLASS_PRAGMA_UNROLL
      for (int block = 0; block < FragmentSize / 16; ++block) {
        int const e = epi_v * FragmentSize + 16 * block;  // the block's first element
        auto const first = coords_mn(e);
        int const rows_left = static_cast<int>(cute::get<0>(residue) - cute::get<0>(first));
        int const cols_left = static_cast<int>(cute::get<1>(residue) - cute::get<1>(first));
        // The thread's first S column: pair (k, h) is S column 4·k of it, 8·h rows down.
        ElementS* const s_first = s + (first_row + cute::get<0>(first)) * ld_s +
                               ((first_col + cute::get<1>(first)) >> 1);
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          float row[4];  // S columns 4·k of the thread's first, k = 0..3
          CUTLASS_PRAGMA_UNROLL
          for (int k = 0; k < 4; ++k) {
            int const i = 16 * block + 2 * (2 * k + h);
            row[k] = stored_value<ElementS>(
                swiglu(static_cast<float>(c[i]), static_cast<float>(c[i + 1])));
          }
          uint32_t& held = max_mn(e + 2 * h);
          if constexpr (VectorStores) {
            // The quad's 4 x 4 block of this row transposed: lane q then holds S columns
            // 4·q .. 4·q + 3 of lane 0's first, 4-element aligned (the block starts at a multiple
            // of 32 columns of C, N at a multiple of 8), whose 8 columns of C start 6·q past
            // the thread's own first and are all in or all out (N a multiple of 8).
            transpose_quad(row, q);
            if (8 * h < rows_left && 6 * q < cols_left) {
              store_s4(s_first + h * 8 * ld_s + 3 * q, row, policy);
              held = max(held, max(max(abs_bits(row[0]), abs_bits(row[1])),
                                   max(abs_bits(row[2]), abs_bits(row[3]))));
            }
          } else {
            CUTLASS_PRAGMA_UNROLL
            for (int k = 0; k < 4; ++k) {
              if (8 * h < rows_left && 8 * k < cols_left) {  // N is even: the gate is in too
                store_s1(s_first + h * 8 * ld_s + 4 * k, row[k], policy);
                held = max(held, abs_bits(row[k]));
              }
            }
          }
        }
      }
      return c;
    }

    CUTLASS_DEVICE void end() {
      // One register and one gmem address per row the thread holds (the stride-0 N modes
      // dropped); the coordinates of those registers, for the bounds check.
      auto regs = cute::filter_zeros(reg_max);
      auto addresses = cute::filter_zeros(gmem_max);
      auto row_coords =
          cute::make_tensor(coords.data(), cute::make_layout(regs.shape(), coords.stride()));
      // A row's four holders are the lanes of a quad (the wgmma layout visit() relies on):
      // two butterfly steps give each its max, and the quad's first lane sends it.
      bool const quad_leader = threadIdx.x % 4 == 0;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(regs); ++i) {
        uint32_t bits = regs(i);
        bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, 1));
        bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, 2));
        bool const valid = cute::get<0>(row_coords(i)) < cute::get<0>(residue);
        if (valid && bits != 0u && quad_leader) {
          atomicMax(&addresses(i), bits);
        }
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(
      cutlass::epilogue::fusion::detail::ConsumerStoreArgs<Args...> const& args) {
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    // One uint32 per row of the group, broadcast (stride 0) along N and L.
    auto row_max_layout =
        cute::make_layout(cute::make_shape(M, N, L), cute::make_stride(cute::_1{}, cute::_0{}, cute::_0{}));
    auto row_max = cute::make_tensor(cute::make_gmem_ptr(params.row_max[l]), row_max_layout);
    auto gmem_max = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        row_max, args.tile_shape_mnk, args.tile_coord_mnkl, args.epi_tile, args.tiled_copy,
        args.thread_idx);                                   // (CPY, CPY_M, CPY_N, EPI_M, EPI_N)
    auto reg_max = cute::make_tensor_like<uint32_t>(gmem_max);  // registers: one per row
    cute::fill(reg_max, 0u);
    int64_t const first_row = int64_t(M) - cute::get<0>(args.residue_tCcD);
    int64_t const first_col = int64_t(N) - cute::get<1>(args.residue_tCcD);
    return ConsumerStoreCallbacks<decltype(gmem_max), decltype(reg_max), decltype(args.tCcD),
                                  decltype(args.residue_tCcD)>(
        gmem_max, reg_max, args.tCcD, args.residue_tCcD, params.s[l], params.ld_s, first_row,
        first_col, params.keep_in_l2 ? l2_policy_evict_last() : l2_policy_evict_normal());
  }
};

}  // namespace gemmgen::moe::sm90
