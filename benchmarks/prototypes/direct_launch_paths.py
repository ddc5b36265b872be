#!/usr/bin/env python3
"""The direct kernel at one token through gemmgen's own path, PDL on and off (session 26).

Companion of direct_occupancy.cu: that C++ loop of programmatic-dependent launches showed the
`[32, 8]` K-split-8 kernel up to 1.4x slower on grids of one to two CTAs an SM than the same grid
capped at two CTAs an SM. This times the same kernel, forced by name, through `gemmgen.mixed_mm`
(the op's Python path) eager back to back (`gpu_time_us`) and captured in a CUDA graph
(`graph_time_us`), with PDL on and off, on the three shapes where the loop showed it. Session 26
(H200), PDL on, 8192 x 28672 / 8192 x 8192 / 6144 x 4096: eager 35.9 / 12.3 / 6.9 µs, graph 36.6
/ 11.5 / 6.3, the capped speed of the loop; a launcher that capped the residency measured the same. (The probe run then, tidied.)
Not a benchmark of record.

    python benchmarks/prototypes/direct_launch_paths.py [LABEL]
"""

from __future__ import annotations

import sys

import torch

import gemmgen
from gemmgen.bindings import launch
from gemmgen.tuning.measure import gpu_time_us, graph_time_us

KERNEL = "sm90a_mixed_mm_bf16_i4_s_t32x8x64_direct_wk8_sauto_r32"
SHAPES = ((8192, 8192), (8192, 28672), (6144, 4096))  # (N, K): 256, 256 and 192 CTAs


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    torch.manual_seed(0)
    for n, k in SHAPES:
        pool = max(2, 240 * 2**20 // (n * k // 2) + 1)  # weight copies past twice the L2
        packs = []
        for _ in range(pool):
            q = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
            s = (torch.rand(n, k // 128, device="cuda") * 0.02 + 0.001).to(torch.bfloat16)
            packs.append(gemmgen.pack_weights(q, s, weight_type="uint4b8", group_size=128))
        a = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        row = [f"{label} {n}x{k}".strip()]
        for pdl in (True, False):
            launch.set_programmatic_dependent_launch(pdl)
            def call(i, pdl_packs=packs):
                gemmgen.mixed_mm(a, pdl_packs[i % pool], out=out, kernel=KERNEL)
            eager = gpu_time_us(call, pool)
            graph, how = graph_time_us(call, pool)
            row.append(f"PDL {'on ' if pdl else 'off'}: eager {eager:6.2f} µs, {how} {graph:6.2f} µs")
        launch.set_programmatic_dependent_launch(True)
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
