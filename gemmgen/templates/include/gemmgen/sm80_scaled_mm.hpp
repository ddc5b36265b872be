/*
 * gemmgen/sm80_scaled_mm.hpp — one sm80 (CUTLASS 2.x) W8A8 scaled GEMM kernel behind the C ABI.
 *
 * Same contract as sm90_scaled_mm.hpp (gemmgen_scaled_mm_args, status codes), built from
 * DefaultGemmWithVisitor with the epilogue trees of scaled_epilogues.hpp. The binary carries
 * sm_80 SASS and compute_80 PTX, so it runs natively on Ampere/Ada and JIT-compiled on Hopper.
 */
#pragma once

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"

#include "gemmgen/c_api.h"
#include "gemmgen/runtime_support.hpp"
#include "gemmgen/scaled_epilogues.hpp"
#include "gemmgen/sm80_epilogue_nodes.hpp"

namespace gemmgen::sm80 {

template <class ElementD_, template <class> class Epilogue_, class TileShape_, class WarpShape_,
          class InstructionShape_, int Stages_, class ThreadblockSwizzle_>
struct ScaledMmConfig {
  using ElementA = int8_t;
  using ElementD = ElementD_;
  using TileShape = TileShape_;
  using WarpShape = WarpShape_;
  using InstructionShape = InstructionShape_;
  using ThreadblockSwizzle = ThreadblockSwizzle_;
  static constexpr int Stages = Stages_;
  // The epilogue thread map: 4 float accumulators per access, one epilogue stage.
  using ThreadMap = tb::OutputTileThreadLayout<TileShape_, WarpShape_, float, 4, 1>;
  using Epilogue = Epilogue_<Nodes<ThreadMap, ElementD_>>;
};

template <class Config>
struct ScaledMm {
  using ElementD = typename Config::ElementD;
  using Epilogue = typename Config::Epilogue;
  using Store = tb::VisitorAuxStore<typename Config::ThreadMap, ElementD,
                                    cutlass::FloatRoundStyle::round_to_nearest,
                                    cute::Stride<int64_t, cute::_1, int64_t>>;
  using Root = tb::Sm80EVT<Store, typename Epilogue::Tree>;

  using Kernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
      int8_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 16,
      int8_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 16,
      // ElementC only picks the accumulator staging of the base epilogue (float: the generic
      // path; int32 staging is specialised for int8 outputs). D is written by the Store node.
      float, cutlass::layout::RowMajor, 4, int32_t, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Config::TileShape, typename Config::WarpShape,
      typename Config::InstructionShape, Root, typename Config::ThreadblockSwizzle,
      Config::Stages, cutlass::arch::OpMultiplyAddSaturate, 1>::GemmKernel;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments make_arguments(gemmgen_scaled_mm_args const& p) {
    typename Root::Arguments epilogue{
        Epilogue::arguments(p), {static_cast<ElementD*>(p.d), {p.ldd, cute::_1{}, int64_t(0)}}};
    cutlass::gemm::GemmCoord problem(static_cast<int>(p.m), static_cast<int>(p.n),
                                     static_cast<int>(p.k));
    return typename Gemm::Arguments(cutlass::gemm::GemmUniversalMode::kGemm, problem,
                                    /*batch_count=*/1, epilogue, p.a, p.b, nullptr, nullptr,
                                    0, 0, 0, 0, p.lda, p.ldb, 0, 0);
  }

  static size_t workspace_size(gemmgen_scaled_mm_args const* p) {
    return Gemm::get_workspace_size(make_arguments(*p));
  }

  static int run(gemmgen_scaled_mm_args const* p, void* workspace, size_t workspace_bytes,
                 void* stream, char const* kernel_name) {
    if (!device_at_least(8, 0)) {
      return fail(GEMMGEN_WRONG_ARCH, kernel_name, "needs an sm80 or newer GPU");
    }
    auto args = make_arguments(*p);
    Gemm gemm;
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, cutlassGetStatusString(status));
    }
    if (Gemm::get_workspace_size(args) > workspace_bytes) {
      return fail(GEMMGEN_WORKSPACE_TOO_SMALL, kernel_name, "workspace smaller than required");
    }
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    status = gemm.initialize(args, workspace, cuda_stream);
    if (status != cutlass::Status::kSuccess) {
      return fail(GEMMGEN_INITIALIZE_FAILED, kernel_name, cutlassGetStatusString(status));
    }
    return launch_status(gemm.run(cuda_stream), kernel_name);
  }
};

}  // namespace gemmgen::sm80
