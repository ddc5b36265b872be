#!/usr/bin/env python3
"""Does a cold GPU rank large-M W8A8 kernels as a sustained (power-limited) load does? (session 29)

For each point (8 shapes x M 2048 / 8192, int8 and e4m3 -> bf16 with bias) and four kernels with
their manifest knobs (the 128x256 cooperative `wide`, the 128x128 pingpong c1x2 and c2x1, the
128x128 stream-K), two times with the tuner's own method (`time_candidate`): "cold" after 50 ms
idle (boost clocks), "hot" right after ~250 ms of a bf16 8192^3 matmul load (the GPU at its
power limit). 3 rounds, kernel order rotated, medians. Results: benchmarks/RESULTS.md, session 29.

    GEMMGEN_BUILD_DIR=<the built w8a8 library> python benchmarks/prototypes/sustained_ranking.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

from gemmgen import dispatch
from gemmgen.families.w8a8.tuning import make_problem, time_candidate
from gemmgen.tuning.measure import Candidate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_scaled_mm import heat  # noqa: E402  (a bf16 matmul load of about MS ms, enqueued)

CONFIGS = {"wide": "t128x256x128_c2x1x1_coop_sauto", "pp_c12": "t128x128x128_c1x2x1_pp_sauto",
           "pp_c21": "t128x128x128_c2x1x1_pp_sauto", "sk": "t128x128x128_c1x1x1_coop_sauto_streamk"}
SHAPES = [(8192, 8192), (28672, 4096), (57344, 8192), (10240, 8192),  # Llama-3-8B / Llama-2-70B
          (5120, 25600), (59136, 8192), (51200, 5120), (3584, 18944)]  # Qwen3-32B / Qwen2.5
ROWS = (2048, 8192)
ROUNDS = 3


def kernel_of(library, dtype_tag: str, config: str):
    return next(k for name, k in library.kernels.items() if f"_{dtype_tag}_bf16_scaled_bias_{config}" in name)


def main() -> None:
    library = next(lib for lib in dispatch.libraries() if lib.name == "w8a8")
    began = time.time()
    print("| dtype | n x k | m | " + " | ".join(f"{c} cold / hot µs" for c in CONFIGS) + " | fastest cold | fastest hot |")
    for tag, dtype in (("i8", "int8"), ("e4m3", "e4m3")):
        cls = ("scaled_mm", dtype, "bf16", "ScaledEpilogueBias")
        for n, k in SHAPES:
            for m in ROWS:
                problem = make_problem(cls, m, n, k)
                samples = {c: {"cold": [], "hot": []} for c in CONFIGS}
                names = list(CONFIGS)
                for r in range(ROUNDS):
                    for config in names[r % len(names):] + names[:r % len(names)]:
                        candidate = Candidate.of(kernel_of(library, tag, CONFIGS[config]))
                        torch.cuda.synchronize()
                        time.sleep(0.05)
                        samples[config]["cold"].append(time_candidate(candidate, problem))
                        heat(250)
                        samples[config]["hot"].append(time_candidate(candidate, problem))
                median = {c: {state: statistics.median(v) for state, v in s.items()} for c, s in samples.items()}
                fastest = {state: min(median, key=lambda c: median[c][state]) for state in ("cold", "hot")}
                cells = " | ".join(f"{median[c]['cold']:.0f} / {median[c]['hot']:.0f}" for c in CONFIGS)
                print(f"| {tag} | {n}x{k} | {m} | {cells} | {fastest['cold']} | {fastest['hot']} |", flush=True)
                del problem
                torch.cuda.empty_cache()
    print(f"{time.time() - began:.0f} s")


if __name__ == "__main__":
    main()
