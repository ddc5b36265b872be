// benchmarks/prototypes/cluster_occupancy.cu — how many thread-block clusters of 1, 2, 4, 8 and 16
// CTAs this GPU holds at once for a kernel of one CTA an SM (384 threads, 200 KB of dynamic shared
// memory, as the sm90a W8A8 tiles), by cudaOccupancyMaxActiveClusters, beside the count with no
// shared memory (what CUTLASS's own query asks) and CUTLASS's estimate without a query (GPCs of
// 18 SMs, tile_scheduler_params.h). Session 61, benchmarks/RESULTS.md.
//   nvcc -arch=sm_90a -o /tmp/cluster_occupancy benchmarks/prototypes/cluster_occupancy.cu && /tmp/cluster_occupancy
#include <cstdio>

#include <cuda_runtime.h>

__global__ void one_cta_an_sm(int* out) {
  extern __shared__ int smem[];
  if (out) {
    out[0] = smem[threadIdx.x];
  }
}

// CUTLASS 4.2's get_max_cta_occupancy: CTAs it launches for clusters of `size` without a query.
int cutlass_estimate(int size, int sms) {
  int const per_gpc = 18 - 18 % size, residual = sms % 18;
  int const ctas = sms / 18 * per_gpc + residual - residual % size;
  return ctas < sms ? ctas : sms;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int const smem = 200 * 1024;
  cudaFuncSetAttribute(one_cta_an_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(one_cta_an_sm, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int size : {1, 2, 4, 8, 16}) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = size;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(size, 1, 1);
    config.blockDim = dim3(384, 1, 1);
    config.attrs = &attribute;
    config.numAttrs = 1;
    int with_smem = -1, without = -1;
    config.dynamicSmemBytes = smem;
    cudaError_t const status = cudaOccupancyMaxActiveClusters(&with_smem, one_cta_an_sm, &config);
    config.dynamicSmemBytes = 0;
    cudaOccupancyMaxActiveClusters(&without, one_cta_an_sm, &config);
    std::printf("%d SMs, clusters of %2d: %3d at once (%3d CTAs; %s); with no shared memory %3d; "
                "CUTLASS's estimate %3d CTAs\n",
                sms, size, with_smem, with_smem * size, cudaGetErrorString(status), without,
                cutlass_estimate(size, sms));
  }
  return 0;
}
