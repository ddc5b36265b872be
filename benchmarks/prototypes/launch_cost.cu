// A measurement prototype, not a benchmark of record: where the host time of one sm90 W8A8
// kernel call goes inside the C library (issue 14 item 7), without Python or ctypes. Each row
// is the host time of back-to-back calls divided by their count (median of 7 batches of 2000,
// after a warm-up; the GPU runs M = 16, N = K = 4096, small enough that the queue never fills):
//
//   - the library's whole C entry point `gemmgen_run_<kernel>` (dlopen of a built library):
//     arch check, CUTLASS arguments, can_implement, workspace check, TMA descriptors, launch;
//   - its `gemmgen_workspace_<kernel>`;
//   - an empty kernel launched the way CUTLASS launches a 1x1x1-cluster sm90 kernel
//     (cudaLaunchKernelEx with the programmatic-serialization attribute, the same block size
//     and dynamic shared memory): the launch alone;
//   - one cuTensorMapEncodeTiled, found through the runtime as CUTLASS finds it (a K-major int8
//     operand, 128-byte swizzle; the kernel encodes one for A, one for B and one for D a call);
//   - cudaGetDevice, cudaGetLastError (each called a few times a launch).
//
// Not built by gemmgen; on a Hopper machine, with a W8A8 sm90 library built:
//
//   nvcc -O2 -std=c++17 -arch=sm_90a -Igemmgen/templates/include -Igemmgen/families/w8a8/include \
//        -o /tmp/launch_cost benchmarks/prototypes/launch_cost.cu -ldl
//   /tmp/launch_cost <path to libgemmgen_*.so> <kernel name>
//
// Run in session 28 (H200; RESULTS.md, "Host cost of a call, session 28"): the whole entry point
// 4.2-4.5 µs for the t64x16x256 swap-AB kernel, of which the launch is ~3 µs (an empty kernel:
// 2.7-3.3 µs with PDL, 3.6-4.0 without) and the three TMA descriptors ~0.2 µs (0.05-0.08 µs
// each): nothing there is worth caching. The stream-K t128x128x128 kernel's entry point: 15.4-15.9 µs
// in batches of 2000 calls; session 30 added the batches of 32 and the GPU time, to tell the host's
// cost from a full launch queue.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gemmgen/w8a8/scaled_mm_args.h"

#include "cuda_check.h"  // CHECK

namespace {

// `calls` a batch: 2000 measures the steady state, where a call whose GPU time exceeds its host
// time fills the launch queue and the host then waits on the GPU; 32 (with 51 batches) stays far
// below the queue's depth, so it is the host's own cost.
template <class F>
double host_us_per_call(F&& call, int calls = 2000) {
  for (int i = 0; i < 500; ++i) call();
  CHECK(cudaDeviceSynchronize());
  std::vector<double> batches;
  for (int b = 0; b < (calls < 100 ? 51 : 7); ++b) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    auto stop = std::chrono::steady_clock::now();
    batches.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / calls);
    CHECK(cudaDeviceSynchronize());
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

// GPU time a call: events around 200 back-to-back calls, median of 7.
template <class F>
double gpu_us_per_call(F&& call, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<double> batches;
  for (int b = 0; b < 7; ++b) {
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < 200; ++i) call();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    batches.push_back(ms * 1000.0 / 200);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

__global__ void empty_kernel() {}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <libgemmgen_*.so> <sm90 int8 -> bf16 kernel with bias>\n", argv[0]);
    return 2;
  }
  void* library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  using Run = int (*)(const gemmgen_scaled_mm_args*, void*, size_t, void*);
  using Workspace = size_t (*)(const gemmgen_scaled_mm_args*);
  auto run = reinterpret_cast<Run>(dlsym(library, ("gemmgen_run_" + std::string(argv[2])).c_str()));
  auto workspace = reinterpret_cast<Workspace>(dlsym(library, ("gemmgen_workspace_" + std::string(argv[2])).c_str()));
  if (!run || !workspace) {
    std::fprintf(stderr, "no kernel %s in %s\n", argv[2], argv[1]);
    return 1;
  }
  int const m = 16, n = 4096, k = 4096;
  int8_t *a, *b;
  void *d, *bias;  // bf16
  float *scale_a, *scale_b;
  CHECK(cudaMalloc(&a, size_t(m) * k));
  CHECK(cudaMalloc(&b, size_t(n) * k));
  CHECK(cudaMalloc(&d, size_t(m) * n * 2));
  CHECK(cudaMalloc(&bias, size_t(n) * 2));
  CHECK(cudaMalloc(&scale_a, m * 4));
  CHECK(cudaMalloc(&scale_b, n * 4));
  CHECK(cudaMemset(a, 1, size_t(m) * k));
  CHECK(cudaMemset(b, 1, size_t(n) * k));
  CHECK(cudaMemset(bias, 0, size_t(n) * 2));
  CHECK(cudaMemset(scale_a, 0, m * 4));
  CHECK(cudaMemset(scale_b, 0, n * 4));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  gemmgen_scaled_mm_args args = {};
  args.a = a;
  args.b = b;
  args.d = d;
  args.m = m;
  args.n = n;
  args.k = k;
  args.lda = k;
  args.ldb = k;
  args.ldd = n;
  args.scale_a = scale_a;
  args.scale_b = scale_b;
  args.bias = bias;
  args.scale_a_per_token = 1;
  args.scale_b_per_channel = 1;
  args.max_swizzle_size = 1;
  args.split_k_slices = 1;
  args.launch_flags = GEMMGEN_LAUNCH_PDL;
  size_t const workspace_bytes = workspace(&args);
  void* workspace_ptr = nullptr;
  if (workspace_bytes) CHECK(cudaMalloc(&workspace_ptr, workspace_bytes));
  int status = run(&args, workspace_ptr, workspace_bytes, stream);
  if (status != 0) {
    std::fprintf(stderr, "run failed: status %d\n", status);
    return 1;
  }

  std::printf("host time a call (µs), M=%d N=%d K=%d, %s\n", m, n, k, argv[2]);
  std::printf("  gemmgen_run_<kernel> (the whole C entry point)   %6.2f\n",
              host_us_per_call([&] { run(&args, workspace_ptr, workspace_bytes, stream); }));
  std::printf("  the same, batches of 32 calls (the host alone)   %6.2f\n",
              host_us_per_call([&] { run(&args, workspace_ptr, workspace_bytes, stream); }, 32));
  std::printf("  its GPU time a call (events)                     %6.2f\n",
              gpu_us_per_call([&] { run(&args, workspace_ptr, workspace_bytes, stream); }, stream));
  if (workspace_bytes) {
    std::printf("  cudaMemsetAsync of its workspace (%zu B), 32s    %6.2f\n", workspace_bytes,
                host_us_per_call([&] { cudaMemsetAsync(workspace_ptr, 0, workspace_bytes, stream); }, 32));
  }
  std::printf("  gemmgen_workspace_<kernel>                       %6.2f\n",
              host_us_per_call([&] { workspace(&args); }));

  int const smem = 200 * 1024;
  CHECK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  for (int pdl = 0; pdl < 2; ++pdl) {
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(132);
    config.blockDim = dim3(384);
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = pdl;
    std::printf("  empty kernel, cudaLaunchKernelEx, PDL %s          %6.2f\n", pdl ? "on " : "off",
                host_us_per_call([&] { cudaLaunchKernelEx(&config, empty_kernel); }));
  }

  using Encode = decltype(&cuTensorMapEncodeTiled);
  Encode encode = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode),
                                         12000, cudaEnableDefault, &found));
  CUtensorMap map;
  cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(m)};
  cuuint64_t strides[1] = {cuuint64_t(k)};
  cuuint32_t box[2] = {128, 64};
  cuuint32_t element_strides[2] = {1, 1};
  std::printf("  cuTensorMapEncodeTiled (int8 [M, K], 128B swizzle) %6.2f\n", host_us_per_call([&] {
                encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, a, dims, strides, box,
                                       element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
              }));
  int device = 0;
  std::printf("  cudaGetDevice                                    %6.2f\n",
              host_us_per_call([&] { cudaGetDevice(&device); }));
  std::printf("  cudaGetLastError                                 %6.2f\n",
              host_us_per_call([&] { (void)cudaGetLastError(); }));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaGetLastError());
  return 0;
}
