#!/usr/bin/env python3
"""What two of the open floors ask of a kernel on this GPU, measured against torch's own (cuBLAS)
GEMMs: the arithmetic behind RESULTS' status table, not a gemmgen measurement (session 52).

Issue 10 (mixed-input, >= 2.0x bf16 `torch.mm` at M = 64, >= 2.5x at M = 16; GPTQ int4 group
128): an int4-weight kernel that feeds bf16 MMAs does the tensor work of the bf16 GEMM it is
compared with, on a quarter of its weight bytes. Per Llama shape (N, K) and M:
  dram     torch.mm(a bf16 [M, K], w bf16 [K, N]), weights rotated through copies beyond the L2
           (the benchmark's baseline, as bench_mixed_mm.py times it); target = dram / the floor
  tensor   the GEMM's 2·M·N·K flops at the bf16 rate torch.mm reaches on 8192 x 8192 x 8192
           (compute-bound: the most this GPU's tensor cores give cuBLAS at its power limit)
  int4     the int4 weights and group-128 bf16 scales read once at the measured copy bandwidth
  tensor / target and int4 / target: the share of the target time the tensor cores must be busy,
  and the DRAM must be streaming, for a kernel to meet the floor (both under 1 and overlapped)
Issue 11 (3) (MoE A8W8 op <= 1.5x the int8 weight-read floor at <= 1024 tokens): at Mixtral-8x7B's
1024 tokens (top-2: 256 rows an expert, K 4096, N 2 x 14336) the grouped GEMM alone, as cuBLAS's
dense kernels run it per expert (`torch._int_mm`; `torch._scaled_mm` e4m3 row-wise with fast
accumulation), the 8 experts' weights rotated beyond the L2, against 1.5x the floor (the 8
experts' weights read once), before any SwiGLU or quantization; and the same flops at the int8 /
e4m3 rate of a compute-bound 8192-cube GEMM.

Times: gemmgen.tuning.measure.gpu_time_us (a spin kernel hides the host; median of 7 batches).

    python benchmarks/prototypes/floor_bounds.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_mixed_mm import copy_bandwidth, geomean, model_shapes  # noqa: E402
from gemmgen.tuning.measure import gpu_time_us  # noqa: E402

ROTATED_BYTES = 512 << 20  # weight copies beyond this many bytes: each call reads DRAM
CUBE = 8192  # a compute-bound GEMM: the tensor rate cuBLAS reaches


def cube_rate(kind: str) -> float:
    """Flops (or int ops) per µs of a CUBE³ GEMM of `kind` (bf16, int8, e4m3)."""
    if kind == "bf16":
        a = torch.randn(CUBE, CUBE, dtype=torch.bfloat16, device="cuda")
        us = gpu_time_us(lambda i: torch.mm(a, a), 1)
    elif kind == "int8":
        a = torch.randint(-128, 128, (CUBE, CUBE), dtype=torch.int8, device="cuda")
        us = gpu_time_us(lambda i: torch._int_mm(a, a.t()), 1)
    else:
        a = torch.randn(CUBE, CUBE, device="cuda").to(torch.float8_e4m3fn)
        s = torch.ones(CUBE, 1, device="cuda")
        us = gpu_time_us(lambda i: torch._scaled_mm(a, a.t(), scale_a=s, scale_b=s.t(),
                                                    out_dtype=torch.bfloat16,
                                                    use_fast_accum=True), 1)
    return 2 * CUBE**3 / us


def mixed_bounds(bandwidth: float) -> None:
    rate = cube_rate("bf16")
    print(f"issue 10: bf16 {CUBE}^3 torch.mm {rate / 1e6:.0f} TFLOPS; per shape µs: torch.mm from "
          f"DRAM, the target (torch.mm / floor), the tensor work at that rate, the int4 read")
    for m, wanted in ((16, 2.5), (64, 2.0)):
        shares = []
        for n, k in model_shapes(["llama3-8b", "llama2-70b"]):
            a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            copies = max(2, -(-ROTATED_BYTES // (2 * n * k)))
            pool = [torch.randn(k, n, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
            dram = gpu_time_us(lambda i: torch.mm(a, pool[i % copies]), copies)
            del pool
            target = dram / wanted
            tensor = 2 * m * n * k / rate
            int4 = (n * k / 2 + n * (k // 128) * 2) / bandwidth * 1e6
            shares.append((tensor / target, int4 / target))
            print(f"  M={m:3d} N={n:6d} K={k:6d}  torch.mm {dram:7.1f}  target {target:6.1f}  "
                  f"tensor {tensor:6.1f} ({tensor / target:4.0%})  int4 {int4:6.1f} "
                  f"({int4 / target:4.0%})")
        print(f"  M={m} ({wanted}x): geomean share of the target, tensor "
              f"{geomean([t for t, _ in shares]):.0%}, int4 read {geomean([r for _, r in shares]):.0%}")


def moe_bounds(bandwidth: float) -> None:
    experts, rows, k, n = 8, 256, 4096, 2 * 14336
    weight_bytes = experts * k * n
    floor = weight_bytes / bandwidth * 1e6
    copies = max(2, -(-ROTATED_BYTES // weight_bytes))
    print(f"issue 11 (3): Mixtral-8x7B, 1024 tokens ({rows} rows an expert): int8 weight-read floor "
          f"{floor:.1f} µs, 1.5x = {1.5 * floor:.1f} µs")
    x = torch.randint(-128, 128, (rows, k), dtype=torch.int8, device="cuda")
    pool = [torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
            for _ in range(copies * experts)]  # [N, K]: _int_mm's B is its transpose, K-major

    def int8_layer(i):
        for e in range(experts):
            torch._int_mm(x, pool[(i % copies) * experts + e].t())

    ops = 2 * experts * rows * k * n
    us = gpu_time_us(int8_layer, copies)
    cube = ops / cube_rate("int8")
    print(f"  int8 torch._int_mm, 8 experts: {us:8.1f} µs = {us / floor:.2f}x the floor "
          f"({ops / us / 1e6:.0f} TOPS); at the {CUBE}^3 rate {cube:.1f} µs = {cube / floor:.2f}x")
    fp8 = [w.to(torch.float8_e4m3fn) for w in pool]
    del pool
    xf = x.to(torch.float8_e4m3fn)
    x_scale = torch.rand(rows, 1, device="cuda")
    w_scale = torch.rand(1, n, device="cuda")

    def fp8_layer(i):
        for e in range(experts):
            torch._scaled_mm(xf, fp8[(i % copies) * experts + e].t(), scale_a=x_scale,
                             scale_b=w_scale, out_dtype=torch.bfloat16, use_fast_accum=True)

    us = gpu_time_us(fp8_layer, copies)
    cube = ops / cube_rate("e4m3")
    print(f"  e4m3 torch._scaled_mm (row-wise, fast accum), 8 experts: {us:8.1f} µs = "
          f"{us / floor:.2f}x the floor ({ops / us / 1e6:.0f} TFLOPS); at the {CUBE}^3 rate "
          f"{cube:.1f} µs = {cube / floor:.2f}x")


def main() -> None:
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s "
          f"(read + write); torch {torch.__version__}")
    mixed_bounds(bandwidth)
    moe_bounds(bandwidth)


if __name__ == "__main__":
    main()
