// The MoE family's passes around the grouped GEMM, alone (session 53, benchmarks/RESULTS.md):
// the unfused SwiGLU + quant pass (launch_swiglu_quant: Mixtral-8x7B's long rows with fp32 and
// bf16 C, Qwen3-30B-A3B's and DeepSeek-V2-Lite's short rows) and the fused kernels' quantize pass
// (launch_quantize_rows, and each fixed number of warps a row), beside the designs measured and
// not kept (moe_pass_candidates.cuh: the bulk-copy ring, the flat quantize pass, 2 and 4 CTAs a
// long row) and a copy kernel of the same traffic (a 16-byte load a thread, q's bytes written).
// Each is checked on random data against a plain kernel (a thread a row, the IEEE division and
// cvt.rni; bit for bit; the unfused pass's e4m3 q too, signed zeros included), then timed in CUDA
// graphs of 20 calls (median of 9): alone, inputs
// rotated past the L2, and the µs it adds after a kernel that writes its input (left dirty in the
// L2, as the GEMM leaves C or S; no PDL, as the CUTLASS kernels' passes launch).
//
//   INC="-I gemmgen/templates/include -I gemmgen/families/moe/include -I <cutlass>/include"
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90a $INC -I benchmarks/prototypes \
//        -o /tmp/moe_passes benchmarks/prototypes/moe_passes.cu && /tmp/moe_passes
//
// With -DHEAD_LIBRARY and the include paths of a tree before commit 6c9c4f2 (session 53), it times
// that tree's passes instead (the fused pass a warp a row), library rows only.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#ifdef HEAD_LIBRARY
#include "gemmgen/moe/swiglu_quant.cuh"
#else
#include "moe_pass_candidates.cuh"
#endif
#include "cuda_check.h"
#include "graph_timing.cuh"

using namespace gemmgen;
using namespace gemmgen::moe;

template <class T>
__global__ void write_c(T* c, int64_t bytes16, unsigned seed) {  // the GEMM's stand-in
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < bytes16;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (sizeof(T) == 4) {
      reinterpret_cast<uint4*>(c)[i] = make_uint4(0x3f800000u ^ seed, 0xbf000000u, 0x40000000u, 0x3e800000u);
    } else {  // bf16 pairs (act, gate) of normal values
      reinterpret_cast<uint4*>(c)[i] = make_uint4(0x3f803f80u ^ seed, 0xbf003e80u, 0x40003fc0u, 0x3e80c000u);
    }
  }
}

// A pass's traffic alone: `words` threads, each reading `per_word` 16-byte vectors (2 of fp32 C,
// 1 of bf16 C or of S: 4 values of S) and writing one 4-byte word (4 values of q).
__global__ void ideal_pass(uint4 const* in, uint32_t* out, int64_t words, int per_word) {
  int64_t const w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (w < words) {
    uint4 const a = in[w * per_word];
    uint4 const b = per_word > 1 ? in[w * per_word + 1] : a;
    out[w] = a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
  }
}

// The fused quantize pass the plain way: a thread a row, the IEEE division and cvt.rni.
__global__ void quantize_reference(float const* sp, uint32_t const* row_max, int8_t* q, float* q_scale,
                                   int64_t m, int64_t n_half, int64_t const* rows_total) {
  int64_t const row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= m) return;
  bool const inside = row < *rows_total;
  float const scale = inside ? __uint_as_float(row_max[row]) / 127.0f : 0.0f;
  for (int64_t j = 0; j < n_half; ++j) {
    float const v = sp[row * n_half + j];
    q[row * n_half + j] = inside ? static_cast<int8_t>(Quantizer<int8_t>::bits(scale == 0.0f ? 0.0f : v / scale)) : 0;
  }
  q_scale[row] = scale;
}

// The pass the plain way: a thread a row, the IEEE division and the library's conversion (int8:
// cvt.rni; e4m3: the saturating one), into q's bytes.
template <class T, class Q = int8_t>
__global__ void reference_pass(T const* c, int8_t* q, float* q_scale, int64_t m, int64_t n_half,
                               int64_t const* rows_total) {
  int64_t const row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (row >= m) return;
  if (row >= *rows_total) {
    for (int64_t j = 0; j < n_half; ++j) q[row * n_half + j] = 0;
    q_scale[row] = 0.0f;
    return;
  }
  float amax = 0.0f;
  T const* c_row = c + row * 2 * n_half;
  for (int64_t j = 0; j < n_half; ++j) {
    float const v = swiglu(float(c_row[2 * j]), float(c_row[2 * j + 1]));
    amax = max_keep_nan(amax, fabsf(v));
  }
  float const scale = amax / Quantizer<Q>::kMax;
  for (int64_t j = 0; j < n_half; ++j) {
    float const v = swiglu(float(c_row[2 * j]), float(c_row[2 * j + 1]));
    q[row * n_half + j] = static_cast<int8_t>(Quantizer<Q>::bits(scale == 0.0f ? 0.0f : v / scale));
  }
  q_scale[row] = scale;
}

static int sms;

// One input element type (fp32 C, bf16 C, or fp32 S for the fused pass): copies rotated past L2.
template <class T>
struct Inputs {
  std::vector<T*> copies;
  int64_t elements;
  int count() const { return static_cast<int>(copies.size()); }
};

template <class T>
int make_inputs(Inputs<T>& in, int64_t elements) {
  in.elements = elements;
  int const copies = static_cast<int>((240ll << 20) / (elements * sizeof(T)) + 2);
  std::vector<T> host(elements);
  for (int64_t i = 0; i < elements; ++i) {
    host[i] = static_cast<T>(static_cast<float>((uint64_t(i) * 2654435761u) % 20001) / 1000.f - 10.f);
  }
  in.copies.resize(copies);
  for (T*& p : in.copies) {
    CHECK(cudaMalloc(&p, elements * sizeof(T)));
    CHECK(cudaMemcpy(p, host.data(), elements * sizeof(T), cudaMemcpyHostToDevice));
  }
  return 0;
}

template <class T>
void free_inputs(Inputs<T>& in) {
  for (T* p : in.copies) cudaFree(p);
  in.copies.clear();
}

struct Outputs {
  int8_t *q, *q_ref;
  float *q_scale, *q_scale_ref;
  int64_t* total;
  uint32_t* row_max;
  int64_t m, n_half;
};

int make_outputs(Outputs& o, int64_t m, int64_t n_half) {
  o.m = m, o.n_half = n_half;
  CHECK(cudaMalloc(&o.q, m * n_half));
  CHECK(cudaMalloc(&o.q_ref, m * n_half));
  CHECK(cudaMalloc(&o.q_scale, m * 4));
  CHECK(cudaMalloc(&o.q_scale_ref, m * 4));
  CHECK(cudaMalloc(&o.total, 8));
  int64_t const total = m - m / 16;  // the last 1/16 of the rows past the groups
  CHECK(cudaMemcpy(o.total, &total, 8, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&o.row_max, m * 4));
  std::vector<uint32_t> bits(m);
  float const ten = 10.0f;
  for (auto& b : bits) std::memcpy(&b, &ten, 4);
  CHECK(cudaMemcpy(o.row_max, bits.data(), m * 4, cudaMemcpyHostToDevice));
  return 0;
}

void free_outputs(Outputs& o) {
  cudaFree(o.q), cudaFree(o.q_ref), cudaFree(o.q_scale), cudaFree(o.q_scale_ref), cudaFree(o.total),
      cudaFree(o.row_max);
}

bool same(Outputs& o) {
  std::vector<int8_t> a(o.m * o.n_half), b(a.size());
  std::vector<float> x(o.m), y(o.m);
  cudaMemcpy(a.data(), o.q, a.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), o.q_ref, b.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(x.data(), o.q_scale, o.m * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(y.data(), o.q_scale_ref, o.m * 4, cudaMemcpyDeviceToHost);
  return std::memcmp(a.data(), b.data(), a.size()) == 0 && std::memcmp(x.data(), y.data(), o.m * 4) == 0;
}

// Time `launch(input, q, q_scale)` alone (inputs rotated past the L2) and after a writer of its
// input (no PDL: as the op runs its CUTLASS kernels' passes); check its output against `ref`.
template <class T, class L, class R>
void time_variant(char const* name, cudaStream_t s, Inputs<T>& in, Outputs& o, L&& launch, R&& ref,
                  double bytes_moved, float written, bool check = true) {
  cudaMemset(o.q, 0x55, o.m * o.n_half);
  cudaMemset(o.q_scale, 0x55, o.m * 4);
  cudaMemset(o.q_ref, 0x66, o.m * o.n_half);
  cudaMemset(o.q_scale_ref, 0x66, o.m * 4);
  // the last copy keeps the random data (the timings below rotate over the others, which the
  // writer overwrites)
  ref(in.copies[in.count() - 1], o.q_ref, o.q_scale_ref);
  launch(in.copies[in.count() - 1], o.q, o.q_scale);
  cudaError_t e = cudaStreamSynchronize(s);
  bool const ok = e == cudaSuccess && (!check || same(o));
  int const rotated = in.count() - 1;
  float const alone = graph_us(s, 20, [&](int i) { launch(in.copies[i % rotated], o.q, o.q_scale); });
  float const after = graph_us(s, 20, [&](int i) {
    write_c<<<4 * sms, 256, 0, s>>>(in.copies[i % rotated], in.elements * sizeof(T) / 16, i);
    launch(in.copies[i % rotated], o.q, o.q_scale);
  });
  e = cudaGetLastError();
  std::printf("    %-22s alone %8.2f us (%5.2f TB/s)  after the writer adds %8.2f us%s%s\n", name, alone,
              bytes_moved / alone / 1e6, after - written, ok ? "" : "   OUTPUT DIFFERS",
              e == cudaSuccess ? "" : cudaGetErrorString(e));
}

template <class T>
int rows_pass(cudaStream_t s, char const* cname, int64_t n_half, std::vector<int64_t> const& ms) {
  std::printf("Rows of %lld values, C %s\n", (long long)n_half, cname);
  for (int64_t m : ms) {
    Inputs<T> in;
    Outputs o;
    if (make_inputs(in, m * 2 * n_half) || make_outputs(o, m, n_half)) return 1;
    double const bytes = double(m) * 2 * n_half * sizeof(T) + double(m) * n_half;
    float const written = graph_us(s, 20, [&](int i) {
      write_c<<<4 * sms, 256, 0, s>>>(in.copies[i % (in.count() - 1)], in.elements * sizeof(T) / 16, i);
    });
    std::printf("  %5lld rows, C %6.1f MB (writing it: %7.2f us)\n", (long long)m,
                m * 2 * n_half * sizeof(T) / 1e6, written);
    auto lib = [&](T const* c, int8_t* q, float* qs) {
      launch_swiglu_quant<T, int8_t>(c, q, qs, m, n_half, o.total, s, false, sms);
    };
    auto ref = [&](T const* c, int8_t* q, float* qs) {
      reference_pass<T><<<unsigned((m + 127) / 128), 128, 0, s>>>(c, q, qs, m, n_half, o.total);
    };
    time_variant("library", s, in, o, lib, ref, bytes, written);
    {  // e4m3 q, checked only: the same pass (signed zeros included: the data has S = ±0)
      using E4M3 = cutlass::float_e4m3_t;
      T const* c = in.copies[in.count() - 1];
      cudaMemset(o.q, 0x55, o.m * o.n_half);
      cudaMemset(o.q_ref, 0x66, o.m * o.n_half);
      launch_swiglu_quant<T, E4M3>(c, reinterpret_cast<E4M3*>(o.q), o.q_scale, m, n_half, o.total,
                                   s, false, sms);
      reference_pass<T, E4M3><<<unsigned((m + 127) / 128), 128, 0, s>>>(c, o.q_ref, o.q_scale_ref,
                                                                         m, n_half, o.total);
      bool const ok = cudaStreamSynchronize(s) == cudaSuccess && same(o);
      std::printf("    e4m3 q against the plain pass: %s\n", ok ? "identical" : "OUTPUT DIFFERS");
    }
#ifndef HEAD_LIBRARY
    if (n_half / 4 > kSplitRowMaxVectors && n_half / 4 <= 16 * candidate::kStreamChunkVectors) {
      auto ring = [&](T const* c, int8_t* q, float* qs) {
        static int const per_sm = [] {
          auto kernel = candidate::swiglu_quant_stream_rows<T, int8_t, 16, 8>;
          int const smem = 8 * candidate::stream_chunk_bytes<T>();
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
          int ctas = 0;
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, candidate::kStreamThreads, smem);
          return ctas > 0 ? ctas : 1;
        }();
        candidate::launch_stream_rows_of<T, int8_t, 16, 8>(c, q, qs, m, n_half, o.total, s, false,
                                                           sms, per_sm);
      };
      time_variant("bulk-copy ring (8 KB x 8)", s, in, o, ring, ref, bytes, written);
    }
    if (n_half / 4 > kSplitRowMaxVectors && m >= 128) {
      for (int parts : {2, 4}) {
        auto split = [&](T const* c, int8_t* q, float* qs) {
          launch_swiglu_quant_parts<T, int8_t>(c, q, qs, m, n_half, o.total, s, false, parts, 1);
        };
        char label[64];
        std::snprintf(label, sizeof label, "library, %d CTAs a row", parts);
        time_variant(label, s, in, o, split, ref, bytes, written);
      }
    }
#endif
    auto ideal = [&](T const* c, int8_t* q, float*) {
      int const per = sizeof(T) == 4 ? 2 : 1;
      ideal_pass<<<unsigned((m * n_half / 4 + 255) / 256), 256, 0, s>>>(
          reinterpret_cast<uint4 const*>(c), reinterpret_cast<uint32_t*>(q), m * n_half / 4, per);
    };
    time_variant("copy (the traffic)", s, in, o, ideal, ideal, bytes, written, false);
    free_inputs(in);
    free_outputs(o);
  }
  return 0;
}

int fused_pass(cudaStream_t s) {
  struct Case {
    char const* name;
    int64_t m, n_half;
  } const cases[] = {{"Mixtral-8x7B 64 tok", 128, 14336}, {"Mixtral-8x7B 256 tok", 512, 14336}, {"Mixtral-8x7B 512 tok", 1024, 14336}, {"Mixtral-8x7B 1024 tok", 2048, 14336},
                     {"Mixtral-8x7B 4096 tok", 8192, 14336}, {"Qwen3-30B-A3B 1024 tok", 8192, 768},
                     {"Qwen3-30B-A3B 4096 tok", 32768, 768}, {"DeepSeek-V2-Lite 256", 1536, 1408}, {"Qwen3-30B-A3B 256 tok", 2048, 768}, {"DeepSeek-V2-Lite 1024", 6144, 1408},
                     {"DeepSeek-V2-Lite 4096", 24576, 1408}};
  std::printf("The fused kernels' quantize pass (S fp32 [m, N/2] -> int8)\n");
  for (Case const& cs : cases) {
    Inputs<float> in;
    Outputs o;
    if (make_inputs(in, cs.m * cs.n_half) || make_outputs(o, cs.m, cs.n_half)) return 1;
    double const bytes = double(cs.m) * cs.n_half * 5;
    float const written = graph_us(s, 20, [&](int i) {
      write_c<<<4 * sms, 256, 0, s>>>(in.copies[i % (in.count() - 1)], in.elements * 4 / 16, i);
    });
    std::printf("  %-24s %6lld rows of %5lld, S %6.1f MB (writing it: %7.2f us)\n", cs.name,
                (long long)cs.m, (long long)cs.n_half, cs.m * cs.n_half * 4 / 1e6, written);
    int64_t const m = cs.m, n_half = cs.n_half;
    auto lib = [&](float const* sp, int8_t* q, float* qs) {
#ifdef HEAD_LIBRARY
      int64_t const ctas = (m + kQuantizeRowsPerCta - 1) / kQuantizeRowsPerCta;
      quantize_rows<<<static_cast<unsigned>(ctas), kQuantizeThreads, 0, s>>>(sp, o.row_max, q, qs,
                                                                             m, n_half, o.total);
#else
      launch_quantize_rows<float, int8_t>(sp, o.row_max, q, qs, m, n_half, o.total, s, false, sms,
                                          false);  // S is read again: kept
#endif
    };
    auto ref = [&](float const* sp, int8_t* q, float* qs) {
      quantize_reference<<<unsigned((m + 127) / 128), 128, 0, s>>>(sp, o.row_max, q, qs, m, n_half, o.total);
    };
#ifdef HEAD_LIBRARY
    time_variant("library (HEAD)", s, in, o, lib, ref, bytes, written);
#else
    char label[64];
    int const chosen = quantize_row_parts(m, n_half, sms);
    std::snprintf(label, sizeof label, "library (%d warps a row)", chosen);
    time_variant(label, s, in, o, lib, ref, bytes, written);
    for (int parts : {1, 2, 4, 8, 16}) {  // each fixed number of warps a row (shares of 64+ vectors)
      if (parts == chosen || (n_half / 4) / parts < 64) continue;
      auto fixed = [&](float const* sp, int8_t* q, float* qs) {
        int const share = static_cast<int>((n_half / 4 + parts - 1) / parts);
        quantize_rows<float, int8_t><<<unsigned((m * parts + kQuantizeWarps - 1) / kQuantizeWarps),
                                       kQuantizeThreads, 0, s>>>(sp, o.row_max, q, qs, m, n_half, o.total,
                                                                 cutlass::find_log2(parts), share, false);
      };
      std::snprintf(label, sizeof label, "%d warps a row", parts);
      time_variant(label, s, in, o, fixed, ref, bytes, written);
    }
    for (int batch : {2, 4}) {
      auto flat = [&](float const* sp, int8_t* q, float* qs) {
        if (batch == 2) {
          candidate::launch_quantize_flat<int8_t, 2>(sp, o.row_max, q, qs, m, n_half, o.total, s, false);
        } else {
          candidate::launch_quantize_flat<int8_t, 4>(sp, o.row_max, q, qs, m, n_half, o.total, s, false);
        }
      };
      std::snprintf(label, sizeof label, "flat, %d vectors a thread", batch);
      time_variant(label, s, in, o, flat, ref, bytes, written);
    }
#endif
    auto ideal = [&](float const* sp, int8_t* q, float*) {
      ideal_pass<<<unsigned((m * n_half / 4 + 255) / 256), 256, 0, s>>>(reinterpret_cast<uint4 const*>(sp),
                                         reinterpret_cast<uint32_t*>(q), m * n_half / 4, 1);
    };
    time_variant("copy (the traffic)", s, in, o, ideal, ideal, bytes, written, false);
    free_inputs(in);
    free_outputs(o);
  }
  return 0;
}

int main() {
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  std::vector<int64_t> const mixtral = {2, 32, 128, 256, 512, 1024, 2048};
  if (rows_pass<float>(s, "fp32", 14336, mixtral) || rows_pass<cutlass::bfloat16_t>(s, "bf16", 14336, mixtral) ||
      rows_pass<float>(s, "fp32", 768, {8, 2048, 32768}) || rows_pass<float>(s, "fp32", 1408, {1536, 6144}) ||
      fused_pass(s)) {
    return 1;
  }
  return 0;
}
