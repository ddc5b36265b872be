#!/usr/bin/env python3
"""Dispatch quality on shapes the tune did not see: the chosen kernel's time / the oracle's.

For each weight shape of --shapes (default: Qwen2.5-7B and -72B; shapes the table holds are skipped) and each
M of the grid, every candidate of the library is timed the way `gemmgen tune` times them (every
kernel with its manifest knobs, then every knob setting of the 3 fastest; stored and resumable);
the oracle is the fastest. Then the kernel + knobs each dispatch mode picks is timed on the same
data, and its ratio oracle_time / chosen_time reported (1.00 = the best available choice):
  tuned      gemmgen's dispatch with the published tuned table (nearest measured shape here)
  heuristic  the manifest's rules only (dispatch.choose(tuned=False))
Targets (issue 3): geomean >= 0.97 tuned, >= 0.90 heuristic.

    python benchmarks/dispatch_quality.py [--shapes qwen2_5_7b qwen2_5_72b] [--m 1,16,...] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

try:
    import gemmgen  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemmgen import dispatch, settings
from gemmgen.errors import GemmgenError
from gemmgen.tuning import tune as tuning
from gemmgen.families.w8a8.tuning import make_problem, time_candidate
from gemmgen.tuning.measure import Candidate, Record, Store
from gemmgen.tuning.shapes import load_many, parse_m_grid

DEFAULT_M = "1,8,16,32,64,96,128,192,256,384,512,768,1024,2048,4096,8192"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["qwen2_5_7b", "qwen2_5_72b"])
    parser.add_argument("--m", default=DEFAULT_M)
    parser.add_argument("--dtypes", nargs="+", help="input dtypes (default: every one the library builds)")
    parser.add_argument("--out", type=Path, help="also write the markdown summary here")
    args = parser.parse_args(argv)
    library = tuning.choose_library(None, "w8a8")
    tuned_shapes = {(s.n, s.k) for tuned in library.tables for table in tuned.classes.values()
                    for s in table.shapes}
    shapes = [s for s in load_many(args.shapes) if (s.n, s.k) not in tuned_shapes]
    skipped = [f"{s.n}x{s.k}" for s in load_many(args.shapes) if (s.n, s.k) in tuned_shapes]
    if skipped:
        print(f"skipping shapes the table was tuned on: {', '.join(skipped)}")
    args.dtypes = args.dtypes or sorted({k.spec.a for k in library.kernels.values()})
    options = tuning.TuneOptions(shapes=shapes, m_grid=parse_m_grid(args.m), dtypes=tuple(args.dtypes))
    if not library.tables:
        print(f"note: library {library.name} has no published tuned table; 'tuned' = the rules")
    gpu, sms = tuning.gpu_identity()
    slug = "".join(ch if ch.isalnum() else "_" for ch in gpu).strip("_")
    path = settings.build_dir() / "tune" / f"quality-{library.name}-{library.kernel_set}-{slug}-{sms}sm.jsonl"
    store = Store(path)
    tuning.measure(library, store, options, shapes)
    lines = [f"## Dispatch quality on untuned shapes ({torch.cuda.get_device_name()})", "",
             f"Library {library.name}; shapes {', '.join(args.shapes)} ({len(shapes)} (N, K) not in the "
             f"table{'; skipped as tuned: ' + ', '.join(skipped) if skipped else ''}); "
             f"M in {args.m}. Ratio = oracle time / chosen time (1.00 = best candidate).", "",
             "| dtype | mode | geomean | worst | worst at (n, k, m) | points |", "|---|---|---:|---:|---|---:|"]
    failed = False
    for a in args.dtypes:
        d, epilogue = options.out_dtype, options.epilogue
        cls = ("scaled_mm", a, d, epilogue)
        ratios: dict[str, list[tuple[float, tuple]]] = {"tuned": [], "heuristic": []}
        for shape in shapes:
            for m in options.m_grid:
                problem = None
                row = store.times(cls, [(shape.n, shape.k)]).get((shape.n, shape.k, m), {})
                for mode in ratios:
                    choice = dispatch.choose("scaled_mm", a_dtype=a, out_dtype=d, epilogue=epilogue,
                                             m=m, n=shape.n, k=shape.k, arch=library.arch,
                                             tuned=mode == "tuned")
                    cand = Candidate.of(choice.kernel, choice.knobs)
                    if cand not in row:
                        problem = problem or make_problem(cls, m, shape.n, shape.k)
                        try:
                            us, error = time_candidate(cand, problem), None
                        except GemmgenError as exc:  # dispatch chose a kernel that cannot run it
                            us, error = None, str(exc)
                        store.put(Record(cls, shape.n, shape.k, m, cand.kernel, cand.raster,
                                         cand.swizzle, cand.split_k, us, error))
                        row[cand] = math.inf if us is None else us
                    oracle = min(row.values())  # a chosen kernel that cannot run scores 0
                    ratios[mode].append((oracle / row[cand] if math.isfinite(row[cand]) else 0.0,
                                         (shape.n, shape.k, m)))
        for mode, values in ratios.items():
            geo = math.exp(sum(math.log(r) for r, _ in values) / len(values)) if all(
                r > 0 for r, _ in values) else 0.0
            worst, where = min(values)
            target = 0.97 if mode == "tuned" else 0.90
            failed |= geo < target
            lines.append(f"| {a} | {mode} | {geo:.3f} | {worst:.3f} | {where} | {len(values)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
