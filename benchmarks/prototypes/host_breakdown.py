#!/usr/bin/env python3
"""A measurement prototype, not a benchmark of record: the eager `gemmgen.scaled_mm` host path
cut into its steps (argument checks, memoized dispatch, struct packing, the C run, ...) beside
the op on torch's dispatcher, `torch._scaled_mm` and one small torch kernel launch; 5000
back-to-back calls a row after 50 untimed ones (`per_call_us` of benchmarks/host_overhead.py),
two rounds, then a cProfile of the eager call. int8 -> bf16 with bias, M=16, N=K=4096, the
kernel dispatch picks. Results: benchmarks/RESULTS.md, session 21.

    python benchmarks/prototypes/host_breakdown.py   # a GPU and a built W8A8 sm90 library
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

try:
    import gemmgen
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import gemmgen
from gemmgen.bindings import launch
from gemmgen.families.w8a8 import ops
from gemmgen.families.w8a8.abi import ARGS_LAYOUT, RASTER_CODES, ScaledMmArgs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from host_overhead import K, M, N, operands, per_call_us  # noqa: E402  (benchmarks/host_overhead.py)

CALLS = 5000


def main() -> None:
    o = operands()
    a, b, scale_a, scale_b, bias, out, a8, b8 = o.a, o.b, o.scale_a, o.scale_b, o.bias, o.out, o.a8, o.b8
    gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out)
    kernel, knobs = ops._kernel_for(None, a, out, "ScaledEpilogueBias", M, N, K)
    print("kernel", kernel.name)
    buffer = launch.args_buffer(ScaledMmArgs)
    stream = torch.cuda.current_stream().cuda_stream
    device = a.get_device()

    def pack():
        ARGS_LAYOUT.pack_into(buffer, 0, a.data_ptr(), b.data_ptr(), out.data_ptr(), M, N, K, K, K, N,
                              scale_a.data_ptr(), scale_b.data_ptr(), bias.data_ptr(), 0, 0, True, True,
                              RASTER_CODES[knobs.raster], knobs.swizzle, 1, launch.launch_flags())

    rows = {
        "gemmgen.scaled_mm, eager, out= given":
            lambda: gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out),
        "the eager implementation, called directly":
            lambda: ops._scaled_mm_out_impl(out, a, b, scale_a, scale_b, bias, None, None, None),
        "torch.ops.gemmgen.scaled_mm_out (the dispatcher)":
            lambda: torch.ops.gemmgen.scaled_mm_out(out, a, b, scale_a, scale_b, bias, None, None, None),
        "torch._scaled_mm (fp8, row-wise, bias)":
            lambda: torch._scaled_mm(a8, b8, scale_a=scale_a, scale_b=scale_b, bias=bias,
                                     out_dtype=torch.bfloat16),
        "bias.add_(0) (one small torch kernel launch)": lambda: bias.add_(0),
        "  through_custom_op": lambda: launch.through_custom_op(a),
        "  argument checks": lambda: ops.check_arguments(out, a, b, scale_a, scale_b, bias, None, None),
        "  memoized dispatch choice":
            lambda: ops._kernel_for(None, a, out, "ScaledEpilogueBias", M, N, K),
        "  argument struct packed": pack,
        "  C workspace_size": lambda: kernel.workspace_size(buffer),
        "  C run (TMA descriptors, launch)": lambda: kernel.run(buffer, 0, 0, stream),
        "  launch (workspace, stream, run)": lambda: launch.launch(kernel, buffer, device),
        "  mark_written": lambda: launch.mark_written(out),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: µs per call")
    for round_ in (1, 2):
        for name, fn in rows.items():
            print(f"round {round_}  {name:50s} {per_call_us(fn, CALLS):7.2f}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3000):
        gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out)
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    print(text.getvalue())


if __name__ == "__main__":
    main()
