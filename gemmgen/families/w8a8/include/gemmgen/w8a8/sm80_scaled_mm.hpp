/*
 * gemmgen/sm80_scaled_mm.hpp — one sm80 (CUTLASS 2.x) W8A8 scaled GEMM kernel behind the C ABI.
 *
 * Same contract as sm90_scaled_mm.hpp (gemmgen_scaled_mm_args, status codes), built from
 * DefaultGemmWithVisitor with the epilogue trees of scaled_epilogues.hpp. The binary carries
 * sm_80 SASS and compute_80 PTX, so it runs natively on Ampere/Ada and JIT-compiled on Hopper.
 */
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/device/gemm_universal_base.h"
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"

#include "gemmgen/w8a8/scaled_mm_args.h"
#include "gemmgen/runtime_support.hpp"
#include "gemmgen/w8a8/scaled_epilogues.hpp"
#include "gemmgen/w8a8/sm80_epilogue_nodes.hpp"
#include "gemmgen/w8a8/splitk_epilogue.cuh"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/kernel/default_gemm_universal.h"

namespace gemmgen::sm80 {

enum class SplitK { kNone = 0, kSerial = 1, kParallel = 2 };

template <class ElementD_, template <class> class Epilogue_, class TileShape_, class WarpShape_,
          class InstructionShape_, int Stages_, class ThreadblockSwizzle_,
          SplitK SplitK_ = SplitK::kNone>
struct ScaledMmConfig {
  using ElementA = int8_t;
  using ElementD = ElementD_;
  using TileShape = TileShape_;
  using WarpShape = WarpShape_;
  using InstructionShape = InstructionShape_;
  using ThreadblockSwizzle = ThreadblockSwizzle_;
  static constexpr int Stages = Stages_;
  static constexpr SplitK SplitKMode = SplitK_;
  // The epilogue thread map: 4 float accumulators per access, one epilogue stage.
  using ThreadMap = tb::OutputTileThreadLayout<TileShape_, WarpShape_, float, 4, 1>;
  using Epilogue = Epilogue_<Nodes<ThreadMap, ElementD_>>;
};

// Split-K: a plain GEMM writes fp32 partial sums (serial: one buffer reduced in place under a
// semaphore; parallel: one buffer per slice), then splitk_scaled_epilogue reduces and applies the
// epilogue. Workspace: [partials, 256-byte aligned][serial only: the GEMM's semaphores].
template <class Config>
struct SplitKPath {
  static constexpr bool kSerial = Config::SplitKMode == SplitK::kSerial;
  // A type of its own per kernel, like ScaledMm::Kernel.
  struct Kernel : cutlass::gemm::kernel::DefaultGemmUniversal<
      int8_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 16,
      int8_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 16,
      float, cutlass::layout::RowMajor, int32_t, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Config::TileShape, typename Config::WarpShape,
      typename Config::InstructionShape,
      cutlass::epilogue::thread::LinearCombination<float, 4, int32_t, float>,
      typename Config::ThreadblockSwizzle, Config::Stages,
      cutlass::arch::OpMultiplyAddSaturate>::GemmKernel {};
  // NOTES: not GemmUniversalAdapter: for a non-EVT 2.x kernel with a row-major C it transposes
  // the problem (swapping A/B and M/N), expecting a kernel built for the transposed form.
  // GemmUniversalBase::run swallows the CUDA error of a failed launch (it returns "Error
  // Internal"), so the launch is ours: the error string reaches the caller.
  struct Gemm : cutlass::gemm::device::GemmUniversalBase<Kernel> {
    using Base = cutlass::gemm::device::GemmUniversalBase<Kernel>;
    cudaError_t launch(cudaStream_t stream) const {
      dim3 const block(Kernel::kThreadCount, 1, 1);
      dim3 const grid = this->params_.get_grid_dims();
      cutlass::Kernel2<Kernel><<<grid, block, Base::kSharedStorageSize, stream>>>(this->params_);
      return cudaGetLastError();
    }
    // K partitions CUTLASS actually made: it rounds each slice up to a 128-byte multiple of K,
    // so a small K gets fewer partitions (and written partial buffers) than slices requested.
    int k_partitions() const { return this->params_.grid_tiled_shape.k(); }
  };

  static size_t partial_bytes(gemmgen_scaled_mm_args const& p) {
    size_t buffers = kSerial ? 1 : static_cast<size_t>(p.split_k_slices);
    return (buffers * p.m * p.n * sizeof(float) + 255) / 256 * 256;
  }

  static typename Gemm::Arguments make_arguments(gemmgen_scaled_mm_args const& p, float* partials) {
    cutlass::gemm::GemmCoord problem(static_cast<int>(p.m), static_cast<int>(p.n),
                                     static_cast<int>(p.k));
    auto mode = kSerial ? cutlass::gemm::GemmUniversalMode::kGemm
                        : cutlass::gemm::GemmUniversalMode::kGemmSplitKParallel;
    int64_t const slice = p.m * p.n;
    return typename Gemm::Arguments(mode, problem, p.split_k_slices, {1.0f, 0.0f}, p.a, p.b,
                                    partials, partials, 0, 0, slice, slice, p.lda, p.ldb, p.n, p.n);
  }

  // Serial: the partials plus CUTLASS's tile semaphores. Parallel: the partials only; CUTLASS
  // sizes a workspace for the per-slice outputs too, but in this mode its kernel writes them to
  // ptr_D (our partials) and leaves the workspace unused.
  static size_t workspace_size(gemmgen_scaled_mm_args const& p) {
    return partial_bytes(p) + (kSerial ? Gemm::get_workspace_size(make_arguments(p, nullptr)) : 0);
  }

  static int run(gemmgen_scaled_mm_args const& p, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream, char const* kernel_name) {
    if (workspace_size(p) > workspace_bytes || workspace == nullptr) {
      return fail(GEMMGEN_WORKSPACE_TOO_SMALL, kernel_name, "split-K workspace smaller than required");
    }
    auto* partials = static_cast<float*>(workspace);
    void* gemm_workspace = kSerial ? static_cast<char*>(workspace) + partial_bytes(p) : nullptr;
    auto args = make_arguments(p, partials);
    Gemm gemm;
    cutlass::Status status = gemm.can_implement(args);
    if (status != cutlass::Status::kSuccess) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, cutlassGetStatusString(status));
    }
    status = gemm.initialize(args, gemm_workspace, stream);
    if (status != cutlass::Status::kSuccess) {
      return fail(GEMMGEN_INITIALIZE_FAILED, kernel_name,
                  (std::string(cutlassGetStatusString(status)) + " (CUDA: " +
                   cudaGetErrorString(cudaGetLastError()) + ")").c_str());
    }
    cudaError_t pending = cudaGetLastError();
    if (pending != cudaSuccess) {
      return fail(GEMMGEN_LAUNCH_FAILED, kernel_name,
                  (std::string("a CUDA error was pending before the split-K launch: ") +
                   cudaGetErrorString(pending)).c_str());
    }
    cudaError_t launched = gemm.launch(stream);
    if (launched != cudaSuccess) {
      return fail(GEMMGEN_LAUNCH_FAILED, kernel_name,
                  (std::string("split-K partial GEMM launch: ") + cudaGetErrorString(launched) +
                   " (shared memory " + std::to_string(Gemm::kSharedStorageSize) + " bytes, " +
                   std::to_string(Kernel::kThreadCount) + " threads)").c_str());
    }
    int slices = kSerial ? 1 : gemm.k_partitions();
    cudaError_t error = launch_splitk_scaled_epilogue<typename Config::ElementD>(
        partials, slices, p.m * p.n, p, stream);
    return error == cudaSuccess ? GEMMGEN_OK
                                : fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(error));
  }
};

template <class Config>
struct ScaledMm {
  using ElementD = typename Config::ElementD;
  using Epilogue = typename Config::Epilogue;
  using Store = tb::VisitorAuxStore<typename Config::ThreadMap, ElementD,
                                    cutlass::FloatRoundStyle::round_to_nearest,
                                    cute::Stride<int64_t, cute::_1, int64_t>>;
  using Root = tb::Sm80EVT<Store, typename Epilogue::Tree>;

  // A type of its own per kernel: Config is local to its translation unit (see the .cu).
  struct Kernel : cutlass::gemm::kernel::DefaultGemmWithVisitor<
      int8_t, cutlass::layout::RowMajor, cutlass::ComplexTransform::kNone, 16,
      int8_t, cutlass::layout::ColumnMajor, cutlass::ComplexTransform::kNone, 16,
      // ElementC only picks the accumulator staging of the base epilogue (float: the generic
      // path; int32 staging is specialised for int8 outputs). D is written by the Store node.
      float, cutlass::layout::RowMajor, 4, int32_t, float, cutlass::arch::OpClassTensorOp,
      cutlass::arch::Sm80, typename Config::TileShape, typename Config::WarpShape,
      typename Config::InstructionShape, Root, typename Config::ThreadblockSwizzle,
      Config::Stages, cutlass::arch::OpMultiplyAddSaturate, 1>::GemmKernel {};
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

  static constexpr bool kHasSplitK = Config::SplitKMode != SplitK::kNone;

  static size_t workspace_size(gemmgen_scaled_mm_args const* p) {
    if constexpr (kHasSplitK) {
      if (p->split_k_slices > 1) {
        return SplitKPath<Config>::workspace_size(*p);
      }
    }
    return Gemm::get_workspace_size(make_arguments(*p));
  }

  static int run(gemmgen_scaled_mm_args const* p, void* workspace, size_t workspace_bytes,
                 void* stream, char const* kernel_name) {
    if (p->split_k_slices > 1) {
      if constexpr (kHasSplitK) {
        return SplitKPath<Config>::run(*p, workspace, workspace_bytes,
                                       static_cast<cudaStream_t>(stream), kernel_name);
      } else {
        return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                    "split-K requested, but this kernel was built without `split_k`");
      }
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
