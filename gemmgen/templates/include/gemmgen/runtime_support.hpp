/*
 * gemmgen/runtime_support.hpp — small host-side helpers shared by every generated kernel:
 * the thread-local last-error message, per-device facts cached once (SM count, arch), and the
 * once-per-device shared-memory opt-in of the families' own kernels.
 */
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <utility>

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.h"
#include "gemmgen/c_api.h"

namespace gemmgen {

inline std::string& last_error_message() {
  thread_local std::string message;
  return message;
}

inline int fail(int code, char const* kernel_name, char const* what) {
  last_error_message() = std::string(kernel_name) + ": " + what;
  return code;
}

// The status of a launch: any CUDA error the launch left behind, then CUTLASS's own.
inline int launch_status(cutlass::Status status, char const* kernel_name) {
  cudaError_t launch = cudaGetLastError();
  if (launch != cudaSuccess) {
    return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launch));
  }
  if (status != cutlass::Status::kSuccess) {
    return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cutlassGetStatusString(status));
  }
  return GEMMGEN_OK;
}

namespace detail {
constexpr int kMaxDevices = 64;

// NOTES: device attributes are read once per device and cached: cudaDeviceGetAttribute on every
// GEMM call would add host latency to small-M problems, where host time is the whole budget.
struct DeviceFacts {
  std::atomic<int> sm_count{0};
  std::atomic<int> cc_major{0};
  std::atomic<int> cc_minor{0};
  std::atomic<int> l2_bytes{0};
};

inline DeviceFacts& facts(int device) {
  static DeviceFacts table[kMaxDevices];
  DeviceFacts& f = table[device % kMaxDevices];
  if (f.sm_count.load(std::memory_order_acquire) == 0) {
    int sms = 0, major = 0, minor = 0, l2 = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    f.cc_major.store(major, std::memory_order_relaxed);
    f.cc_minor.store(minor, std::memory_order_relaxed);
    f.l2_bytes.store(l2, std::memory_order_relaxed);
    f.sm_count.store(sms, std::memory_order_release);
  }
  return f;
}

inline int current_device() {
  int device = 0;
  cudaGetDevice(&device);
  return device;
}
}  // namespace detail

inline cutlass::KernelHardwareInfo hardware_info() {
  int device = detail::current_device();
  cutlass::KernelHardwareInfo info;
  info.device_id = device;
  info.sm_count = detail::facts(device).sm_count.load(std::memory_order_acquire);
  return info;
}

// The current GPU's L2 cache in bytes.
inline int l2_cache_bytes() {
  return detail::facts(detail::current_device()).l2_bytes.load(std::memory_order_relaxed);
}

// Once per device (`raised`: the kernel's own flags, a static of its launcher): check that the
// current GPU's opt-in shared memory per block covers `bytes` (the manifest check uses the least
// of the arch's GPUs: say so clearly if one has less) and raise `kernel`'s dynamic limit to it.
// GEMMGEN_OK, or the failure recorded by fail().
template <class KernelFn>
int allow_shared_memory_once(KernelFn* kernel, int bytes,
                             std::atomic<bool> (&raised)[detail::kMaxDevices],
                             char const* kernel_name) {
  int const device = detail::current_device();
  auto& flag = raised[device % detail::kMaxDevices];
  if (flag.load(std::memory_order_acquire)) {
    return GEMMGEN_OK;
  }
  int optin = 0;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess &&
      optin < bytes) {
    return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                "needs more shared memory per block than this GPU allows (fewer stages)");
  }
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) !=
      cudaSuccess) {
    cudaGetLastError();  // clear the error so the next call can retry
    return fail(GEMMGEN_INITIALIZE_FAILED, kernel_name,
                "cudaFuncSetAttribute(MaxDynamicSharedMemorySize) failed");
  }
  flag.store(true, std::memory_order_release);
  return GEMMGEN_OK;
}

// Programmatic dependent launch (sm90 and later; no-ops before, and for a launch without the
// attribute). A kernel launched with `launch_maybe_pdl(..., true)` may start while the stream's
// previous kernel still runs: it must call pdl_wait() before its first global read of anything
// a kernel may have written and before its first global write (the wait returns once the
// previous grid has completed and its writes are visible), and calls pdl_release() to let the
// next kernel start launching in turn. Reads before the wait are for data no kernel writes
// while the ops run (the mixed-input kernels' packed weights: model constants).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent when `pdl`, in
// thread-block clusters of `cluster` CTAs when that is not (1, 1, 1) (sm90).
template <class... Params, class... Args>
cudaError_t launch_clustered_maybe_pdl(void (*kernel)(Params...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t stream, bool pdl, dim3 cluster,
                                       Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (pdl) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster.x;
    attributes[count].val.clusterDim.y = cluster.y;
    attributes[count].val.clusterDim.z = cluster.z;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent when `pdl`.
template <class... Params, class... Args>
cudaError_t launch_maybe_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             cudaStream_t stream, bool pdl, Args&&... args) {
  return launch_clustered_maybe_pdl(kernel, grid, block, smem, stream, pdl, dim3(1, 1, 1),
                                    std::forward<Args>(args)...);
}

// Whether the current device's compute capability lies in [min, max]: the arch policy
// (gemmgen/arch.py) renders each generated entry point's bounds, so it is written once.
inline bool device_supports(int min_major, int min_minor, int max_major, int max_minor) {
  auto& f = detail::facts(detail::current_device());
  int const cc = 10 * f.cc_major.load(std::memory_order_relaxed) +
                 f.cc_minor.load(std::memory_order_relaxed);
  return cc >= 10 * min_major + min_minor && cc <= 10 * max_major + max_minor;
}

}  // namespace gemmgen
