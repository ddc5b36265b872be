/*
 * gemmgen/sm90_epilogue_nodes.hpp — CUTLASS 3.x (sm90) node types for the scaled epilogues of
 * scaled_epilogues.hpp.
 *
 * NOTES: per-tensor vs per-vector is chosen at run time with CUTLASS's dynamic broadcast (a `bool`
 * stride: 1 reads a vector, 0 reads element 0 everywhere), so one binary serves both.
 * With swap-AB the kernel computes Dᵀ = Bᵀ·Aᵀ: what is per-row of D becomes per-column of the
 * kernel's output, so every broadcast swaps between Row and Col nodes; the math is unchanged.
 */
#pragma once

#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"

#include "gemmgen/w8a8/scaled_mm_args.h"
#include "gemmgen/w8a8/scaled_epilogues.hpp"

namespace gemmgen::sm90 {

namespace fusion = cutlass::epilogue::fusion;
using cute::_0;
using cute::_1;

// A vector indexed by the problem's m (or n), broadcast across the other dimension; it becomes a
// kernel Col or Row broadcast depending on swap-AB, with a run-time vector-or-scalar choice.
template <bool SwapAB, class TileShape, class Element, class Compute>
struct Broadcasts {
  using ColDyn = fusion::Sm90ColBroadcast<0, TileShape, Element, Compute,
                                          cute::Stride<bool, _0, int64_t>>;
  using RowDyn = fusion::Sm90RowBroadcast<0, TileShape, Element, Compute,
                                          cute::Stride<_0, bool, int64_t>>;
  using PerM = cute::conditional_t<SwapAB, RowDyn, ColDyn>;
  using PerN = cute::conditional_t<SwapAB, ColDyn, RowDyn>;

  static typename PerM::Arguments per_m(Element const* ptr, bool is_vector) {
    if constexpr (SwapAB) {
      return {ptr, Element(0), {_0{}, is_vector, int64_t(0)}};
    } else {
      return {ptr, Element(0), {is_vector, _0{}, int64_t(0)}};
    }
  }
  static typename PerN::Arguments per_n(Element const* ptr, bool is_vector) {
    if constexpr (SwapAB) {
      return {ptr, Element(0), {is_vector, _0{}, int64_t(0)}};
    } else {
      return {ptr, Element(0), {_0{}, is_vector, int64_t(0)}};
    }
  }
};

template <bool SwapAB, class TileShape, class ElementD>
struct Nodes {
  using OutputElement = ElementD;
  template <class Op, class... Children>
  using EVT = fusion::Sm90EVT<Op, Children...>;
  template <template <class> class Fn, class Out, class In>
  using Compute = fusion::Sm90Compute<Fn, Out, In, cutlass::FloatRoundStyle::round_to_nearest>;

  using Scales = Broadcasts<SwapAB, TileShape, float, float>;
  using Biases = Broadcasts<SwapAB, TileShape, ElementD, float>;
  using Ints = Broadcasts<SwapAB, TileShape, int32_t, int32_t>;
  using Acc = fusion::Sm90AccFetch;
  using ScaleA = typename Scales::PerM;
  using ScaleB = typename Scales::PerN;
  using Bias = typename Biases::PerN;
  using IntPerM = typename Ints::PerM;
  using IntPerN = typename Ints::PerN;

  static auto scale_a(gemmgen_scaled_mm_args const& p) {
    return Scales::per_m(p.scale_a, p.scale_a_per_token != 0);
  }
  static auto scale_b(gemmgen_scaled_mm_args const& p) {
    return Scales::per_n(p.scale_b, p.scale_b_per_channel != 0);
  }
  static auto bias(gemmgen_scaled_mm_args const& p) {
    return Biases::per_n(static_cast<ElementD const*>(p.bias), p.bias != nullptr);
  }
  static auto int_per_m(int32_t const* ptr) { return Ints::per_m(ptr, true); }
  static auto int_per_n(int32_t const* ptr) { return Ints::per_n(ptr, true); }
};

}  // namespace gemmgen::sm90
