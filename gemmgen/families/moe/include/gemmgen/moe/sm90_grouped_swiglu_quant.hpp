/*
 * gemmgen/moe/sm90_grouped_swiglu_quant.hpp — one sm90 (CUTLASS 3.x) MoE kernel behind the C ABI:
 * grouped_matmul_swiglu_quant as three launches on one stream, none of which waits for the host,
 * the second and third programmatic dependents of the one before (GEMMGEN_LAUNCH_PDL: each is
 * launched while the one before runs and waits on the GPU before it reads what that one wrote):
 *
 *   1. group_setup (swiglu_quant.cuh): per-expert problem sizes, pointers and strides from the
 *      group list, into the workspace (and, for a fused kernel, the row maxima zeroed);
 *   2. the pointer-array grouped GEMM (one GEMM per expert, a persistent kernel that walks the
 *      groups' tiles; an empty expert has no tiles), whose epilogue applies x_scale per row and
 *      w_scale per column and writes the intermediate C (fp32 or bf16);
 *   3. swiglu_quant: SwiGLU and per-row quantization of C.
 *
 * A fused kernel (Config::Fused) does SwiGLU in the GEMM's epilogue instead: the epilogue's root
 * node (sm90_swiglu_rowmax_store.hpp) stores S, half C's width, in ElementC (fp32, or bf16 for
 * half the bytes written and read again) and reduces each row's max |S| across the N tiles by
 * atomic max; C is never written. Then quantize_rows quantizes S (where S fits in a third of
 * L2 the epilogue stores it evict_last and the pass drops each line once read: it is never
 * written to DRAM). With S in fp32 its q and
 * q_scale equal the fp32 unfused kernels' bit for bit (same C, same S, same max); a bf16 S is
 * the float32 S rounded once (C itself stays float32).
 * Fused kernels are not swap-AB (their pairs are adjacent columns of the tokens-by-N tile).
 *
 * act and gate are interleaved in the packed weight (packing.py): C[:, 2j] is act column j,
 * C[:, 2j + 1] gate column j, for both kinds of kernel.
 *
 * The weights are [E, N, K] (K contiguous): 8-bit wgmma reads both operands K-major. A8W4
 * kernels read int4 weights and convert them to int8 in registers (CUTLASS's mixed-input
 * mainloop), so a decode step reads half the weight bytes; the weight scale is per channel. With swap-AB
 * the kernel computes Cᵀ = W · Xᵀ per expert (the weight is operand A, the tokens are the
 * kernel's N), which lets a narrow tile N serve a few tokens per expert.
 */
#pragma once

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp"
#include "cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

#include "gemmgen/moe/moe_args.h"
#include "gemmgen/moe/sm90_swiglu_rowmax_store.hpp"
#include "gemmgen/moe/swiglu_quant.cuh"
#include "gemmgen/runtime_support.hpp"
#include "gemmgen/sm90_launch.hpp"

namespace gemmgen::moe::sm90 {

// ElementX: int8_t or cutlass::float_e4m3_t (activations; q has the same type); ElementW: the
// weights, ElementX or cutlass::int4b_t (A8W4: converted to int8 in registers in front of the
// int8 wgmma, CUTLASS's mixed-input mainloop; the weight must then be operand A, so swap-AB);
// ElementC: the intermediate (float or cutlass::bfloat16_t; fused: the type of S, C float32);
// Cooperative: else Pingpong; Fused: SwiGLU in the epilogue (not with SwapAB); FastAccum: fp8's
// FP8FastAccum mainloop (e4m3 only).
template <class ElementX_, class ElementW_, class ElementC_, bool SwapAB_, class TileShape_,
          class ClusterShape_, bool Cooperative_, int Stages_ /* 0 = auto */, bool Fused_ = false,
          bool FastAccum_ = false>
struct MoeConfig {
  using ElementX = ElementX_;
  using ElementW = ElementW_;
  using ElementC = ElementC_;
  static constexpr bool SwapAB = SwapAB_;
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;
  static constexpr bool Cooperative = Cooperative_;
  static constexpr int Stages = Stages_;
  static constexpr bool Fused = Fused_;
  static constexpr bool FastAccum = FastAccum_;
};

template <class Config>
struct GroupedSwigluQuant {
  using ElementX = typename Config::ElementX;
  using ElementW = typename Config::ElementW;
  using ElementC = typename Config::ElementC;
  using ElementQ = ElementX;
  static constexpr bool IsFp8 = cute::is_same_v<ElementX, cutlass::float_e4m3_t>;
  using ElementAcc = cute::conditional_t<IsFp8, float, int32_t>;
  using TileShape = typename Config::TileShape;
  static constexpr bool SwapAB = Config::SwapAB;
  static constexpr bool MixedInput = !cute::is_same_v<ElementW, ElementX>;
  static_assert(!MixedInput || SwapAB, "int4 weights must be CUTLASS's A operand: swap-AB only");
  static constexpr bool Fused = Config::Fused;
  static_assert(!Fused || !SwapAB,
                "fused kernels: not swap-AB (act/gate pairs are adjacent columns)");
  using ElementA = cute::conditional_t<SwapAB, ElementW, ElementX>;
  using ElementB = cute::conditional_t<SwapAB, ElementX, ElementW>;
  static constexpr int AlignA = 128 / cutlass::sizeof_bits<ElementA>::value;
  static constexpr int AlignB = 128 / cutlass::sizeof_bits<ElementB>::value;

  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using LayoutA = cutlass::layout::RowMajor;     // [kernel M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // [K, kernel N], K contiguous
  // C [tokens, N] row-major; as the kernel's [N, tokens] with swap-AB, column-major.
  using LayoutC = cute::conditional_t<SwapAB, cutlass::layout::ColumnMajor,
                                      cutlass::layout::RowMajor>;
  static constexpr int AlignC = 128 / cutlass::sizeof_bits<ElementC>::value;

  // NOTES: fp8 uses the accurate schedules by default (the accumulator is promoted to float32
  // every four wgmmas): fast accumulation keeps ~14 mantissa bits inside the tensor core; on an
  // H100 it gave a 0.8% error in q_scale at K = 4096 (5% of q one e4m3 step off the float64
  // reference). A config with `fast_accum` takes the FP8FastAccum schedules, as cuBLAS's fp8
  // GEMMs and the W8A8 family's do.
  static constexpr bool FastAccum = Config::FastAccum;
  static_assert(!FastAccum || IsFp8, "fast accumulation is an fp8 mainloop: int8 is exact");
  using KernelSchedule = cute::conditional_t<
      Config::Cooperative,
      cute::conditional_t<FastAccum,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>,
      cute::conditional_t<FastAccum,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum,
                          cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>>;
  using EpilogueSchedule =
      cute::conditional_t<Config::Cooperative,
                          cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                          cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

  // C = w_scale · (x_scale · acc), in this order whatever swap-AB is, so that every config
  // rounds alike. One pointer per group for each scale vector (ElementInput `float*`: an array
  // of pointers); alignment 1: x_scale + start is any float.
  using ScaleM = cutlass::epilogue::fusion::Sm90ColBroadcast<
      0, TileShape, float*, float, cute::Stride<cute::_1, cute::_0, cute::_0>, 1>;
  using ScaleN = cutlass::epilogue::fusion::Sm90RowBroadcast<
      0, TileShape, float*, float, cute::Stride<cute::_0, cute::_1, cute::_0>, 1>;
  using XScale = cute::conditional_t<SwapAB, ScaleN, ScaleM>;  // per token
  using WScale = cute::conditional_t<SwapAB, ScaleM, ScaleN>;  // per output column
  using Scaled = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, float, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      XScale, cutlass::epilogue::fusion::Sm90AccFetch>;
  // C's element type as the tree computes it: a fused kernel's SwiGLU reads C in float32
  // whatever S is stored in.
  using ElementScaled = cute::conditional_t<Fused, float, ElementC>;
  using ScaledTree = cutlass::epilogue::fusion::Sm90EVT<
      cutlass::epilogue::fusion::Sm90Compute<cutlass::multiplies, ElementScaled, float,
                                             cutlass::FloatRoundStyle::round_to_nearest>,
      WScale, Scaled>;
  // Fused: S = swish(act) · gate of the scaled pairs, stored by the root; no D.
  using Tree = cute::conditional_t<
      Fused, cutlass::epilogue::fusion::Sm90EVT<Sm90SwigluRowMaxStore<ElementC>, ScaledTree>,
      ScaledTree>;
  using ElementD = cute::conditional_t<Fused, void, ElementC>;

  // The epilogue walks its tile in subtiles (auto: 32 columns), and after each one runs the
  // collective's TMA store sequence: an async-proxy fence and two barriers of the math warps. A
  // fused kernel stores nothing through it (no D, no shared memory sized by the subtile), so a
  // fused tile at most 128 columns wide is one subtile (a warpgroup's 64 rows for pingpong):
  // two barriers a tile instead of eight, and visit() gets the whole tile at once, whose blocks
  // the compiler interleaves. H200, ncu, the GEMM alone: int8 128x128 cooperative 140.2 ->
  // 133.1 µs (Qwen3-30B-A3B, 1024 tokens), e4m3 64x128 pingpong 454.8 -> 443.7 (DeepSeek-V2-Lite,
  // 4096 tokens; benchmarks/RESULTS.md, session 41). A 128 x 256 tile keeps 32-column subtiles:
  // whole (or 128 columns) it ran 25% slower, likely its 128 accumulators and 128 scaled values
  // a thread in registers at once; 64 columns was level.
  static constexpr int TileN = cute::tuple_element_t<1, TileShape>::value;
  using EpilogueTile = cute::conditional_t<
      Fused && TileN <= 128,
      cute::Shape<cute::Int<(Config::Cooperative ? 128 : 64)>, cute::Int<TileN>>,
      cutlass::epilogue::collective::EpilogueTileAuto>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape,
      typename Config::ClusterShape, EpilogueTile, ElementAcc,
      float, void, LayoutC*, AlignC, ElementD, LayoutC*, AlignC, EpilogueSchedule,
      Tree>::CollectiveOp;

  using StageCount = cute::conditional_t<
      Config::Stages == 0,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::collective::StageCount<(Config::Stages > 0 ? Config::Stages : 1)>>;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, AlignA, ElementB,
      LayoutB*, AlignB, ElementAcc, TileShape, typename Config::ClusterShape, StageCount,
      KernelSchedule>::CollectiveOp;

  // A type of its own per kernel: Config is local to its translation unit (see the .cu). It is
  // launched as a programmatic dependent (GEMMGEN_LAUNCH_PDL): CUTLASS 4.2's pointer-array
  // kernels have no grid-dependency control of their own, so before anything else it waits for
  // group_setup (the arrays it reads, the zeroed row maxima) and then lets the pass after it
  // launch, whose blocks take the SMs as this kernel's leave and wait there until it completes.
  using Universal = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop,
                                                         CollectiveEpilogue>;
  struct Kernel : Universal {
    CUTLASS_DEVICE void operator()(typename Universal::Params const& params, char* smem) {
      pdl_wait();
      pdl_release();
      Universal::operator()(params, smem);
    }
  };
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideD;
  using Shape = typename ProblemShape::UnderlyingProblemShape;
  using Arrays = GroupArrays<Shape, ElementA, ElementB, ElementC, StrideA, StrideB, StrideC>;

  // ------------------------------------------------------------------ workspace layout
  static constexpr size_t kAlign = 256;
  static constexpr size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

  // The per-expert arrays (and, fused, the [M] row maxima), carved from the front of the
  // workspace; CUTLASS's own workspace follows. With `base` null only the sizes matter.
  static size_t carve(int64_t experts, int64_t m, char* base, Arrays* arrays) {
    size_t offset = 0;
    auto take = [&](auto*& ptr, size_t element_bytes, int64_t count) {
      ptr = reinterpret_cast<cute::remove_reference_t<decltype(ptr)>>(base ? base + offset : nullptr);
      offset += round_up(element_bytes * static_cast<size_t>(count));
    };
    Arrays a{};
    take(a.shapes, sizeof(Shape), experts);
    take(a.a, sizeof(void*), experts);
    take(a.b, sizeof(void*), experts);
    take(a.d, sizeof(void*), experts);
    take(a.x_scales, sizeof(void*), experts);
    take(a.w_scales, sizeof(void*), experts);
    take(a.stride_a, sizeof(StrideA), experts);
    take(a.stride_b, sizeof(StrideB), experts);
    take(a.stride_d, sizeof(StrideC), experts);
    take(a.rows_total, sizeof(int64_t), 1);
    take(a.row_max, sizeof(void*), experts);
    take(a.row_max_bits, sizeof(uint32_t), Fused ? m : 0);
    if (arrays != nullptr) {
      *arrays = a;
    }
    return offset;
  }

  // Fused: whether the epilogue stores S to stay in L2 for the quantize pass, which then drops it
  // once read (s_kept_in_l2, discard_lines).
  static bool s_in_l2(gemmgen_moe_args const& p) {
    return s_kept_in_l2(p.m * (p.n / 2) * int64_t(sizeof(ElementC)), l2_cache_bytes());
  }

  static typename Gemm::Arguments make_arguments(gemmgen_moe_args const& p, Arrays const& a) {
    typename ScaledTree::Arguments scaled{
        {a.w_scales, 0.0f, {}},             // WScale
        {{a.x_scales, 0.0f, {}}, {}, {}},   // Scaled: XScale, acc, multiply
        {}};                                // multiply
    typename Tree::Arguments tree = [&] {
      if constexpr (Fused) {
        return typename Tree::Arguments{scaled, {a.d, a.row_max, p.n / 2, s_in_l2(p)}};
      } else {
        return scaled;
      }
    }();
    auto d = [&] {
      if constexpr (Fused) {
        return nullptr;  // no D
      } else {
        return a.d;
      }
    }();
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {static_cast<int>(p.experts), a.shapes, nullptr},  // no host copy: read on the device
        {a.a, a.stride_a, a.b, a.stride_b},
        {tree, nullptr, nullptr, d, a.stride_d},
        gemmgen::sm90::hardware_info_for<Gemm>()};
    gemmgen::sm90::set_scheduler_knobs(args, p.raster_order, p.max_swizzle_size);
    return args;
  }

  static size_t workspace_size(gemmgen_moe_args const* p) {
    Arrays arrays{};
    size_t const own = carve(p->experts, p->m, nullptr, &arrays);
    return own + Gemm::get_workspace_size(make_arguments(*p, arrays));
  }

  static int run(gemmgen_moe_args const* p, void* workspace, size_t workspace_bytes, void* stream,
                 char const* kernel_name) {
    int const checked = check_call(p, workspace, workspace_bytes, workspace_size(p), kernel_name);
    if (checked != GEMMGEN_OK) {
      return checked;
    }
    if (p->group_size != 0 && p->group_size != p->k) {
      return fail(GEMMGEN_CANNOT_IMPLEMENT, kernel_name,
                  "applies the weight scale per output channel in its epilogue: per-group scales "
                  "need a direct kernel");
    }
    if (p->m == 0) {
      return GEMMGEN_OK;  // no rows: nothing to compute or write
    }
    Arrays arrays{};
    size_t const own = carve(p->experts, p->m, static_cast<char*>(workspace), &arrays);
    auto cuda_stream = static_cast<cudaStream_t>(stream);
    int const n = static_cast<int>(p->n), k = static_cast<int>(p->k);

    StrideA stride_a{};
    StrideB stride_b{};
    StrideC stride_c{};
    cute::get<0>(stride_a) = k;  // both operands K-major: the leading stride is K
    cute::get<0>(stride_b) = k;
    if constexpr (SwapAB) {
      cute::get<1>(stride_c) = n;  // column-major [N, tokens]
    } else {
      cute::get<0>(stride_c) = n;  // row-major [tokens, N]
    }
    int64_t const w_expert_bytes = int64_t(n) * k * cutlass::sizeof_bits<ElementW>::value / 8;
    // Block 0 builds the per-expert arrays; a fused kernel's row maxima start at 0 (= |0.0f|,
    // atomicMax builds them), which the blocks after it write (one launch, no memset).
    int64_t const zeroed = Fused ? p->m : 0;
    int64_t const zero_blocks = setup_zero_blocks(zeroed);
    group_setup<SwapAB><<<static_cast<unsigned>(1 + zero_blocks), kSetupThreads, 0, cuda_stream>>>(
        arrays, p->group_list, p->group_list_type, p->experts, p->m, n, k, p->x, p->w,
        w_expert_bytes, static_cast<ElementC*>(p->c), Fused ? n / 2 : n, p->x_scale, p->w_scale,
        stride_a, stride_b, stride_c, arrays.row_max_bits, zeroed);
    int status = launch_status(cutlass::Status::kSuccess, kernel_name);
    if (status != GEMMGEN_OK) {
      return status;
    }
    bool const pdl = (p->launch_flags & GEMMGEN_LAUNCH_PDL) != 0;
    status = gemmgen::sm90::Launcher<Gemm>::run(make_arguments(*p, arrays),
                                                static_cast<char*>(workspace) + own,
                                                workspace_bytes - own, stream, kernel_name, pdl);
    if (status != GEMMGEN_OK) {
      return status;
    }
    if constexpr (Fused) {
      cudaError_t const launched = launch_quantize_rows(
          static_cast<ElementC const*>(p->c), arrays.row_max_bits, static_cast<ElementQ*>(p->q),
          p->q_scale, p->m, p->n / 2, arrays.rows_total, cuda_stream, pdl,
          hardware_info().sm_count, s_in_l2(*p));
      if (launched != cudaSuccess) {
        return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
      }
    } else {
      cudaError_t const launched = launch_swiglu_quant(
          static_cast<ElementC const*>(p->c), static_cast<ElementQ*>(p->q), p->q_scale, p->m,
          p->n / 2, arrays.rows_total, cuda_stream, pdl, hardware_info().sm_count);
      if (launched != cudaSuccess) {
        return fail(GEMMGEN_LAUNCH_FAILED, kernel_name, cudaGetErrorString(launched));
      }
    }
    return launch_status(cutlass::Status::kSuccess, kernel_name);
  }
};

}  // namespace gemmgen::moe::sm90
