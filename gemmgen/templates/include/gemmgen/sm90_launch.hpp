/*
 * gemmgen/sm90_launch.hpp — how every CUTLASS 3.x (sm90a) kernel of every op family is launched
 * behind the C ABI, once the family has built its `Gemm::Arguments`: the hardware facts its
 * persistent grid is sized by (hardware_info_for), can_implement, the workspace check and
 * initialisation, the shared-memory attribute (once per device), the launch and its status.
 */
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "cutlass/cutlass.h"
#include "cute/int_tuple.hpp"
#include "cutlass/device_kernel.h"
#include "cutlass/kernel_hardware_info.h"

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

// Raise `Kernel`'s dynamic shared memory limit once per device (false if the driver refused).
template <class Kernel>
bool allow_dynamic_shared_memory() {
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

// How many clusters of `Kernel` GPU `device` (the current one) holds at once
// (cudaOccupancyMaxActiveClusters with the kernel's block and shared memory), asked once per
// device; 0 for a kernel without clusters, or when the query fails (CUTLASS then keeps its
// estimate). CUTLASS sizes a persistent grid by it when it is given; without it, it assumes GPCs
// of 18 SMs (tile_scheduler_params.h), which on an H200 gave clusters of 4 a grid of 116 CTAs
// where 120 fit, and clusters of 8 112 where 120 fit (clusters of 2: 132, all of them; session
// 61). CUTLASS's own query (make_kernel_hardware_info) passes no shared memory, so it counts
// several CTAs an SM, and the scheduler then ignores its answer.
template <class Kernel>
int max_active_clusters(int device) {
  using Cluster = typename Kernel::ClusterShape;
  constexpr int x = cute::size<0>(Cluster{});
  constexpr int y = cute::size<1>(Cluster{});
  constexpr int z = cute::size<2>(Cluster{});
  if constexpr (x * y * z == 1) {
    return 0;
  } else {
    static std::atomic<int> known[detail::kMaxDevices] = {};  // 0: not asked yet; -1: failed
    auto& slot = known[device % detail::kMaxDevices];
    int clusters = slot.load(std::memory_order_acquire);
    if (clusters == 0) {
      clusters = -1;
      if (allow_dynamic_shared_memory<Kernel>()) {
        cudaLaunchAttribute attribute{};
        attribute.id = cudaLaunchAttributeClusterDimension;
        attribute.val.clusterDim.x = x;
        attribute.val.clusterDim.y = y;
        attribute.val.clusterDim.z = z;
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(x, y, z);
        config.blockDim = dim3(Kernel::MaxThreadsPerBlock, 1, 1);
        config.dynamicSmemBytes = Kernel::SharedStorageSize;
        config.attrs = &attribute;
        config.numAttrs = 1;
        int count = 0;
        if (cudaOccupancyMaxActiveClusters(&count, cutlass::device_kernel<Kernel>, &config) ==
                cudaSuccess &&
            count > 0) {
          clusters = count;
        } else {
          cudaGetLastError();  // a failed query leaves CUTLASS its estimate, and no error behind
        }
      }
      slot.store(clusters, std::memory_order_release);
    }
    return clusters > 0 ? clusters : 0;
  }
}

// The hardware facts a CUTLASS 3.x kernel's arguments take: the SM count and, for a kernel with
// clusters, how many fit at once (max_active_clusters).
template <class Gemm>
cutlass::KernelHardwareInfo hardware_info_for() {
  cutlass::KernelHardwareInfo info = hardware_info();
  info.max_active_clusters = max_active_clusters<typename Gemm::GemmKernel>(info.device_id);
  return info;
}

template <class Gemm>
struct Launcher {
  using Kernel = typename Gemm::GemmKernel;

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
    if (!allow_dynamic_shared_memory<Kernel>()) {
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
