#!/usr/bin/env python3
"""The MoE family's CUTLASS kernels in each tile order (raster), side by side on the same data.

CUTLASS's grouped tile scheduler takes a raster order at run time (gemmgen's `raster` knob):
along M or along N of each expert's output, in the kernel's terms (swap-AB kernels tile Cᵀ, so
their M runs over features). Its `heuristic` cannot see a grouped GEMM's problem sizes, which
live on the device, and resolves to along N; gemmgen's MoE configs default to the order that
walks an expert's token tiles first (families/moe/schema.py). This script times every built
CUTLASS kernel of a class (or those whose config name matches --configs) in the orders asked
for, on expert layers (the tuner's inputs: gemmgen.families.moe.tuning.make_problem, weight
copies rotated beyond the L2, both routings), and checks that the orders give the same q and
q_scale bit for bit (the outputs poisoned first with a value that differs by order, so an element
left unwritten shows as a mismatch).

    python benchmarks/moe_raster.py --dtypes e4m3 int8 --models mixtral-8x7b --tokens 256 1024 4096

Each line: the row, the config, µs per order (best of two rounds, the second in reverse order),
and whether the orders' outputs are identical. Swap-AB kernels are timed in their default order
only unless --swap-ab-too.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
from pathlib import Path

import torch

import gemmgen
from gemmgen.families.moe import ops, tuning
from gemmgen.generator.kernel_config import RASTER_ORDERS, RuntimeKnobs
from gemmgen.tuning.measure import graph_time_us

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import MODELS  # noqa: E402  (the shipped expert layers, by name)

OP = "grouped_matmul_swiglu_quant"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", nargs="+", choices=("int8", "e4m3"), default=["e4m3", "int8"])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["mixtral-8x7b"])
    p.add_argument("--tokens", nargs="+", type=int, default=[256, 1024, 4096])
    p.add_argument("--rasters", nargs="+", choices=RASTER_ORDERS, default=["heuristic", "along_m"])
    p.add_argument("--configs", default=".", metavar="REGEX", help="config names to time (re.search)")
    p.add_argument("--swap-ab-too", action="store_true", help="time swap-AB kernels in every order too")
    return p.parse_args(argv)


def time_row(kernel, problem, group_list, rasters) -> tuple[dict[str, float], bool]:
    """µs per order (best of two rounds) and whether every order's outputs match the first's."""
    times = {r: [] for r in rasters}
    outputs = {}
    for round_ in range(2):
        for raster in rasters if round_ == 0 else rasters[::-1]:
            knobs = RuntimeKnobs(raster, 1, 1)

            def call(i: int, knobs=knobs) -> None:
                x, x_scale, w, w_scale = problem.pool[i]
                ops._gmm_swiglu_quant_out_impl(problem.q, problem.q_scale, x, w, w_scale, x_scale,
                                               group_list, "count", problem.weight_bits, False,
                                               kernel.name, knobs)
            if round_ == 0:
                problem.q.view(torch.int8).fill_(0x35 + rasters.index(raster))
                problem.q_scale.fill_(float("nan"))
                call(0)
                torch.cuda.synchronize()
                outputs[raster] = (problem.q.view(torch.int8).clone(), problem.q_scale.clone())
            times[raster].append(graph_time_us(call, len(problem.pool))[0])
    first = outputs[rasters[0]]
    same = all(torch.equal(q, first[0]) and torch.equal(s, first[1]) for q, s in outputs.values())
    return {r: min(t) for r, t in times.items()}, same


def main(argv=None) -> int:
    args = parse_args(argv)
    print(torch.cuda.get_device_name(), flush=True)
    mismatches = 0
    for dtype in args.dtypes:
        cls = (OP, dtype, dtype, "channel")
        kernels = [k for k in gemmgen.dispatch.kernels(OP)
                   if (k.spec.x, k.spec.w, k.spec.scales) == cls[1:] and not k.spec.config.is_own
                   and re.search(args.configs, k.spec.origin.config)]
        for name in args.models:
            model = MODELS[name]
            shape = types.SimpleNamespace(experts=model.experts, top_k=model.topk, name=name,
                                          origin="benchmarks/moe_raster.py")
            for tokens in args.tokens:
                problem = tuning.make_problem(cls, tokens * model.topk, model.n, model.k, shape=shape)
                for routing, group_list in problem.group_lists.items():
                    for kernel in kernels:
                        rasters = (list(args.rasters) if args.swap_ab_too or not kernel.spec.config.swap_ab
                                   else [kernel.spec.knobs.raster])
                        us, same = time_row(kernel, problem, group_list, rasters)
                        mismatches += not same
                        print(f"{dtype} {name} T={tokens} {routing} {kernel.spec.origin.config:18s} "
                              + " ".join(f"{r}={t:9.1f}" for r, t in us.items())
                              + f"  identical={same}", flush=True)
                del problem
                torch.cuda.empty_cache()
    if mismatches:
        print(f"{mismatches} row(s): the orders' outputs differ", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
