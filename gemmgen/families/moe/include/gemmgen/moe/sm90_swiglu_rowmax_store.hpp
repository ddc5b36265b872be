/*
 * gemmgen/moe/sm90_swiglu_rowmax_store.hpp — the fused MoE kernels' epilogue root: a CUTLASS 3.x
 * sm90 epilogue visitor node that turns the scaled GEMM tile C into S = swish(act) · gate, stores
 * S (half the columns of C) straight to global memory, and reduces every row's max |S| across
 * the N tiles with atomic max into a per-row buffer; a light pass then quantizes S
 * (swiglu_quant.cuh: quantize_rows). The collective epilogue runs with a void D: no C is ever
 * written, which is the point of fusing.
 *
 * The weights are packed with act and gate interleaved (packing.py: packed row 2j is act column
 * j, row 2j+1 gate column j), so each (act, gate) pair is two adjacent columns of C. The wgmma
 * accumulator gives every thread its columns in adjacent pairs (2j, 2j+1), and the epilogue
 * hands them to visit() as adjacent fragment elements (i, i+1), i even. visit() relies on more of
 * that layout: a 16-element fragment (a 32-column subtile) holds pair 2·k + h at row r + 8·h and
 * columns c + 8·k, so a subtile needs one address and two bounds, its pairs' offsets being
 * compile-time constants; ncu put the per-pair coordinates, bounds and 64-bit addresses at about
 * 85M of the epilogue's 223M warp instructions (Mixtral, 4096 tokens), and hoisting them made
 * the GEMM 2-7% faster (benchmarks/RESULTS.md, session 40). The GPU tests compare every fused
 * kernel with an unfused one bit for bit, which checks the layout.
 *
 * The row max is kept as the bits of |S| (non-negative floats order like unsigned integers, and
 * a NaN's bits exceed +inf's, so a NaN anywhere in a row wins, as in the unfused kernel), per
 * thread in registers across the tile's subtiles, then per warp (lanes holding the same row
 * combine with __match_any_sync / __reduce_max_sync) and one atomicMax per row and warp. Max is
 * order-independent: the result is deterministic.
 */
#pragma once

#include <stdint.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"

#include "gemmgen/moe/swiglu_quant.cuh"

namespace gemmgen::moe::sm90 {

struct Sm90SwigluRowMaxStore {
  // No D: the collective sizes its (unused) D staging with this type, as for an aux store.
  using ElementAux = float;

  struct SharedStorage {};

  struct Arguments {
    float* const* s = nullptr;           // per group: S of its first row, rows of ld_s floats
    uint32_t* const* row_max = nullptr;  // per group: max|S| bits of its first row (zeroed)
    int64_t ld_s = 0;                    // N / 2
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
                                          Residue residue, float* s, int64_t ld_s,
                                          int64_t first_row, int64_t first_col)
        : gmem_max(gmem_max), reg_max(reg_max), coords(coords), residue(residue), s(s),
          ld_s(ld_s), first_row(first_row), first_col(first_col) {}

    RowMaxGmem gmem_max;
    RowMaxRegs reg_max;
    Coords coords;
    Residue residue;
    float* s;           // the group's S
    int64_t ld_s;
    int64_t first_row;  // the thread's first (row, column) of the group's C
    int64_t first_col;

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE auto visit(cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                              int epi_m, int epi_n,
                              cutlass::Array<ElementInput, FragmentSize> const& c) {
      static_assert(FragmentSize == 16, "the epilogue subtile is 32 columns of the wgmma tile");
      using cute::_;
      auto coords_mn = coords(_, _, _, epi_m, epi_n);
      auto max_mn = reg_max(_, _, _, epi_m, epi_n);
      // Pair p = 2·k + h of the fragment is row r + 8·h, columns 8·k + 2·q and the next (q the
      // thread's place in its quad): S column 4·k of the pair (k = 0, h = 0)'s. One address
      // and two bounds a subtile; the pairs' offsets are compile-time constants.
      auto const first = coords_mn(epi_v * FragmentSize);
      int const rows_left = static_cast<int>(cute::get<0>(residue) - cute::get<0>(first));
      int const cols_left = static_cast<int>(cute::get<1>(residue) - cute::get<1>(first));
      float* const s_first = s + (first_row + cute::get<0>(first)) * ld_s +
                             ((first_col + cute::get<1>(first)) >> 1);
      int64_t const eight_rows = 8 * ld_s;
      CUTLASS_PRAGMA_UNROLL
      for (int k = 0; k < 4; ++k) {
        CUTLASS_PRAGMA_UNROLL
        for (int h = 0; h < 2; ++h) {
          int const i = 2 * (2 * k + h);
          float const value = swiglu(static_cast<float>(c[i]), static_cast<float>(c[i + 1]));
          if (8 * h < rows_left && 8 * k < cols_left) {  // N is even: the gate is in too
            s_first[h * eight_rows + 4 * k] = value;
            uint32_t& held = max_mn(epi_v * FragmentSize + i);
            held = max(held, __float_as_uint(fabsf(value)));
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
      int const lane = static_cast<int>(threadIdx.x % 32);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(regs); ++i) {
        bool const valid = cute::get<0>(row_coords(i)) < cute::get<0>(residue);
        uint32_t* address = &addresses(i);
        unsigned long long const key = valid ? reinterpret_cast<uintptr_t>(address) : 0ull;
        unsigned const same_row = __match_any_sync(0xffffffffu, key);
        uint32_t const bits = __reduce_max_sync(same_row, regs(i));
        if (valid && bits != 0u && lane == __ffs(same_row) - 1) {
          atomicMax(address, bits);
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
        first_col);
  }
};

}  // namespace gemmgen::moe::sm90
