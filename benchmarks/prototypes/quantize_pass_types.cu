// A measurement prototype (session 54, benchmarks/RESULTS.md), not a benchmark of record: the
// fused MoE kernels' quantize pass (swiglu_quant.cuh: launch_quantize_rows) with S in float32 or
// bf16 and q in int8 or e4m3, beside two ways of doing its arithmetic (the row's reciprocal,
// RowScale, instead of a division a value; then for e4m3 one conversion instruction per two
// values, Quantizer::pack4) and a copy kernel of the same traffic. First measured before the
// library took the second for e4m3 q ("library" then divided a value and converted each alone).
// Each is checked bit for bit on every row against a plain kernel (a thread a row, the IEEE
// division, Quantizer::bits), then timed in CUDA graphs of 20 calls (median of 9): alone (inputs
// rotated past the L2), and the µs it adds after a kernel that writes its input (left dirty in
// the L2, as the GEMM leaves S). candidate_rows repeats quantize_rows' walk on purpose: only the
// arithmetic differs.
//
//   INC="-I gemmgen/templates/include -I gemmgen/families/moe/include -I <cutlass>/include"
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90a $INC -I benchmarks/prototypes \
//        -o /tmp/quantize_pass_types benchmarks/prototypes/quantize_pass_types.cu
//   /tmp/quantize_pass_types
#include <cstdio>
#include <cstring>
#include <vector>

#include "gemmgen/moe/swiglu_quant.cuh"
#include "cuda_check.h"
#include "graph_timing.cuh"

using namespace gemmgen::moe;
using E4M3 = cutlass::float_e4m3_t;
using BF16 = cutlass::bfloat16_t;

static int sms;

// The pass's arithmetic through the row's reciprocal (quotient: the IEEE quotient's bits), each
// value converted alone (Mode 1: bits_by_add) or, Mode 2, Quantizer::pack4's (e4m3: two values a
// conversion; the library's quantize pass for e4m3 since this session).
template <class Q, int Mode>
__device__ __forceinline__ uint32_t quantize4(float const v[4], RowScale const& row) {
  float x[4];
  for (int i = 0; i < 4; ++i) x[i] = quotient(v[i], row);
  if constexpr (Mode == 2) {
    return Quantizer<Q>::pack4(x);
  } else {
    uint32_t packed = 0;
    for (int i = 0; i < 4; ++i) packed |= uint32_t(Quantizer<Q>::bits_by_add(x[i])) << (8 * i);
    return packed;
  }
}

// quantize_rows' walk (warps a row, contiguous shares, batches of 16 bytes a lane) with Mode's
// arithmetic.
template <class S, class Q, int Mode>
__global__ void __launch_bounds__(kQuantizeThreads)
candidate_rows(S const* s, uint32_t const* row_max_bits, Q* q, float* q_scale, int64_t m,
               int64_t n_half, int64_t const* rows_total, int parts_log2, int share) {
  int64_t const total = *rows_total;
  int const vectors = static_cast<int>(n_half / 4);
  int const lane = static_cast<int>(threadIdx.x % 32);
  int64_t const warps = m << parts_log2;
  int64_t const stride = int64_t(gridDim.x) * kQuantizeWarps;
  for (int64_t w = int64_t(blockIdx.x) * kQuantizeWarps + threadIdx.x / 32; w < warps; w += stride) {
    int64_t const r = w >> parts_log2;
    int const part = static_cast<int>(w & ((int64_t(1) << parts_log2) - 1));
    int const begin = part * share < vectors ? part * share : vectors;
    int const end = begin + share < vectors ? begin + share : vectors;
    Q* q_row = q + r * n_half;
    if (r >= total) {
      zero_vectors(q_row, begin + lane, end, 32);
      if (part == 0 && lane == 0) q_scale[r] = 0.0f;
      continue;
    }
    float const scale = __uint_as_float(row_max_bits[r]) / Quantizer<Q>::kMax;
    RowScale const row = row_scale(scale);
    S const* s_row = s + r * n_half;
    uint64_t const policy = l2_policy_evict_first();  // as quantize_rows reads S
    constexpr int batch = kQuantizeBatch<S>;
    for (int first = begin + lane; first < end; first += 32 * batch) {
      float values[batch][4];
#pragma unroll
      for (int u = 0; u < batch; ++u) {
        if (first + 32 * u < end) load4(s_row, first + 32 * u, values[u], policy);
      }
#pragma unroll
      for (int u = 0; u < batch; ++u) {
        if (first + 32 * u < end) {
          reinterpret_cast<uint32_t*>(q_row)[first + 32 * u] = quantize4<Q, Mode>(values[u], row);
        }
      }
    }
    if (part == 0 && lane == 0) q_scale[r] = scale;
  }
}

template <class S, class Q>
__global__ void reference_rows(S const* s, uint32_t const* row_max, Q* q, float* q_scale, int64_t m,
                               int64_t n_half, int64_t const* rows_total) {
  int64_t const r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (r >= m) return;
  bool const inside = r < *rows_total;
  float const scale = inside ? __uint_as_float(row_max[r]) / Quantizer<Q>::kMax : 0.0f;
  uint8_t* out = reinterpret_cast<uint8_t*>(q) + r * n_half;
  for (int64_t j = 0; j < n_half; ++j) {
    float const v = static_cast<float>(s[r * n_half + j]);
    out[j] = inside ? Quantizer<Q>::bits(scale == 0.0f ? 0.0f : v / scale) : 0;
  }
  q_scale[r] = scale;
}

template <class S>
__global__ void write_s(S* p, int64_t elements, unsigned seed) {  // the GEMM's stand-in
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < elements;
       i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = static_cast<S>(float(int((i * 2654435761u + seed) % 20001) - 10000) * 1e-3f);
  }
}

// A pass's traffic alone: each thread reads one 16-byte vector and writes its share of q.
__global__ void copy_pass(uint4 const* in, uint32_t* out, int64_t vectors, int words_per_vector) {
  int64_t const v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (v < vectors) {
    uint4 const a = in[v];
    uint32_t const x = a.x ^ a.y ^ a.z ^ a.w;
    for (int k = 0; k < words_per_vector; ++k) out[v * words_per_vector + k] = x + k;
  }
}

template <class S, class Q>
int run_case(cudaStream_t st, int64_t m, int64_t n_half) {
  int64_t const elements = m * n_half;
  int const copies = static_cast<int>((240ll << 20) / (elements * sizeof(S)) + 2);
  std::vector<S*> in(copies);
  for (S*& p : in) {
    CHECK(cudaMalloc(&p, elements * sizeof(S)));
    write_s<<<4 * sms, 256, 0, st>>>(p, elements, 7u);
  }
  Q *q, *q_ref;
  float *qs, *qs_ref;
  uint32_t* row_max;
  int64_t* total;
  CHECK(cudaMalloc(&q, elements));
  CHECK(cudaMalloc(&q_ref, elements));
  CHECK(cudaMalloc(&qs, m * 4));
  CHECK(cudaMalloc(&qs_ref, m * 4));
  CHECK(cudaMalloc(&row_max, m * 4));
  CHECK(cudaMalloc(&total, 8));
  int64_t const rows_in = m - m / 16;  // the last 1/16 of the rows past the groups
  CHECK(cudaMemcpy(total, &rows_in, 8, cudaMemcpyHostToDevice));
  std::vector<uint32_t> bits(m);
  for (int64_t i = 0; i < m; ++i) {
    float const v = 10.0f + 0.37f * float(i % 11);
    std::memcpy(&bits[i], &v, 4);
  }
  CHECK(cudaMemcpy(row_max, bits.data(), m * 4, cudaMemcpyHostToDevice));
  float const written = graph_us(st, 20, [&](int i) {
    write_s<<<4 * sms, 256, 0, st>>>(in[i % (copies - 1)], elements, unsigned(i));
  });
  std::printf("  %6lld rows of %5lld, S %s %6.1f MB, q %s (writing S: %7.2f us)\n", (long long)m,
              (long long)n_half, sizeof(S) == 4 ? "fp32" : "bf16", elements * sizeof(S) / 1e6,
              std::is_same_v<Q, E4M3> ? "e4m3" : "int8", written);
  int const parts = quantize_row_parts(m, n_half, sms);
  int const share = static_cast<int>((n_half / 4 + parts - 1) / parts);
  unsigned const ctas = unsigned((m * parts + kQuantizeWarps - 1) / kQuantizeWarps);
  auto report = [&](char const* name, auto&& launch, bool check) {
    bool ok = true;
    if (check) {
      CHECK(cudaMemset(q, 0x55, elements));
      CHECK(cudaMemset(q_ref, 0x66, elements));
      reference_rows<S, Q><<<unsigned((m + 127) / 128), 128, 0, st>>>(in[copies - 1], row_max, q_ref, qs_ref, m, n_half, total);
      launch(in[copies - 1]);
      CHECK(cudaStreamSynchronize(st));
      std::vector<uint8_t> a(elements), b(elements);
      CHECK(cudaMemcpy(a.data(), q, elements, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(b.data(), q_ref, elements, cudaMemcpyDeviceToHost));
      ok = std::memcmp(a.data(), b.data(), elements) == 0;
    }
    float const alone = graph_us(st, 20, [&](int i) { launch(in[i % (copies - 1)]); });
    float const after = graph_us(st, 20, [&](int i) {
      write_s<<<4 * sms, 256, 0, st>>>(in[i % (copies - 1)], elements, unsigned(i));
      launch(in[i % (copies - 1)]);
    });
    CHECK(cudaGetLastError());
    std::printf("    %-30s alone %7.2f us   after the writer adds %7.2f us%s\n", name, alone,
                after - written, ok ? "" : "   OUTPUT DIFFERS");
  };
  report("library", [&](S const* sp) {
    launch_quantize_rows<S, Q>(sp, row_max, q, qs, m, n_half, total, st, false, sms,
                               false);  // S is read again: kept
  }, true);
  report("reciprocal", [&](S const* sp) {
    candidate_rows<S, Q, 1><<<ctas, kQuantizeThreads, 0, st>>>(sp, row_max, q, qs, m, n_half, total,
                                                               cutlass::find_log2(parts), share);
  }, true);
  if constexpr (std::is_same_v<Q, E4M3>) {
    report("reciprocal, cvt in pairs", [&](S const* sp) {
      candidate_rows<S, Q, 2><<<ctas, kQuantizeThreads, 0, st>>>(sp, row_max, q, qs, m, n_half, total,
                                                                 cutlass::find_log2(parts), share);
    }, true);
  }
  int64_t const vectors = elements * sizeof(S) / 16;
  report("copy (the traffic)", [&](S const* sp) {
    copy_pass<<<unsigned((vectors + 255) / 256), 256, 0, st>>>(
        reinterpret_cast<uint4 const*>(sp), reinterpret_cast<uint32_t*>(q), vectors, int(sizeof(S) == 4 ? 1 : 2));
  }, false);
  for (S* p : in) cudaFree(p);
  cudaFree(q), cudaFree(q_ref), cudaFree(qs), cudaFree(qs_ref), cudaFree(row_max), cudaFree(total);
  return 0;
}

int main() {
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, sms);
  cudaStream_t st;
  CHECK(cudaStreamCreate(&st));
  struct Case { int64_t m, n_half; } const cases[] = {{512, 14336}, {2048, 14336}, {8192, 14336}, {8192, 768}, {6144, 1408}};
  for (Case c : cases) {
    if (run_case<float, E4M3>(st, c.m, c.n_half) || run_case<BF16, E4M3>(st, c.m, c.n_half) ||
        run_case<float, int8_t>(st, c.m, c.n_half)) {
      return 1;
    }
  }
  return 0;
}
