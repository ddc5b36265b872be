/*
 * gemmgen/scaled_epilogues.hpp — the four W8A8 dequant epilogues as epilogue visitor trees,
 * written once for every CUTLASS generation.
 *
 *   ScaledEpilogue            D = s_a · s_b · acc
 *   ScaledEpilogueBias        D = s_a · s_b · acc + bias
 *   ScaledEpilogueAzp         D = s_a · s_b · (acc − azp_with_adj) + bias
 *   ScaledEpilogueAzpPerToken D = s_a · s_b · (acc − azp ⊗ azp_adj) + bias
 *
 * s_a is per-tensor or per-token (one value per row m), s_b per-tensor or per-channel (one value
 * per column n); bias, azp_with_adj and azp_adj are per column n, azp per row m. The azp
 * epilogues take an optional bias (a null pointer broadcasts 0), so no bias-less variant exists.
 *
 * The tree shapes live here; a `Nodes` policy supplies the generation's node types and argument
 * builders (sm90_epilogue_nodes.hpp, sm80_epilogue_nodes.hpp):
 *   OutputElement, Acc, ScaleA (per m), ScaleB (per n), Bias (per n), IntPerM, IntPerN,
 *   template <class Op, class... Children> EVT,
 *   template <template <class> class Fn, class Out, class In> Compute,
 *   static scale_a(p), scale_b(p), bias(p), int_per_m(ptr), int_per_n(ptr).
 */
#pragma once

#include "cutlass/functional.h"

#include "gemmgen/w8a8/scaled_mm_args.h"

namespace gemmgen {

// D = s_a · (s_b · acc)
template <class N>
struct ScaledEpilogue {
  using ScaleBAcc = typename N::template EVT<
      typename N::template Compute<cutlass::multiplies, float, float>, typename N::ScaleB,
      typename N::Acc>;
  using Tree = typename N::template EVT<
      typename N::template Compute<cutlass::multiplies, typename N::OutputElement, float>,
      typename N::ScaleA, ScaleBAcc>;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    return {N::scale_a(p), {N::scale_b(p), {}, {}}, {}};
  }
};

// The shared tail of the bias and azp epilogues: D = s_a · (s_b · X) + bias, where X is the
// accumulator or a node computed from it.
template <class N, class X>
struct ScaledPlusBias {
  using ScaleBX = typename N::template EVT<
      typename N::template Compute<cutlass::multiplies, float, float>, typename N::ScaleB, X>;
  using Tree = typename N::template EVT<
      typename N::template Compute<cutlass::multiply_add, typename N::OutputElement, float>,
      typename N::ScaleA, ScaleBX, typename N::Bias>;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p,
                                            typename X::Arguments const& x) {
    return {N::scale_a(p), {N::scale_b(p), x, {}}, N::bias(p), {}};
  }
};

// D = s_a · (s_b · acc) + bias
template <class N>
struct ScaledEpilogueBias {
  using Tail = ScaledPlusBias<N, typename N::Acc>;
  using Tree = typename Tail::Tree;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    return Tail::arguments(p, {});
  }
};

// D = s_a · (s_b · (acc − azp_with_adj)) + bias; the subtraction is exact in int32.
template <class N>
struct ScaledEpilogueAzp {
  using AccMinusAzp = typename N::template EVT<
      typename N::template Compute<cutlass::minus, float, int32_t>, typename N::Acc,
      typename N::IntPerN>;
  using Tail = ScaledPlusBias<N, AccMinusAzp>;
  using Tree = typename Tail::Tree;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    return Tail::arguments(p, {{}, N::int_per_n(p.azp_adj), {}});
  }
};

// D = s_a · (s_b · (acc − azp ⊗ azp_adj)) + bias; azp per row m, azp_adj per column n, in int32.
template <class N>
struct ScaledEpilogueAzpPerToken {
  using AzpOuter = typename N::template EVT<
      typename N::template Compute<cutlass::multiplies, int32_t, int32_t>, typename N::IntPerM,
      typename N::IntPerN>;
  using AccMinusAzp = typename N::template EVT<
      typename N::template Compute<cutlass::minus, float, int32_t>, typename N::Acc, AzpOuter>;
  using Tail = ScaledPlusBias<N, AccMinusAzp>;
  using Tree = typename Tail::Tree;

  static typename Tree::Arguments arguments(gemmgen_scaled_mm_args const& p) {
    typename AzpOuter::Arguments outer{N::int_per_m(p.azp), N::int_per_n(p.azp_adj), {}};
    return Tail::arguments(p, {{}, outer, {}});
  }
};

}  // namespace gemmgen
