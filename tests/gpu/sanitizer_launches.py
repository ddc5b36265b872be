"""Launch built gemmgen kernels at tile-boundary shapes, for `compute-sanitizer` (not a test
module: tests/gpu/test_sanitizer_gpu.py runs it under the sanitizer in a subprocess).

    python tests/gpu/sanitizer_launches.py KERNEL_NAME [KERNEL_NAME ...]

Each kernel, forced by name, runs through its op at shapes around its tile: the token count at
1, one tile ± 1 and two tiles + 3; the feature count N one tile ∓ the alignment step; K one tile
∓ the op's K granule (the MoE kernels also with an empty expert and rows past the last group).
Values are random; the results are not checked here (the family's GPU tests do that): this only
has to touch every byte the kernels may read or write, in bounds or not. Prints one line per
kernel and `launched <calls> calls of <kernels> kernels` at the end; exits non-zero on any error.
"""

from __future__ import annotations

import itertools
import sys

import torch

import gemmgen
import gemmgen.families.moe.ops  # noqa: F401  (registers the MoE custom op)
from gemmgen.families.mixed.configs import WEIGHT_TYPES_FOR_KERNEL
from gemmgen.families.mixed.packing import q_range

DEVICE = torch.device("cuda")
ELEMENTS = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn}
FLOATS = {"bf16": torch.bfloat16, "fp16": torch.float16}


def values(shape, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, dtype=torch.int8, device=DEVICE)
    if dtype == torch.float8_e4m3fn:
        return torch.randn(shape, device=DEVICE).to(dtype)
    return torch.randn(shape, device=DEVICE).to(dtype)


def scales(shape) -> torch.Tensor:
    return torch.rand(shape, device=DEVICE) * 1e-2 + 1e-3


def token_and_feature_tiles(spec) -> tuple[int, int, int]:
    """(tokens per tile, output features per tile, tile K) in the op's terms."""
    tm, tn, tk = spec.config.tile
    swapped = getattr(spec.config, "swap_ab", False) or spec.family == "mixed"  # mixed: Dᵀ = W·Xᵀ
    return (tn, tm, tk) if swapped else (tm, tn, tk)


def boundary_shapes(spec, feature_step: int, k_step: int):
    tokens, features, tk = token_and_feature_tiles(spec)
    ms = sorted({1, max(1, tokens - 1), tokens + 1, 2 * tokens + 3})
    ns = [max(feature_step, features - feature_step), features + feature_step]
    ks = [max(k_step, tk - k_step), tk + k_step]
    return itertools.product(ms, ns, ks)


def run_w8a8(kernel) -> int:
    spec, calls = kernel.spec, 0
    dtype, out_dtype = ELEMENTS[spec.a], FLOATS[spec.d]
    for m, n, k in boundary_shapes(spec, 8, 16):
        a, b = values((m, k), dtype), values((n, k), dtype).t()
        scale_a, scale_b = scales((m, 1)), scales((1, n))
        bias = torch.randn(n, device=DEVICE).to(out_dtype)
        if spec.epilogue in ("ScaledEpilogue", "ScaledEpilogueBias"):
            gemmgen.scaled_mm(a, b, scale_a, scale_b, out_dtype,
                              bias=bias if spec.epilogue == "ScaledEpilogueBias" else None,
                              kernel=kernel.name)
        else:
            azp_adj = torch.randint(-1000, 1000, (n,), dtype=torch.int32, device=DEVICE)
            azp = (torch.randint(-128, 128, (m,), dtype=torch.int32, device=DEVICE)
                   if spec.epilogue == "ScaledEpilogueAzpPerToken" else None)
            gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, out_dtype, azp_adj, azp=azp, bias=bias,
                                  kernel=kernel.name)
        calls += 1
    return calls


def run_mixed(kernel) -> int:
    spec, calls = kernel.spec, 0
    dtype = FLOATS[spec.a]
    weight_type = WEIGHT_TYPES_FOR_KERNEL[(spec.w, spec.scheme)][0]
    low, high = q_range(weight_type)
    for m, n, k in boundary_shapes(spec, 8, 64):
        q = torch.randint(low, high + 1, (n, k), dtype=torch.int32, device=DEVICE)
        group = 32 if spec.group_k == 32 else 64 if k % 64 == 0 else k
        groups = k // group
        zeros = (torch.randint(0, 16, (n, groups), dtype=torch.int32, device=DEVICE)
                 if weight_type == "uint4" else None)
        packed = gemmgen.pack_weights(q, scales((n, groups)).to(dtype), zeros,
                                      weight_type=weight_type, group_size=group, arch="sm90a")
        gemmgen.mixed_mm(values((m, k), dtype), packed, torch.randn(n, device=DEVICE).to(dtype),
                         kernel=kernel.name)
        calls += 1
    return calls


def run_moe(kernel) -> int:
    spec, calls = kernel.spec, 0
    dtype, bits = ELEMENTS[spec.x], 4 if spec.w == "int4" else 8
    per_group = spec.scales == "group"
    e = 3
    # per group: K a multiple of the group size (128), two and three groups (one would be per
    # channel, another dispatch class)
    shapes = ({(m, n, 384 if k > 128 else 256) for m, n, k in boundary_shapes(spec, 8, 32)}
              if per_group else set(boundary_shapes(spec, 8, 32 if bits == 4 else 16)))
    # and few long rows: the unfused kernels' SwiGLU pass splits each over a cluster of 4 CTAs
    # (swiglu_quant.cuh: 1025 vectors a row; their cluster barriers and shared-memory reads)
    shapes.add((3, 8200, 256))
    # and, for the kernels with a SwiGLU pass (unfused), many short rows, 1-8 warps each
    # (swiglu_quant_split_rows: its warps' shares of a row, their loads and stores at the
    # shares' and the row's edges, the shared-memory max, and the last row past every group).
    # Not for CUTLASS's A8W4 kernels: at this shape, where CTAs cross groups, racecheck warns (2
    # warnings, 0 errors; the code before session 40 too) about CUTLASS 4.2's pointer-array
    # mixed-input kernel itself, whose mainloop producer warp copies its TMA descriptors from
    # shared memory to global memory (every lane) and, at the next group, rewrites them (one
    # lane) with no __syncwarp between (sm90_gemm_array_tma_warpspecialized_cooperative.hpp); the
    # 8-bit CUTLASS kernels ran it clean.
    cutlass_int4 = bits == 4 and not getattr(spec.config, "is_own", False)
    if not getattr(spec.config, "fused", False) and not cutlass_int4:
        shapes.add((2200, 1536, 256))
    for m, n, k in sorted(shapes):
        weight = (torch.randint(-8, 8, (e, k, n), dtype=torch.int8, device=DEVICE) if bits == 4
                  else values((e, k, n), dtype))
        weight_scale = scales((e, k // 128, n) if per_group else (e, n))
        packed = gemmgen.pack_moe_weights(weight, weight_scale, weight_bits=bits)
        x, x_scale = values((m, k), dtype), scales((m,))
        # the middle expert empty, and (from m > 2) the last row past every group
        rows = max(m - 1, 1) if m > 2 else m
        counts = torch.tensor([rows - rows // 2, 0, rows // 2], dtype=torch.int64, device=DEVICE)
        gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, counts, check=False,
                                            kernel=kernel.name)
        calls += 1
    return calls


RUNNERS = {"w8a8": run_w8a8, "mixed": run_mixed, "moe": run_moe}


def main(names: list[str]) -> int:
    kernels = {k.name: k for k in gemmgen.list_kernels()}
    missing = [name for name in names if name not in kernels]
    if missing:
        print(f"not built: {', '.join(missing)}", file=sys.stderr)
        return 2
    total = 0
    for name in names:
        kernel = kernels[name]
        calls = RUNNERS[kernel.spec.family](kernel)
        torch.cuda.synchronize()
        print(f"{name}: {calls} calls", flush=True)
        total += calls
    print(f"launched {total} calls of {len(names)} kernels", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
