#!/usr/bin/env python3
"""What tuning at first use costs: the first call of a shape no tuned table lists (it times every
candidate), and the calls after it (nothing timed), with `gemmgen.autotune()` on.

For each (M, N, K) of --problems, an int8 `gemmgen.scaled_mm` (bf16 out, bias) is called three
times; the wall time of each call (synchronized) is printed, with the kernel dispatch settled on
and why. The records go to a scratch cache (--cache-dir, default a temporary folder), never to
the library's. The timings are kept in the store of tuning at first use
(<build dir>/<library>/autotune/*.times.jsonl), so a second run times nothing new: remove that
store (or use a fresh GEMMGEN_BUILD_DIR) to measure the first call again.

    python benchmarks/autotune_overhead.py [--problems 200x3072x6144 37x5120x3584]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

try:
    import gemmgen
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gemmgen
from gemmgen import dispatch
from gemmgen.tuning import autotune


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", nargs="+", default=["200x3072x6144", "37x5120x3584", "1000x1280x8192"],
                        help="MxNxK, shapes no shipped table lists")
    parser.add_argument("--cache-dir", type=Path)
    args = parser.parse_args(argv)
    folder = args.cache_dir or Path(tempfile.mkdtemp(prefix="gemmgen-autotune-"))
    autotune.cache_path = lambda name, gpu: folder / f"{name}-{gpu[1]}sm.jsonl"  # scratch cache
    gemmgen.reload()
    print(f"GPU: {torch.cuda.get_device_name()}; scratch cache in {folder}")
    print("| M x N x K | first call ms | 2nd call µs | 3rd call µs | kernel (source) |")
    print("|---|---:|---:|---:|---|")
    for text in args.problems:
        m, n, k = (int(v) for v in text.lower().split("x"))
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
        b = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda").t()
        scale_a, scale_b = torch.rand(m, 1, device="cuda"), torch.rand(1, n, device="cuda")
        bias = torch.randn(n, device="cuda").to(torch.bfloat16)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        times = []
        with gemmgen.autotune():
            for _ in range(3):
                torch.cuda.synchronize()
                started = time.perf_counter()
                gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - started)
            choice = dispatch.choose("scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16,
                                     epilogue="ScaledEpilogueBias", m=m, n=n, k=k)
        print(f"| {m}x{n}x{k} | {times[0] * 1e3:.0f} | {times[1] * 1e6:.0f} | {times[2] * 1e6:.0f} | "
              f"{choice.kernel.name} ({choice.source}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
