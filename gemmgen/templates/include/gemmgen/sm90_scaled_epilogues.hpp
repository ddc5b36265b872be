/*
 * gemmgen/sm90_scaled_epilogues.hpp — the four W8A8 dequant epilogues as CUTLASS 3.x epilogue
 * visitor trees (EVT) for sm90.
 *
 *   ScaledEpilogue            D = s_a · s_b · acc
 *   ScaledEpilogueBias        D = s_a · s_b · acc + bias
 *   ScaledEpilogueAzp         D = s_a · s_b · (acc − azp_with_adj) + bias
 *   ScaledEpilogueAzpPerToken D = s_a · s_b · (acc − azp ⊗ azp_adj) + bias
 *
 * s_a is per-tensor or per-token (one value per row m), s_b per-tensor or per-channel (one value
 * per column n); bias, azp_with_adj and azp_adj are per column n, azp per row m.
 *
 * NOTES: per-tensor vs per-vector is chosen at run time with CUTLASS's dynamic broadcast (a `bool`
 * stride: 1 reads a vector, 0 reads element 0 everywhere), so one binary serves both.
 * With swap-AB the kernel computes Dᵀ = Bᵀ·Aᵀ: what is per-row of D becomes per-column of the
 * kernel's output, so every broadcast swaps between Row and Col nodes; the math is unchanged.
 * The azp epilogues take an optional bias: a null pointer broadcasts 0 (EnableNullptr), so no
 * bias-less azp variant is compiled.
 */
#pragma once

#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cutlass/functional.h"

#include "gemmgen/c_api.h"

namespace gemmgen::sm90 {

namespace fusion = cutlass::epilogue::fusion;
using cute::_0;
using cute::_1;

// A vector indexed by the problem's m (or n), broadcast across the other dimension; it becomes a
// kernel Col or Row broadcast depending on swap-AB. `Dynamic` selects vector-or-scalar at run time.
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

template <template <class> class Fn, class Out, class Compute>
using ComputeNode = fusion::Sm90Compute<Fn, Out, Compute, cutlass::FloatRoundStyle::round_to_nearest>;

// Shared pieces: the float scales, bias in the output type.
template <bool SwapAB, class TileShape, class ElementD>
struct ScaledEpilogueParts {
  using Scales = Broadcasts<SwapAB, TileShape, float, float>;
  using Biases = Broadcasts<SwapAB, TileShape, ElementD, float>;
  using Ints = Broadcasts<SwapAB, TileShape, int32_t, int32_t>;
  using ScaleA = typename Scales::PerM;
  using ScaleB = typename Scales::PerN;
  using Bias = typename Biases::PerN;
  using Acc = fusion::Sm90AccFetch;

  static auto scale_a(gemmgen_scaled_mm_args const& p) {
    return Scales::per_m(p.scale_a, p.scale_a_per_token != 0);
  }
  static auto scale_b(gemmgen_scaled_mm_args const& p) {
    return Scales::per_n(p.scale_b, p.scale_b_per_channel != 0);
  }
  static auto bias(gemmgen_scaled_mm_args const& p) {
    return Biases::per_n(static_cast<ElementD const*>(p.bias), p.bias != nullptr);
  }
};

// D = s_a · (s_b · acc)
template <bool SwapAB, class TileShape, class ElementD>
struct ScaledEpilogue : ScaledEpilogueParts<SwapAB, TileShape, ElementD> {
  using P = ScaledEpilogueParts<SwapAB, TileShape, ElementD>;
  using ScaleBAcc = fusion::Sm90EVT<ComputeNode<cutlass::multiplies, float, float>,
                                    typename P::ScaleB, typename P::Acc>;
  using Tree = fusion::Sm90EVT<ComputeNode<cutlass::multiplies, ElementD, float>,
                               typename P::ScaleA, ScaleBAcc>;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    return {P::scale_a(p), {P::scale_b(p), {}, {}}, {}};
  }
};

// D = s_a · (s_b · acc) + bias
template <bool SwapAB, class TileShape, class ElementD>
struct ScaledEpilogueBias : ScaledEpilogueParts<SwapAB, TileShape, ElementD> {
  using P = ScaledEpilogueParts<SwapAB, TileShape, ElementD>;
  using ScaleBAcc = fusion::Sm90EVT<ComputeNode<cutlass::multiplies, float, float>,
                                    typename P::ScaleB, typename P::Acc>;
  using Tree = fusion::Sm90EVT<ComputeNode<cutlass::multiply_add, ElementD, float>,
                               typename P::ScaleA, ScaleBAcc, typename P::Bias>;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    return {P::scale_a(p), {P::scale_b(p), {}, {}}, P::bias(p), {}};
  }
};

// D = s_a · (s_b · (acc − azp_with_adj)) + bias; the subtraction is exact in int32.
template <bool SwapAB, class TileShape, class ElementD>
struct ScaledEpilogueAzp : ScaledEpilogueParts<SwapAB, TileShape, ElementD> {
  using P = ScaledEpilogueParts<SwapAB, TileShape, ElementD>;
  using AzpWithAdj = typename P::Ints::PerN;
  using AccMinusAzp = fusion::Sm90EVT<ComputeNode<cutlass::minus, float, int32_t>,
                                      typename P::Acc, AzpWithAdj>;
  using ScaleBAcc = fusion::Sm90EVT<ComputeNode<cutlass::multiplies, float, float>,
                                    typename P::ScaleB, AccMinusAzp>;
  using Tree = fusion::Sm90EVT<ComputeNode<cutlass::multiply_add, ElementD, float>,
                               typename P::ScaleA, ScaleBAcc, typename P::Bias>;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    typename AccMinusAzp::Arguments acc_minus_azp{{}, P::Ints::per_n(p.azp_adj, true), {}};
    return {P::scale_a(p), {P::scale_b(p), acc_minus_azp, {}}, P::bias(p), {}};
  }
};

// D = s_a · (s_b · (acc − azp ⊗ azp_adj)) + bias; azp per row m, azp_adj per column n, in int32.
template <bool SwapAB, class TileShape, class ElementD>
struct ScaledEpilogueAzpPerToken : ScaledEpilogueParts<SwapAB, TileShape, ElementD> {
  using P = ScaledEpilogueParts<SwapAB, TileShape, ElementD>;
  using Azp = typename P::Ints::PerM;
  using AzpAdj = typename P::Ints::PerN;
  using AzpOuter = fusion::Sm90EVT<ComputeNode<cutlass::multiplies, int32_t, int32_t>, Azp, AzpAdj>;
  using AccMinusAzp = fusion::Sm90EVT<ComputeNode<cutlass::minus, float, int32_t>,
                                      typename P::Acc, AzpOuter>;
  using ScaleBAcc = fusion::Sm90EVT<ComputeNode<cutlass::multiplies, float, float>,
                                    typename P::ScaleB, AccMinusAzp>;
  using Tree = fusion::Sm90EVT<ComputeNode<cutlass::multiply_add, ElementD, float>,
                               typename P::ScaleA, ScaleBAcc, typename P::Bias>;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    typename AzpOuter::Arguments outer{P::Ints::per_m(p.azp, true),
                                       P::Ints::per_n(p.azp_adj, true), {}};
    typename AccMinusAzp::Arguments acc_minus_azp{{}, outer, {}};
    return {P::scale_a(p), {P::scale_b(p), acc_minus_azp, {}}, P::bias(p), {}};
  }
};

}  // namespace gemmgen::sm90
