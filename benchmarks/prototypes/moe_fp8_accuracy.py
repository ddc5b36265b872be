#!/usr/bin/env python3
"""q_scale of the MoE op's fp8 (e4m3) kernels, and of bench_moe.py's torch per-expert pipeline,
against a float64 per-expert reference, on the benchmark's own inputs (session 43: the bench's
check against torch's pipeline warned at K = 6144-7168, and the warnings were the pipeline's
drift). One uniform batch per point; the largest relative error over the rows is printed.

    GEMMGEN_BUILD_DIR=<a build of moe_sm90.yaml> python benchmarks/prototypes/moe_fp8_accuracy.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import bench_moe as b  # noqa: E402

PREFIX = "sm90a_grouped_matmul_swiglu_quant_e4m3_f32_"
KERNELS = {"decode (promoted)": PREFIX + "t128x16x128_c1x1x1_pp_sauto_swap",
           "stream (direct)": PREFIX + "t64x8x128_direct_wk2_s4",
           "small_fused_fa": PREFIX + "t64x128x128_c1x1x1_pp_sauto_fused_fa",
           "small_fused (promoted)": PREFIX + "t64x128x128_c1x1x1_pp_sauto_fused",
           "large_fa": PREFIX + "t128x256x128_c1x1x1_coop_sauto_fa"}
POINTS = (("deepseek-v3", 64), ("deepseek-v3", 256), ("mixtral-8x22b", 64))


def float64_q_scale(counts, x, x_scale, w, w_scale) -> torch.Tensor:
    """max |silu(act) * gate| / 448 per row, the GEMM and SwiGLU in float64, expert by expert."""
    ref = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if count:
            a = x[start:start + count].double() * x_scale[start:start + count, None].double()
            c = a @ (w[e].double() * w_scale[e][:, None].double()).t()
            half = c.shape[1] // 2
            ref[start:start + count] = (torch.nn.functional.silu(c[:, :half]) * c[:, half:]).abs().amax(dim=1) / 448.0
        start += count
    return ref


def main() -> None:
    for name, tokens in POINTS:
        model = b.MODELS[name]
        counts = b.routing_counts(model, tokens, "uniform", name)
        weights = b.make_weights(model, "e4m3", 1)
        inputs = b.make_inputs(model, "e4m3", counts, 1)
        w, w_scale = weights.logical[0]
        ref = float64_q_scale(counts, inputs.x[0], inputs.x_scale[0], w, w_scale)
        m = sum(counts)

        def error(q_scale):
            return ((q_scale[:m].double() - ref[:m]).abs() / ref[:m]).max().item()

        found = {"torch per-expert (fast accum, bf16 C)": error(b.per_expert_fn("e4m3", weights, inputs)(0)[1])}
        for label, kernel in KERNELS.items():
            found[label] = error(b.gemmgen_fn(weights.packed, inputs, kernel)(0)[1])
        print(f"{name} T={tokens} (M={m}, K={model.k}): " + "; ".join(f"{k} {v:.2e}" for k, v in found.items()))
        del weights, inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
