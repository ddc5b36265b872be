/*
 * gemmgen/mixed/sm90_mixed_mm.hpp — one sm90 (CUTLASS 3.x) mixed-input GEMM kernel behind the C ABI.
 *
 * The quantized weight goes through the register file and is converted (and scaled, and shifted
 * by its zero) in front of the 16-bit wgmma. 4-bit weights are read in the MMA's fragment order
 * (FragmentOrderAtom below): a thread's values of a 64-k tile sit in 16 contiguous bytes, one
 * shared-memory load, in the nibble order CUTLASS's cheapest int4 converter wants (10-25% faster
 * than K-major at 16-256 tokens, benchmarks/RESULTS.md, session 16). CUTLASS's mixed-input
 * mainloop wants the narrow type as the kernel's A operand so that the TMA epilogue can be used,
 * so every kernel computes
 *   Dᵀ[N, M] = W[N, K] · Aᵀ      (the weight is the kernel's A, the activations its B):
 * the kernel's M is the weight's N, and its N is the number of tokens, so a decode step (small M)
 * is a narrow tile N. The epilogue adds the optional bias, one value per weight row.
 */
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "gemmgen/mixed/mixed_mm_args.h"
#include "gemmgen/runtime_support.hpp"
#include "gemmgen/sm90_launch.hpp"

namespace gemmgen::mixed::sm90 {

// ElementA: bf16/fp16 activations (also the scale, zero and output type); ElementW: the stored
// weight type (cutlass::int4b_t or int8_t); WithZero: the scale + zero mainloop.
template <class ElementA_, class ElementW_, bool WithZero_, class TileShape_, class ClusterShape_,
          class KernelSchedule_, class EpilogueSchedule_, int Stages_ /* 0 = auto */,
          class TileScheduler_>
struct MixedMmConfig {
  using ElementA = ElementA_;
  using ElementW = ElementW_;
  static constexpr bool WithZero = WithZero_;
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  using KernelSchedule = KernelSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;
  static constexpr int Stages = Stages_;
  using TileScheduler = TileScheduler_;
};

// The 4-bit weight layout in MMA fragment order (packing.py, layout version 2; CUTLASS's
// "shuffled" mixed-input layout, as compute_memory_reordering_atom builds it for a 16-bit MMA with
// four atoms along K and the value order [0, 2, 4, 6, 1, 3, 5, 7]): per block of 16
// rows and 64 k (512 bytes), lane (g, q) of wgmma's A fragment owns 16 contiguous bytes holding
// rows g and g + 8, k slots 2q, 2q + 1, 2q + 8, 2q + 9 of the four 16-k steps; within a step's
// word the nibbles hold the fragment's values in the order [0, 2, 4, 6, 1, 3, 5, 7]. Value
// (row r0 + 8 r1, k k0 + 2 k1 + 8 k2 + 16 j) sits at nibble 128 r0 + r1 + 4 k0 + 32 k1 + 2 k2 + 8 j
// of its block; blocks are ordered row block fastest (the order of cute::tile_to_shape).
using FragmentOrderAtom =
    cute::Layout<cute::Shape<cute::Shape<cute::_8, cute::_2>, cute::Shape<cute::_2, cute::_4, cute::_2, cute::_4>>,
                 cute::Stride<cute::Stride<cute::_128, cute::_1>, cute::Stride<cute::_4, cute::_32, cute::_2, cute::_8>>>;

template <class Config>
struct MixedMm {
  using ElementA = typename Config::ElementA;   // activations = MMA type
  using ElementW = typename Config::ElementW;   // stored weight
  using ElementD = ElementA;
  using ElementScale = ElementA;
  using ElementAcc = float;
  using TileShape = typename Config::TileShape;
  // 4-bit weights come in the MMA's fragment order (packed layout version 2), 8-bit K-major
  static constexpr bool kFragmentOrderWeight = cutlass::sizeof_bits<ElementW>::value == 4;

  // The kernel's operands (see the file comment): A = weight [N, K] row-major (K contiguous),
  // B = activations [M, K] as a column-major [K, M], D = output [M, N] as a column-major [N, M].
  using LayoutWTag = cutlass::layout::RowMajor;
  using StrideWPlain = cutlass::detail::TagToStrideA_t<LayoutWTag>;
  using LayoutWFragmentOrder = decltype(cute::tile_to_shape(
      FragmentOrderAtom{}, cute::Layout<cute::Shape<int, int, int>, StrideWPlain>{}));
  using LayoutW = cute::conditional_t<kFragmentOrderWeight, LayoutWFragmentOrder, LayoutWTag>;
  using LayoutX = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::ColumnMajor;
  static constexpr int AlignW = 128 / cutlass::sizeof_bits<ElementW>::value;
  static constexpr int AlignX = 128 / cutlass::sizeof_bits<ElementA>::value;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  // D = acc + bias[row of the kernel] (a null bias pointer broadcasts 0).
  using BiasNode = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, TileShape, ElementD, float, cute::Stride<bool, cute::_0, int64_t>>;
  using Tree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      cutlass::epilogue::fusion::Sm90AccFetch, BiasNode>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape,
      typename Config::ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc,
      float, void, LayoutD, AlignD, ElementD, LayoutD, AlignD, typename Config::EpilogueSchedule,
      Tree>::CollectiveOp;

  using StageCount = cute::conditional_t<
      Config::Stages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<(Config::Stages > 0 ? Config::Stages : 1)>>;

  // The weight is paired with its scale (and zero): the mainloop converts and scales it.
  using WeightTuple = cute::conditional_t<Config::WithZero,
                                          cute::tuple<ElementW, ElementScale, ElementScale>,
                                          cute::tuple<ElementW, ElementScale>>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, WeightTuple, LayoutW, AlignW,
      ElementA, LayoutX, AlignX, ElementAcc, TileShape, typename Config::ClusterShape, StageCount,
      typename Config::KernelSchedule>::CollectiveOp;

  // A type of its own per kernel: Config is local to its translation unit (see the .cu).
  struct Kernel : cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                       CollectiveMainloop, CollectiveEpilogue,
                                                       typename Config::TileScheduler> {};
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideScale = typename CollectiveMainloop::StrideScale;

  static typename Gemm::Arguments make_arguments(gemmgen_mixed_mm_args const& p) {
    using StrideW = typename Kernel::StrideA;
    using StrideX = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    int const m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    int const group = static_cast<int>(p.group_size);
    int const scale_k = (k + group - 1) / group;

    StrideW stride_w = [&] {
      if constexpr (kFragmentOrderWeight) {
        return cute::tile_to_shape(FragmentOrderAtom{}, cute::make_shape(n, k, 1));
      } else {
        return cutlass::make_cute_packed_stride(StrideW{}, cute::make_shape(n, k, 1));
      }
    }();
    StrideX stride_x = cutlass::make_cute_packed_stride(StrideX{}, cute::make_shape(m, k, 1));
    cute::get<0>(stride_x) = p.lda;
    StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(n, m, 1));
    cute::get<1>(stride_d) = p.ldd;
    StrideScale stride_s =
        cutlass::make_cute_packed_stride(StrideScale{}, cute::make_shape(n, scale_k, 1));

    typename CollectiveMainloop::Arguments mainloop{
        static_cast<ElementW const*>(p.w), stride_w, static_cast<ElementA const*>(p.a), stride_x,
        static_cast<ElementScale const*>(p.scale), stride_s, group};
    if constexpr (Config::WithZero) {
      mainloop.ptr_Z = static_cast<ElementScale const*>(p.zero);
    }
    typename Tree::Arguments tree{
        {}, {static_cast<ElementD const*>(p.bias), ElementD(0), {p.bias != nullptr, cute::_0{}, int64_t(0)}}, {}};

    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {n, m, k, 1},
                                  mainloop,
                                  {tree, nullptr, stride_d, static_cast<ElementD*>(p.d), stride_d}};
    args.hw_info = gemmgen::sm90::hardware_info_for<Gemm>();
    gemmgen::sm90::set_scheduler_knobs(args, p.raster_order, p.max_swizzle_size);
    if constexpr (cute::is_same_v<typename Config::TileScheduler, cutlass::gemm::StreamKScheduler>) {
      args.scheduler.splits = p.split_k_slices > 1 ? p.split_k_slices : 1;
    }
    return args;
  }

  static size_t workspace_size(gemmgen_mixed_mm_args const* p) {
    return Gemm::get_workspace_size(make_arguments(*p));
  }

  static int run(gemmgen_mixed_mm_args const* p, void* workspace, size_t workspace_bytes,
                 void* stream, char const* kernel_name) {
    return gemmgen::sm90::Launcher<Gemm>::run(make_arguments(*p), workspace, workspace_bytes,
                                              stream, kernel_name);
  }
};

}  // namespace gemmgen::mixed::sm90
