// The MoE family's SwiGLU + quant pass alone (session 52, benchmarks/RESULTS.md): the library's
// launch_swiglu_quant (fp32 C, int8 q) on MoE-layer row counts, and its split-rows kernel at each
// fixed number of warps a row, in CUDA graphs of 20 calls: alone with C in the L2, and the time it
// adds after a kernel that writes C, launched under programmatic dependent launch as in the op
// (and without it).
// Every variant's q and q_scale are compared with launch_swiglu_quant's (they must be identical).
//
//   INC="-I gemmgen/templates/include -I gemmgen/families/moe/include -I <cutlass>/include"
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90a $INC \
//        -o /tmp/swiglu_pass_alone benchmarks/prototypes/swiglu_pass_alone.cu && /tmp/swiglu_pass_alone
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gemmgen/moe/swiglu_quant.cuh"
#include "graph_timing.cuh"

#define CHECK(x)                                                          \
  do {                                                                    \
    cudaError_t const e = (x);                                            \
    if (e != cudaSuccess) {                                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                 \
      return 1;                                                           \
    }                                                                     \
  } while (0)

using namespace gemmgen;
using namespace gemmgen::moe;

__global__ void write_c(float* c, int64_t vectors, float v) {  // the GEMM's stand-in: writes C
  pdl_wait();
  pdl_release();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors;
       i += int64_t(gridDim.x) * blockDim.x) {
    reinterpret_cast<float4*>(c)[i] = make_float4(v, -v, 0.5f * v, 2.f * v);
  }
}

using Launch = cudaError_t (*)(float const*, int8_t*, float*, int64_t, int64_t, int64_t const*,
                               cudaStream_t, bool);

int main() {
  int sms;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  struct Case {
    char const* name;
    int64_t m, n_half;
  } const cases[] = {{"Qwen3-30B-A3B 1 token", 8, 768},     {"DeepSeek-V2-Lite 1 token", 6, 1408},
                     {"Qwen3-30B-A3B 16", 128, 768},        {"Qwen3-30B-A3B 64", 512, 768},
                     {"DeepSeek-V2-Lite 64", 384, 1408},    {"Qwen3-30B-A3B 256", 2048, 768},
                     {"DeepSeek-V2-Lite 256", 1536, 1408},  {"Qwen3-30B-A3B 1024", 8192, 768},
                     {"DeepSeek-V2-Lite 1024", 6144, 1408}, {"Qwen3-30B-A3B 4096", 32768, 768},
                     // Mixtral-8x7B's rows (14336 values: the cluster and several-rows kernels)
                     {"Mixtral-8x7B 1 token", 2, 14336},    {"Mixtral-8x7B 16", 32, 14336},
                     {"Mixtral-8x7B 64", 128, 14336},       {"Mixtral-8x7B 256", 512, 14336},
                     {"Mixtral-8x7B 1024", 2048, 14336}};
  static int sm_count = sms;
  Launch const library = [](float const* c, int8_t* q, float* qs, int64_t m, int64_t nh,
                            int64_t const* t, cudaStream_t st, bool pdl) {
    return launch_swiglu_quant<float, int8_t>(c, q, qs, m, nh, t, st, pdl, sm_count);
  };
  struct Variant {
    char const* name;
    Launch launch;
    int parts;  // warps a row (0: the library's choice)
  } const variants[] = {{"library", library, 0},
                        {"1 warp", launch_swiglu_quant_split_rows_of<float, int8_t, 1>, 1},
                        {"2 warps", launch_swiglu_quant_split_rows_of<float, int8_t, 2>, 2},
                        {"4 warps", launch_swiglu_quant_split_rows_of<float, int8_t, 4>, 4},
                        {"8 warps", launch_swiglu_quant_split_rows_of<float, int8_t, 8>, 8}};
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (Case const& cs : cases) {
    int64_t const elements = cs.m * 2 * cs.n_half;
    int const copies = static_cast<int>((160ll << 20) / (elements * 4) + 1);  // past the L2
    std::vector<float*> c(copies);
    std::vector<float> host(elements);
    for (int64_t i = 0; i < elements; ++i) {
      host[i] = static_cast<float>((uint64_t(i) * 2654435761u) % 20001) / 1000.f - 10.f;
    }
    for (float*& p : c) {
      CHECK(cudaMalloc(&p, elements * 4));
      CHECK(cudaMemcpy(p, host.data(), elements * 4, cudaMemcpyHostToDevice));
    }
    int8_t *q, *q_ref;
    float *q_scale, *q_scale_ref;
    int64_t* total;
    CHECK(cudaMalloc(&q, cs.m * cs.n_half));
    CHECK(cudaMalloc(&q_ref, cs.m * cs.n_half));
    CHECK(cudaMalloc(&q_scale, cs.m * 4));
    CHECK(cudaMalloc(&q_scale_ref, cs.m * 4));
    CHECK(cudaMalloc(&total, 8));
    CHECK(cudaMemcpy(total, &cs.m, 8, cudaMemcpyHostToDevice));
    CHECK(library(c[0], q_ref, q_scale_ref, cs.m, cs.n_half, total, s, false));
    std::vector<int8_t> ref_q(cs.m * cs.n_half), got_q(ref_q.size());
    std::vector<float> ref_s(cs.m), got_s(cs.m);
    CHECK(cudaMemcpy(ref_q.data(), q_ref, ref_q.size(), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(ref_s.data(), q_scale_ref, cs.m * 4, cudaMemcpyDeviceToHost));
    auto write = [&](int i) {
      launch_maybe_pdl(write_c, dim3(4 * sms), dim3(256), 0, s, true, c[i % copies],
                       elements / 4, 1.f);
    };
    float const written = graph_us(s, 20, write);
    std::printf("%-24s %6lld rows of %5lld values, C %6.1f MB (writing C: %6.2f us)\n", cs.name,
                static_cast<long long>(cs.m), static_cast<long long>(cs.n_half),
                elements * 4 / 1e6, written);
    if (cs.n_half / 4 <= kSplitRowMaxVectors) {
      std::printf("    library: %d warps a row\n", split_row_parts(cs.m, cs.n_half, sms));
    } else {
      std::printf("    library: %d CTAs a row\n", swiglu_row_parts(cs.m, cs.n_half, sms));
    }
    for (Variant const& v : variants) {
      if (v.parts && (cs.n_half / 4 + v.parts - 1) / v.parts > 32 * kSplitRowMaxKept) {
        continue;  // a share of the row past the kernel's registers
      }
      // C's random values again (the timings below and before write over every copy)
      CHECK(cudaMemcpy(c[0], host.data(), elements * 4, cudaMemcpyHostToDevice));
      CHECK(cudaMemset(q, 0x55, cs.m * cs.n_half));
      CHECK(v.launch(c[0], q, q_scale, cs.m, cs.n_half, total, s, false));
      CHECK(cudaMemcpy(got_q.data(), q, got_q.size(), cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(got_s.data(), q_scale, cs.m * 4, cudaMemcpyDeviceToHost));
      bool const same = std::memcmp(got_q.data(), ref_q.data(), ref_q.size()) == 0 &&
                        std::memcmp(got_s.data(), ref_s.data(), cs.m * 4) == 0;
      float const alone = graph_us(s, 20, [&](int) {
        v.launch(c[0], q, q_scale, cs.m, cs.n_half, total, s, false);
      });
      float const after = graph_us(s, 20, [&](int i) {
        write(i);
        v.launch(c[i % copies], q, q_scale, cs.m, cs.n_half, total, s, true);
      });
      float const after_plain = graph_us(s, 20, [&](int i) {
        write(i);
        v.launch(c[i % copies], q, q_scale, cs.m, cs.n_half, total, s, false);
      });
      CHECK(cudaGetLastError());
      std::printf("    %-8s alone (C in L2) %7.2f us, after C adds %7.2f us (PDL), %7.2f us "
                  "(no PDL)%s\n", v.name, alone, after - written, after_plain - written,
                  same ? "" : "   OUTPUT DIFFERS");
    }
    for (float* p : c) {
      cudaFree(p);
    }
    cudaFree(q), cudaFree(q_ref), cudaFree(q_scale), cudaFree(q_scale_ref), cudaFree(total);
  }
  return 0;
}
