#!/usr/bin/env python3
"""Dispatch quality on shapes the tune did not see: the chosen kernel's time / the oracle's.

For each weight shape of --shapes (default: the shipped shape files the W8A8 table was not tuned
on; shapes the GPU's table lists are skipped) and each M of the grid, every candidate of the
library is timed the way `gemmgen tune` times them (every kernel with its manifest knobs, then
every knob setting of the 3 fastest; stored and resumable); the oracle is the fastest. Then the
kernel + knobs each dispatch mode picks is looked up on the same data (timed if the store lacks
it), and its ratio oracle_time / chosen_time reported (1.00 = the best available choice):
  tuned      gemmgen's dispatch with the GPU's tuned table: for an unlisted shape, the table's
             cost model (gemmgen/tuning/cost_model.py)
  nearest    the table's winner at the nearest listed shape (what `tuned` did before the model)
  rules      the manifest's rules only (dispatch.choose(tuned=False))
Floors (issue 14, untuned shapes): geomean >= 0.98, worst >= 0.90.

--store reads (and extends) another measurement store, e.g. the one `gemmgen tune` wrote for the
held-out shapes (`gemmgen tune --shapes <held-out> --m <grid>` times exactly these points).
--confirm RATIO re-times, side by side, every point where a mode scores below RATIO: a single
pass times each candidate once, minutes apart, while the clock (power limit) drifts by several per
cent (the most at large M), and the oracle, the fastest of some 50 such samples, is biased low by
it. The store's 3 fastest candidates and each mode's choice are timed in RETIME_ROUNDS (or more) interleaved
rounds and compared within each round (`retime_side_by_side`, what `gemmgen tune` does to settle
near-ties); the store keeps those times (settled) and the summary is given before and after.
--offline "GPU NAME:SMS" evaluates without a GPU: decisions for that GPU from the manifests and
the tables beside them, every time from the store (a choice the store lacks, e.g. a knob setting
the tune tried only on another shape, is counted apart, not scored).

    python benchmarks/dispatch_quality.py [--shapes qwen2_5_7b ...] [--m 1,16,...] [--out FILE.md]
    python benchmarks/dispatch_quality.py --store gemmgen-build/tune/w8a8-...-NVIDIA_H200-132sm-seed0.jsonl \\
        --offline "NVIDIA H200:132"
    python benchmarks/dispatch_quality.py --store heldout.jsonl --shapes mistral_nemo_12b gemma2_9b gemma2_27b \\
        --confirm 0.95
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import tempfile
from pathlib import Path

try:
    import gemmgen  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemmgen import dispatch, settings
from gemmgen.bindings.library import manifest_library
from gemmgen.errors import GemmgenError
from gemmgen.tuning import autotune
from gemmgen.tuning import tune as tuning
from gemmgen.tuning.measure import Candidate, Record, Store
from gemmgen.tuning.shapes import load_many, parse_m_grid

DEFAULT_M = "1,8,16,32,64,96,128,192,256,384,512,768,1024,2048,4096,8192"
DEFAULT_SHAPES = ["qwen2_5_7b", "qwen2_5_72b", "llama3_2_3b", "qwen3_32b", "llama3_70b_tp8", "mistral_nemo_12b",
                  "gemma2_9b", "gemma2_27b", "phi3_medium_14b", "yi1_5_34b", "llama3_1_405b_tp8",
                  "mistral_small_24b", "qwen2_5_32b", "qwen2_5_72b_tp4"]
MANIFEST = Path(settings.DEFAULT_MANIFEST_DIR) / "w8a8_sm90.yaml"
MODES = ("tuned", "nearest", "rules")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    parser.add_argument("--m", default=DEFAULT_M)
    parser.add_argument("--dtypes", nargs="+", help="input dtypes (default: every one the library builds)")
    parser.add_argument("--store", type=Path, help="measurement store to read and extend")
    parser.add_argument("--offline", metavar="GPU:SMS",
                        help="no GPU: decide for this GPU from the manifests, time nothing")
    parser.add_argument("--confirm", type=float, metavar="RATIO",
                        help="re-time side by side the points where a mode scores below RATIO (GPU only)")
    parser.add_argument("--out", type=Path, help="also write the markdown summary here")
    args = parser.parse_args(argv)
    if args.confirm is not None and args.offline:
        parser.error("--confirm times kernels: it needs a GPU, not --offline")
    # `tuned` scores the table: records of tuning at first use (which come first in dispatch)
    # are read from an empty scratch folder, not the library's
    scratch = Path(tempfile.mkdtemp(prefix="gemmgen-quality-"))
    autotune.cache_path = lambda name, gpu: scratch / f"{name}-{gpu[1]}sm.jsonl"

    if args.offline:
        name, _, sms = args.offline.rpartition(":")
        if not name or not sms.isdigit():
            parser.error(f"--offline: expected 'GPU NAME:SM COUNT', got {args.offline!r}")
        gpu = (name, int(sms))
        if args.store is None:
            parser.error("--offline needs --store (every time comes from it)")
        library = manifest_library(MANIFEST)
        # decisions as dispatch makes them on that GPU (its identity is what picks the table)
        dispatch.gpu_identity = functools.lru_cache(lambda device=None: gpu)
        source = {"manifests": [str(MANIFEST)]}
        timer = None
    else:
        import torch
        from gemmgen.families.w8a8.tuning import make_problem, time_candidate
        library = tuning.choose_library(None, "w8a8")
        gpu = tuning.gpu_identity()
        source = {}
        timer = (make_problem, time_candidate)
    table, _ = library.table_for(gpu)
    tuned_shapes = set() if table is None else {
        (s.n, s.k) for c in table.classes.values() for s in c.shapes}
    shapes = [s for s in load_many(args.shapes) if (s.n, s.k) not in tuned_shapes]
    skipped = sorted({f"{s.n}x{s.k}" for s in load_many(args.shapes) if (s.n, s.k) in tuned_shapes})
    if skipped:
        print(f"skipping shapes the table was tuned on: {', '.join(skipped)}")
    dtypes = args.dtypes or sorted({k.spec.a for k in library.kernels.values()})
    m_grid = parse_m_grid(args.m)
    if args.store is not None:
        path = args.store
    else:
        slug = "".join(ch if ch.isalnum() else "_" for ch in gpu[0]).strip("_")
        path = settings.build_dir() / "tune" / f"quality-{library.name}-{library.kernel_set}-{slug}-{gpu[1]}sm.jsonl"
    store = Store(path)
    if timer is not None:  # every candidate of every point (resumed from the store)
        options = tuning.TuneOptions(shapes=shapes, m_grid=m_grid, dtypes=tuple(dtypes))
        tuning.measure(library, store, options, shapes)
    device = "offline, " + args.offline if args.offline else torch.cuda.get_device_name()
    lines = [f"## Dispatch quality on untuned shapes ({device})", "",
             f"Library {library.name}; table {table.path if table else 'none'} ({table.gpu[0] if table else '-'}); "
             f"shapes {', '.join(args.shapes)} ({len(shapes)} (N, K) not in the table"
             f"{'; skipped as tuned: ' + ', '.join(skipped) if skipped else ''}); M in {args.m}; store "
             f"{path.name}. Ratio = oracle time / chosen time (1.00 = best candidate).", "",
             "| dtype | mode | geomean | worst | worst at (n, k, m) | points |", "|---|---|---:|---:|---|---:|"]
    header = lines[-2:]
    scored = {a: _score(a, shapes, m_grid, library, table, store, source, timer) for a in dtypes}
    lines += _summary(scored)
    if args.confirm is not None:
        low = sorted({(a, where) for a, (ratios, _) in scored.items() for values in ratios.values()
                      for r, where in values if r < args.confirm})
        print(f"re-timing {len(low)} points side by side (a mode below {args.confirm})", flush=True)
        for a, (n, k, m) in low:
            _confirm(("scaled_mm", a, "bf16", "ScaledEpilogueBias"), n, k, m, library, table, store, source, timer)
        lines += ["", f"After re-timing side by side the {len(low)} points where a mode scored below "
                  f"{args.confirm} (the store's 3 fastest and each mode's choice, "
                  f"{tuning.RETIME_ROUNDS}+ interleaved rounds (a multiple of the candidates), compared within each round):", "", *header]
        scored = {a: _score(a, shapes, m_grid, library, table, store, source, timer) for a in dtypes}
        lines += _summary(scored)
    failed = any(mode == "tuned" and (geo < 0.98 or worst < 0.90)
                 for mode, geo, worst in _floors(scored))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if failed else 0


def _score(a: str, shapes, m_grid, library, table, store: Store, source: dict, timer):
    """({mode: [(ratio, (n, k, m))]}, {mode: choices the store lacks (offline)}) of one dtype;
    with a GPU, a choice the store lacks is timed and stored."""
    cls = ("scaled_mm", a, "bf16", "ScaledEpilogueBias")
    ratios: dict[str, list[tuple[float, tuple]]] = {mode: [] for mode in MODES}
    unmeasured = dict.fromkeys(MODES, 0)
    for shape in shapes:
        for m in m_grid:
            row = store.times(cls, [(shape.n, shape.k)]).get((shape.n, shape.k, m), {})
            if not row and timer is None:
                raise SystemExit(f"the store has no measurement of {a} (n={shape.n}, k={shape.k}, m={m})")
            for mode in MODES:
                cand = _decision(mode, library, table, cls, m, shape.n, shape.k, source)
                if cand is None:
                    continue
                if cand not in row:
                    if timer is None:  # offline: a knob setting the store never timed here
                        unmeasured[mode] += 1
                        continue
                    problem = timer[0](cls, m, shape.n, shape.k)
                    try:
                        us, error = timer[1](cand, problem), None
                    except GemmgenError as exc:  # dispatch chose a kernel that cannot run it
                        us, error = None, str(exc)
                    store.put(Record(cls, shape.n, shape.k, m, cand.kernel, cand.raster,
                                     cand.swizzle, cand.split_k, us, error))
                    row[cand] = math.inf if us is None else us
                oracle = min(row.values())  # a chosen kernel that cannot run scores 0
                ratios[mode].append((oracle / row[cand] if math.isfinite(row[cand]) else 0.0,
                                     (shape.n, shape.k, m)))
    return ratios, unmeasured


def _floors(scored) -> list[tuple[str, float, float]]:
    """(mode, geomean, worst) of every dtype and mode with points."""
    return [(mode, *_geomean_worst(values)[:2]) for ratios, _ in scored.values()
            for mode, values in ratios.items() if values]


def _geomean_worst(values: list[tuple[float, tuple]]) -> tuple[float, float, tuple]:
    """(geomean, worst ratio, where the worst is) of [(ratio, point)]; geomean 0 when one is 0."""
    geo = math.exp(sum(math.log(r) for r, _ in values) / len(values)) if all(r > 0 for r, _ in values) else 0.0
    worst, where = min(values)
    return geo, worst, where


def _summary(scored) -> list[str]:
    """The markdown rows of `_score`'s results, one per dtype and mode."""
    lines = []
    for a, (ratios, unmeasured) in scored.items():
        for mode, values in ratios.items():
            if values:
                geo, worst, where = _geomean_worst(values)
                missing = f" ({unmeasured[mode]} not in the store)" if unmeasured[mode] else ""
                lines.append(f"| {a} | {mode} | {geo:.3f} | {worst:.3f} | {where} | {len(values)}{missing} |")
    return lines


def _confirm(cls, n: int, k: int, m: int, library, table, store: Store, source: dict, timer) -> None:
    """Re-time one point's 3 fastest stored candidates and every mode's choice side by side and
    store them as settled; again (up to the tuner's SETTLE_PASSES) while a time not re-timed is
    still the fastest. A candidate that fails (e.g. out of memory) leaves the point as it was."""
    problem = timer[0](cls, m, n, k)
    chosen = {_decision(mode, library, table, cls, m, n, k, source) for mode in MODES} - {None}
    for _ in range(tuning.SETTLE_PASSES):
        row = {c: t for c, t in store.times(cls, [(n, k)]).get((n, k, m), {}).items() if math.isfinite(t)}
        fastest = sorted(row, key=row.get)[:3]
        candidates = sorted(set(fastest) | {c for c in chosen if c in row})
        try:
            settled = tuning.retime_side_by_side(candidates, lambda c: timer[1](c, problem))
        except (GemmgenError, RuntimeError) as exc:  # torch's out of memory is a RuntimeError
            print(f"re-timing (n={n}, k={k}, m={m}) failed, first-pass times kept: {exc}", flush=True)
            return
        for c, us in settled.items():
            store.put(Record(cls, n, k, m, c.kernel, c.raster, c.swizzle, c.split_k, us, None, settled=True))
        row.update(settled)
        if min(row, key=row.get) in settled:
            return


def _decision(mode: str, library, table, cls, m: int, n: int, k: int, source: dict) -> Candidate | None:
    """The candidate a dispatch mode picks; None for `nearest` without a table."""
    if mode == "nearest":
        ctable = None if table is None else table.classes.get(cls)
        if ctable is None:
            return None
        bucket = ctable.lookup(m, n, k).bucket
        return Candidate(bucket.kernel, bucket.knobs.raster, bucket.knobs.swizzle,
                         bucket.knobs.split_k_slices)
    _, a, d, epilogue = cls
    choice = dispatch.choose("scaled_mm", a_dtype=a, out_dtype=d, epilogue=epilogue, m=m, n=n, k=k,
                             arch=library.arch, tuned=mode == "tuned", **source)
    return Candidate.of(choice.kernel, choice.knobs)


if __name__ == "__main__":
    sys.exit(main())
