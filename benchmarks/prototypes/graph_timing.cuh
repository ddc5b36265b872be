// The measurement prototypes' CUDA-graph timing: the median µs a call of `calls` calls of f(i)
// captured in one graph, over 9 replays (one replay first, untimed).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

template <class F>
inline float graph_us(cudaStream_t s, int calls, F&& f) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < calls; ++i) {
    f(i);
  }
  cudaStreamEndCapture(s, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphLaunch(exec, s);
  cudaStreamSynchronize(s);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  for (int r = 0; r < 9; ++r) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(exec, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1000.f / calls);
  }
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return t[t.size() / 2];
}
