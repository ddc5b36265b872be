#!/usr/bin/env python3
"""A measurement prototype, not a benchmark of record: does a stream-K W8A8 kernel beat every
persistent one where few output tiles meet a deep K? Every built int8 / e4m3 -> bf16 kernel
with the bias epilogue, forced by name, timed the way `gemmgen tune` times (gpu_time_us, 4
rotated input sets), at N x K in (1280 x 8192, 3072 x 8192, 1280 x 7168) and M in (256, 768,
1024, 2048, 4096); prints the best persistent kernel and the best stream-K kernel per point.
Results: benchmarks/RESULTS.md, session 20.

Two libraries of one op with dispatch rules cannot share a build directory, so build the
stream-K kernels (e.g. a manifest with `tile_scheduler: streamk` configs) into their own and run
this once per directory:

    GEMMGEN_BUILD_DIR=<shipped build> python benchmarks/prototypes/streamk_few_tiles.py
    GEMMGEN_BUILD_DIR=<stream-K build> python benchmarks/prototypes/streamk_few_tiles.py
"""
import sys
from pathlib import Path

import torch

try:
    import gemmgen
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import gemmgen
from gemmgen import dispatch
from gemmgen.tuning.measure import gpu_time_us

FP8 = torch.float8_e4m3fn
SHAPES = ((1280, 8192), (3072, 8192), (1280, 7168))
M_VALUES = (256, 768, 1024, 2048, 4096)
POOL = 4


def random_operand(rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.int8:
        return torch.randint(-128, 128, (rows, k), dtype=torch.int8, device="cuda")
    return torch.randn(rows, k, device="cuda").to(FP8)


def main() -> int:
    for dtype, name in ((torch.int8, "int8"), (FP8, "e4m3")):
        kernels = [k for k in dispatch.kernels("scaled_mm") if k.spec.a == name
                   and k.spec.d == "bf16" and k.spec.epilogue == "ScaledEpilogueBias"]
        for n, k in SHAPES:
            for m in M_VALUES:
                pool = [(random_operand(m, k, dtype), random_operand(n, k, dtype).t(),
                         torch.rand(m, 1, device="cuda"), torch.rand(1, n, device="cuda"),
                         torch.randn(n, device="cuda", dtype=torch.bfloat16)) for _ in range(POOL)]
                out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                times = {}
                for kernel in kernels:
                    def call(i, kernel_name=kernel.name):
                        a, b, scale_a, scale_b, bias = pool[i]
                        gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out,
                                          kernel=kernel_name)
                    times[kernel.name] = gpu_time_us(call, POOL)
                best = {}
                for label, keep in (("persistent", lambda s: "streamk" not in s),
                                    ("stream-K", lambda s: "streamk" in s)):
                    group = {s: t for s, t in times.items() if keep(s)}
                    if group:
                        fastest = min(group, key=group.get)
                        best[label] = f"{group[fastest]:.1f} [{fastest}]"
                print(f"{name} n={n} k={k} m={m}: " + "; ".join(f"{label} {text}"
                      for label, text in best.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
