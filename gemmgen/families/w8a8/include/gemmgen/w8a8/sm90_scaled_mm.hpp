/*
 * gemmgen/sm90_scaled_mm.hpp — one sm90 (CUTLASS 3.x) W8A8 scaled GEMM kernel behind the C ABI.
 *
 * A generated translation unit names a config (element types, epilogue, tile, cluster, schedules,
 * stages, tile scheduler, swap-AB) and exports `run` / `workspace_size` for it; everything else
 * lives here, shared by every kernel.
 */
#pragma once

// Programmatic dependent launch: CUTLASS's sm90 kernels then wait at `griddepcontrol.wait` before
// their first global read and let the next kernel of the stream start its prologue once their
// mainloop is done (`griddepcontrol.launch_dependents`). Both are no-ops for a launch without the
// PDL attribute, which the caller asks for per call (gemmgen_scaled_mm_args.launch_flags).
// Defined before any CUTLASS header: it selects what cutlass/arch/grid_dependency_control.h emits.
// A translation unit of stream-K kernels defines GEMMGEN_SM90_WITHOUT_GDC first (the template
// does): CUTLASS 4.2's stream-K scheduler does not compile with GDC on (its const `is_last_tile`,
// which the cooperative kernel calls only then, binds a member to a non-const reference), so
// those kernels are built without it and launched without the PDL attribute (run(), below).
#if !defined(CUTLASS_ENABLE_GDC_FOR_SM90) && !defined(GEMMGEN_SM90_WITHOUT_GDC)
#define CUTLASS_ENABLE_GDC_FOR_SM90 1
#endif

#include <cuda_runtime.h>

#include <atomic>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "gemmgen/w8a8/scaled_mm_args.h"
#include "gemmgen/runtime_support.hpp"
#include "gemmgen/sm90_launch.hpp"
#include "gemmgen/w8a8/scaled_epilogues.hpp"
#include "gemmgen/w8a8/sm90_epilogue_nodes.hpp"

namespace gemmgen::sm90 {

template <class ElementA_, class ElementD_, template <class> class Epilogue_,
          class TileShape_, class ClusterShape_, class KernelSchedule_, class EpilogueSchedule_,
          int Stages_ /* 0 = auto */, class TileScheduler_, bool SwapAB_>
struct ScaledMmConfig {
  using ElementA = ElementA_;
  using ElementB = ElementA_;
  using ElementD = ElementD_;
  using ElementAcc = cute::conditional_t<cute::is_same_v<ElementA_, int8_t>, int32_t, float>;
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  using KernelSchedule = KernelSchedule_;
  using EpilogueSchedule = EpilogueSchedule_;
  using TileScheduler = TileScheduler_;
  static constexpr int Stages = Stages_;
  static constexpr bool SwapAB = SwapAB_;
  using Epilogue = Epilogue_<Nodes<SwapAB_, TileShape_, ElementD_>>;
};

template <class Config>
struct ScaledMm {
  using ElementA = typename Config::ElementA;
  using ElementD = typename Config::ElementD;
  using ElementAcc = typename Config::ElementAcc;
  using Epilogue = typename Config::Epilogue;

  // The kernel's own operands: with swap-AB it computes Dᵀ[N,M] = B'[N,K] · A'ᵀ, where the weight
  // (column-major [K,N] = row-major [N,K]) is the kernel's A and the activations its B.
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cute::conditional_t<Config::SwapAB, cutlass::layout::ColumnMajor,
                                      cutlass::layout::RowMajor>;
  static constexpr int AlignAB = 128 / cutlass::sizeof_bits<ElementA>::value;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::TileShape,
      typename Config::ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc,
      float, void, LayoutD, AlignD, ElementD, LayoutD, AlignD, typename Config::EpilogueSchedule,
      typename Epilogue::Tree>::CollectiveOp;

  using StageCount = cute::conditional_t<
      Config::Stages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<(Config::Stages > 0 ? Config::Stages : 1)>>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, AlignAB, ElementA,
      LayoutB, AlignAB, ElementAcc, typename Config::TileShape, typename Config::ClusterShape,
      StageCount, typename Config::KernelSchedule>::CollectiveOp;

  // A type of its own per kernel: Config is local to its translation unit (see the .cu).
  struct Kernel : cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>,
                                                       CollectiveMainloop, CollectiveEpilogue,
                                                       typename Config::TileScheduler> {};
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments make_arguments(gemmgen_scaled_mm_args const& p) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    int const m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);

    StrideA stride_a{};
    StrideB stride_b{};
    StrideD stride_d{};
    void const* ptr_a;
    void const* ptr_b;
    cute::Shape<int, int, int, int> problem;
    if constexpr (Config::SwapAB) {
      problem = {n, m, k, 1};
      ptr_a = p.b;  // weight rows are N, K contiguous, row stride ldb
      ptr_b = p.a;  // activation columns are M, K contiguous, column stride lda
      stride_a = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(n, k, 1));
      cute::get<0>(stride_a) = p.ldb;
      stride_b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(m, k, 1));
      cute::get<0>(stride_b) = p.lda;
      stride_d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(n, m, 1));
      cute::get<1>(stride_d) = p.ldd;
    } else {
      problem = {m, n, k, 1};
      ptr_a = p.a;
      ptr_b = p.b;
      stride_a = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, k, 1));
      cute::get<0>(stride_a) = p.lda;
      stride_b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(n, k, 1));
      cute::get<0>(stride_b) = p.ldb;
      stride_d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(m, n, 1));
      cute::get<0>(stride_d) = p.ldd;
    }

    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        problem,
        {static_cast<ElementA const*>(ptr_a), stride_a, static_cast<ElementA const*>(ptr_b),
         stride_b},
        {Epilogue::arguments(p), nullptr, stride_d, static_cast<ElementD*>(p.d), stride_d}};
    args.hw_info = gemmgen::sm90::hardware_info_for<Gemm>();
    gemmgen::sm90::set_scheduler_knobs(args, p.raster_order, p.max_swizzle_size);
    return args;
  }

  static size_t workspace_size(gemmgen_scaled_mm_args const* p) {
    return Gemm::get_workspace_size(make_arguments(*p));
  }

  static int run(gemmgen_scaled_mm_args const* p, void* workspace, size_t workspace_bytes,
                 void* stream, char const* kernel_name) {
#ifdef CUTLASS_ENABLE_GDC_FOR_SM90
    bool const pdl = (p->launch_flags & GEMMGEN_LAUNCH_PDL) != 0;
#else
    bool const pdl = false;  // built without GDC: it would not wait for the previous kernel
#endif
    return Launcher<Gemm>::run(make_arguments(*p), workspace, workspace_bytes, stream,
                               kernel_name, pdl);
  }
};

}  // namespace gemmgen::sm90
