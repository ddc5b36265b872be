/*
 * gemmgen/sm90_launch.hpp — how every CUTLASS 3.x (sm90a) kernel of every op family is launched
 * behind the C ABI, once the family has built its `Gemm::Arguments`: can_implement, the
 * workspace check and initialisation, the shared-memory attribute (once per device), the launch
 * and its status.
 */
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"

#include "gemmgen/c_api.h"
#include "gemmgen/runtime_support.hpp"

namespace gemmgen::sm90 {

// The run-time scheduler knobs of every CUTLASS 3.x kernel: raster order (0 heuristic, 1 along
// M, 2 along N, in the kernel's terms) and the swizzle size (1, 2, 4 or 8).
template <class Arguments>
void set_scheduler_knobs(Arguments& args, int raster_order, int max_swizzle_size) {
  using RasterOrder = decltype(args.scheduler.raster_order);
  args.scheduler.raster_order = raster_order == 1   ? RasterOrder::AlongM
                                : raster_order == 2 ? RasterOrder::AlongN
                                                    : RasterOrder::Heuristic;
  args.scheduler.max_swizzle_size = max_swizzle_size > 0 ? max_swizzle_size : 1;
}

template <class Gemm>
struct Launcher {
  using Kernel = typename Gemm::GemmKernel;

  // Raise the kernel's dynamic shared memory limit once per device.
  static bool allow_dynamic_shared_memory() {
    static std::atomic<bool> done[detail::kMaxDevices] = {};
    auto& flag = done[detail::current_device() % detail::kMaxDevices];
    if (flag.load(std::memory_order_acquire)) {
      return true;
    }
    constexpr int smem_bytes = Kernel::SharedStorageSize;
    if constexpr (smem_bytes >= (48 << 10)) {
      if (cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               smem_bytes) != cudaSuccess) {
        cudaGetLastError();  // clear the error so the next call can retry
        return false;
      }
    }
    flag.store(true, std::memory_order_release);
    return true;
  }

  // `with_pdl`: launch as a programmatic dependent of the stream's previous kernel (the kernel
  // must be compiled with CUTLASS_ENABLE_GDC_FOR_SM90, so that it waits before reading).
  static int run(typename Gemm::Arguments const& args, void* workspace, size_t workspace_bytes,
                 void* stream, char const* kernel_name, bool with_pdl = false) {
    cutlass::Status status = Gemm::can_implement(args);
    if (status != cutlass::Status::kSuccess) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name, cutlassGetStatusString(status));
    }
    if (Gemm::get_workspace_size(args) > workspace_bytes) {
      return fail(GEMMGEN_WORKSPACE_TOO_SMALL, kernel_name, "workspace smaller than required");
    }
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    status = Kernel::initialize_workspace(args, workspace, cuda_stream);
    if (status != cutlass::Status::kSuccess) {
      return fail(GEMMGEN_INITIALIZE_FAILED, kernel_name, cutlassGetStatusString(status));
    }
    if (!allow_dynamic_shared_memory()) {
      return fail(GEMMGEN_INITIALIZE_FAILED, kernel_name,
                  "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed");
    }
    // NOTES: the adapter's initialize() would call cudaFuncSetAttribute on every launch; the
    // attribute is per device and per kernel, so it is set once and the static run() is used.
    auto params = Kernel::to_underlying_arguments(args, workspace);
    return launch_status(Gemm::run(params, cuda_stream, nullptr, with_pdl), kernel_name);
  }
};

}  // namespace gemmgen::sm90
