#!/usr/bin/env python3
"""A measurement prototype, not a benchmark of record: what act-order (GPTQ desc_act) costs a
mixed_mm call, and where. For each shape and M it times, back to back in one process (eager,
host hidden, `gpu_time_us`; each impl rotates its own weights past twice the L2):

  plain        the uint4b8 weight without act-order
  ao           the act-order weight: the entry point's gather kernel, then the GEMM
  ao_nopdl     the same with programmatic dependent launch off
  plain_nopdl  the plain weight with PDL off
  index_select torch's a.index_select(1, k_perm) followed by the plain call (the session-23 way)

then lists, from torch.profiler, each kernel's mean duration in a run of ao calls (the gather's
own time; under PDL a kernel's span includes its wait). Session 24 ran it on the H200 with three
launch schemes of gather_k.cuh built in turn (RESULTS.md, "Act-order"); the one kept launches
the gather and the GEMM in stream order, so `ao` and `ao_nopdl` now time the same launches.

    python benchmarks/prototypes/act_order_gather.py [--m 1 4 16 64]

Needs the mixed sm90 library (gemmgen build gemmgen/manifests/mixed_sm90.yaml).
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

import torch

import gemmgen
from gemmgen.bindings import launch
from gemmgen.tuning.measure import gpu_time_us

GROUP = 128
SHAPES = [(4096, 4096), (4096, 14336), (8192, 8192), (8192, 28672), (28672, 4096)]


def weight(n: int, k: int, act_order: bool):
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
    scales = (torch.rand(n, k // GROUP, device="cuda") * 0.02 + 0.005).to(torch.bfloat16)
    g_idx = None
    if act_order:
        g_idx = torch.empty(k, dtype=torch.int32, device="cuda")
        g_idx[torch.randperm(k, device="cuda")] = torch.arange(k, dtype=torch.int32, device="cuda") // GROUP
    return gemmgen.pack_weights(q, scales, weight_type="uint4b8", group_size=GROUP, g_idx=g_idx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 4, 16, 64])
    args = parser.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"{torch.cuda.get_device_name()}")
    pdl_before = launch.programmatic_dependent_launch()
    for n, k in SHAPES:
        count = max(2, min(32, math.ceil(2 * l2 / (n * k // 2)) + 1))
        plain = [weight(n, k, False) for _ in range(count)]
        ordered = [weight(n, k, True) for _ in range(count)]
        for m in args.m:
            a_pool = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(4)]
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")

            def call(pool, i):
                gemmgen.mixed_mm(a_pool[i % 4], pool[i % len(pool)], out=out)

            def gathered(i):
                p = ordered[i % len(ordered)]
                a = a_pool[i % 4].index_select(1, p.k_perm)
                gemmgen.mixed_mm(a, plain[i % len(plain)], out=out)

            times = {}
            for pdl in (True, False):
                launch.set_programmatic_dependent_launch(pdl)
                suffix = "" if pdl else "_nopdl"
                times["plain" + suffix] = gpu_time_us(lambda i: call(plain, i), count)
                times["ao" + suffix] = gpu_time_us(lambda i: call(ordered, i), count)
            launch.set_programmatic_dependent_launch(True)
            times["index_select"] = gpu_time_us(gathered, count)
            # the kernels of 50 ao calls
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for i in range(50):
                    call(ordered, i)
                torch.cuda.synchronize()
            spans = defaultdict(list)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    spans[event.name[:40]].append(event.device_time)
            kernels = "  ".join(f"{name}: {sum(v) / len(v):.1f}" for name, v in spans.items())
            print(f"n={n:6d} k={k:6d} m={m:4d}  " + "  ".join(f"{key} {us:6.1f}" for key, us in times.items())
                  + f"  | kernels µs: {kernels}", flush=True)
    launch.set_programmatic_dependent_launch(pdl_before)


if __name__ == "__main__":
    main()
