/*
 * gemmgen/sm80_epilogue_nodes.hpp — CUTLASS 2.x (sm80) visitor node types for the scaled
 * epilogues of scaled_epilogues.hpp.
 *
 * NOTES: CUTLASS 2.x has no dynamic (vector-or-scalar) broadcast. A per-row value (scale_a) uses
 * the column broadcast with a run-time M stride (1: one value per row, 0: element 0 for every
 * row), which its element-wise loads allow. The row broadcast loads vectors, so the per-column
 * scale_b uses RowOrScalarBroadcast below, which reads element 0 once when it is a scalar.
 */
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/arch/memory.h"
#include "cutlass/gemm/gemm.h"
#include "cutlass/numeric_conversion.h"
// The 2.x visitors assume the kernel headers came first.
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"

#include "gemmgen/w8a8/scaled_mm_args.h"
#include "gemmgen/w8a8/scaled_epilogues.hpp"

namespace gemmgen::sm80 {

namespace tb = cutlass::epilogue::threadblock;
using cute::_0;
using cute::_1;

// One value per column n, or (is_vector == false) the single value ptr[0] for every column.
template <class ThreadMap, class Element>
struct RowOrScalarBroadcast {
  struct Arguments {
    Element const* ptr = nullptr;
    bool is_vector = true;
  };
  using Params = Arguments;
  struct SharedStorage {};

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }

  static int constexpr kVecBits = ThreadMap::kElementsPerAccess * cutlass::sizeof_bits<Element>::value;
  using VecType = cutlass::uint_bit_t<cute::min(128, kVecBits)>;
  static int constexpr kVecLength = sizeof(VecType) / sizeof(Element);

  CUTLASS_HOST_DEVICE RowOrScalarBroadcast() {}
  CUTLASS_HOST_DEVICE RowOrScalarBroadcast(Params const& params, SharedStorage const&)
      : params_ptr(&params) {}

  Params const* params_ptr = nullptr;

  template <class GTensor, class RTensor, class CTensor, class ProblemShape>
  struct Callbacks : tb::EmptyCallbacks {
    CUTLASS_DEVICE Callbacks(GTensor&& gmem, RTensor&& regs, CTensor&& coords,
                             ProblemShape problem_shape, Params const* params_ptr)
        : tC_gRow(cute::forward<GTensor>(gmem)), tC_rRow(cute::forward<RTensor>(regs)),
          tC_cRow(cute::forward<CTensor>(coords)), n(cute::get<1>(problem_shape)),
          params_ptr(params_ptr) {}

    GTensor tC_gRow;
    RTensor tC_rRow;
    CTensor tC_cRow;
    int n;
    Params const* params_ptr;

    CUTLASS_DEVICE void begin_epilogue() {
      if (!params_ptr->is_vector) {
        // Same-size recast (one vector = kVecLength elements), as CUTLASS's null-pointer path does.
        Element value = params_ptr->ptr[0];
        auto vectors = cute::recast<cutlass::Array<Element, kVecLength>>(cute::coalesce(tC_rRow));
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < cute::size(vectors); ++i) {
          vectors(i).fill(value);
        }
        return;
      }
      cute::clear(tC_rRow);
      auto src = cute::filter(tC_gRow);
      auto coord = cute::filter(tC_cRow);
      auto dst = cute::filter(tC_rRow);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(src); ++i) {
        bool in_bounds = cute::get<1>(coord(i)) < n;
        cutlass::arch::global_load<VecType, sizeof(VecType)>(dst(i), (void const*)&src(i), in_bounds);
      }
    }

    template <class ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE auto visit(int iter_idx, int row_idx, int column_idx, int frg_idx,
                              cutlass::Array<ElementAccumulator, FragmentSize> const&) {
      auto fragments = cute::recast<cutlass::Array<Element, FragmentSize>>(cute::coalesce(tC_rRow));
      return fragments(column_idx);
    }
  };

  template <class ProblemShape>
  CUTLASS_DEVICE auto get_callbacks(cutlass::gemm::GemmCoord tile_offset, int thread_idx,
                                    ProblemShape problem_shape) {
    using namespace cute;
    Tensor mRow = make_tensor(make_gmem_ptr(params_ptr->ptr), problem_shape, Stride<_0, _1, _0>{});
    Tensor tC_gRow = recast<VecType>(
        ThreadMap::partition(mRow, thread_idx, tile_offset))(_, _, _0{}, _0{}, _0{}, _0{});
    Tensor tC_rRow = make_tensor_like(tC_gRow);
    Tensor cRow = make_identity_tensor(mRow.shape());
    Tensor tC_cRow = outer_partition(
        ThreadMap::partition(cRow, thread_idx, tile_offset)(_, _, _0{}, _0{}, _0{}, _0{}),
        Shape<Int<kVecLength>>{}, (_0{}));
    return Callbacks<decltype(tC_gRow), decltype(tC_rRow), decltype(tC_cRow), ProblemShape>(
        cute::move(tC_gRow), cute::move(tC_rRow), cute::move(tC_cRow), problem_shape, params_ptr);
  }
};

template <class ThreadMap, class ElementD>
struct Nodes {
  using OutputElement = ElementD;
  template <class Op, class... Children>
  using EVT = tb::Sm80EVT<Op, Children...>;
  template <template <class> class Fn, class Out, class In>
  using Compute = tb::VisitorCompute<Fn, Out, In, cutlass::FloatRoundStyle::round_to_nearest>;

  using Acc = tb::VisitorAccFetch;
  using ScaleA = tb::VisitorColBroadcast<ThreadMap, float, cute::Stride<int64_t, _0, _0>>;
  using ScaleB = RowOrScalarBroadcast<ThreadMap, float>;
  using Bias = tb::VisitorRowBroadcast<ThreadMap, ElementD, cute::Stride<_0, _1, _0>>;
  using IntPerM = tb::VisitorColBroadcast<ThreadMap, int32_t, cute::Stride<_1, _0, _0>>;
  using IntPerN = tb::VisitorRowBroadcast<ThreadMap, int32_t, cute::Stride<_0, _1, _0>>;

  static typename ScaleA::Arguments scale_a(gemmgen_scaled_mm_args const& p) {
    return {p.scale_a, 0.0f, {int64_t(p.scale_a_per_token != 0 ? 1 : 0), _0{}, _0{}}};
  }
  static typename ScaleB::Arguments scale_b(gemmgen_scaled_mm_args const& p) {
    return {p.scale_b, p.scale_b_per_channel != 0};
  }
  static typename Bias::Arguments bias(gemmgen_scaled_mm_args const& p) {
    return {static_cast<ElementD const*>(p.bias), ElementD(0), {}};
  }
  static typename IntPerM::Arguments int_per_m(int32_t const* ptr) { return {ptr, 0, {}}; }
  static typename IntPerN::Arguments int_per_n(int32_t const* ptr) { return {ptr, 0, {}}; }
};

}  // namespace gemmgen::sm80
