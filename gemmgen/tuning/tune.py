"""`gemmgen tune`: measure every candidate over shapes × an M grid, write the tuned table, and
(`--select`) the pruned manifest with its table.

Flow: pick the library the GPU runs → for each problem class (a dispatch class the op family
chooses, e.g. (scaled_mm, a, out, epilogue)) and point (n, k, m): time every kernel with its
manifest knobs, then every knob setting of the fastest few → store each time as it is taken
(resumable) → winners per point (ties broken by a stable rule, see select.py) → M buckets per
shape, and per class the cost model for unlisted shapes (cost_model.py) → the GPU's table
`<manifest>.tuned.<gpu>.yaml`. With several GPUs, shapes are dealt round-robin to one worker
process per GPU. What is family-specific (classes, inputs, one timed call, knobs) comes from the
family's tuner hooks (`OpFamily.tuner`). `--extend TABLE` times only the shapes a table does not
list and merges them into it (its buckets and stored times kept, the cost model fitted again);
`--retune TABLE` times chosen M of the shapes it lists afresh and rewrites their picks alone.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import yaml

from .. import __version__, dispatch, settings
from .. import arch as arch_policy
from .. import families as registry
from ..bindings.library import Kernel, Library, libraries
from ..errors import GemmgenError
from ..generator.expand import expand
from ..generator.kernel_config import RASTER_ORDERS
from ..generator.manifest import load_manifest
from ..generator.yaml_lines import load_yaml
from . import cost_model
from . import select as selection
from .cost_model import CostModel
from .measure import Candidate, Record, Store
from .shapes import DEFAULT_M_GRID, WeightShape
from .table import (Bucket, ClassTable, ShapeEntry, TunedTable, kernel_set_hash, load_table, render_table,
                    stored_time, table_path_for)

MeasuredClass = tuple[str, ...]  # a dispatch class: (op, *class fields)

log = logging.getLogger(__name__)


@dataclass
class TuneOptions:
    shapes: list[WeightShape]
    m_grid: tuple[int, ...]  # empty: the tuned families' own (their tuner's M_GRID, else the default)
    library: str | None = None
    family: str | None = None  # without `library`: the library holding this op family's kernels
    dtypes: tuple[str, ...] = ()  # a dtypes; empty: every one the library builds
    out_dtype: str = "bf16"
    epilogue: str = "ScaledEpilogueBias"
    knob_top: int = 3
    tolerance: float = selection.DEFAULT_TOLERANCE
    settled_tolerance: float = selection.SETTLED_TOLERANCE  # ties among settled times
    fresh: bool = False
    out: str | None = None  # table path (default: next to the manifest)
    select: bool = False
    select_dir: str | None = None
    gpus: int | None = None
    seed: int = 0
    from_cache: bool = False  # add the shapes tuning at first use recorded (gemmgen/tuning/autotune.py)
    extend: str | None = None  # a tuned table to add the new shapes to (its buckets and times kept)
    update: str | None = None  # a tuned table whose measured classes this tune replaces (others kept)
    retune: str | None = None  # a tuned table whose points (its shapes at m_grid) are re-timed
    command: str = ""
    shape_sources: list[str] = field(default_factory=list)

    def __post_init__(self):
        # settled times are never looser ties than one-pass ones
        self.settled_tolerance = min(self.settled_tolerance, self.tolerance)


def _say(message: str) -> None:
    print(f"gemmgen tune: {message}", flush=True)


def gpu_identity() -> tuple[str, int]:
    """(name, SM count) of the current GPU."""
    return dispatch.gpu_identity(torch.cuda.current_device())


def choose_library(name: str | None, family: str | None = None) -> Library:
    """The library to tune: the named one, else the one with dispatch rules for the arch this GPU
    runs best (only libraries holding op family `family`'s kernels, when given): with several
    families built there are several, and the caller must say which."""
    loaded = libraries()
    if name is not None:
        found = [lib for lib in loaded if lib.name == name]
        if not found:
            raise GemmgenError(f"no built library {name!r}; built: {', '.join(l.name for l in loaded)}")
        return found[0]
    arch = arch_policy.best_arch_for(torch.cuda.get_device_capability())
    owners = [lib for lib in loaded if lib.arch == arch and lib.dispatch and (
        family is None or any(k.spec.family == family for k in lib.kernels.values()))]
    if len(owners) != 1:
        which = f" of op family {family!r}" if family else ""
        raise GemmgenError(f"{len(owners)} built {arch} libraries{which} with dispatch rules "
                           f"({', '.join(l.name for l in owners) or 'none'}); pick one with "
                           "--library (or --family)")
    return owners[0]


def kernel_rank(library: Library) -> dict[str, tuple]:
    """Stable preference among kernels: manifest order (config line), then name."""
    return {k.name: (k.spec.origin.line, k.name) for k in library.kernels.values()}


def candidate_rank(library: Library):
    """Tie-break rule: manifest order of the kernel, its manifest knobs before any other."""
    ranks = kernel_rank(library)

    def rank(c: Candidate) -> tuple:
        default = Candidate.of(library.kernels[c.kernel])
        return (ranks[c.kernel], c != default, RASTER_ORDERS.index(c.raster), c.swizzle, c.split_k)
    return rank


def hooks_of(cls: MeasuredClass):
    """The tuner hooks of the family that serves a class."""
    return registry.for_op(cls[0]).tuner


def make_problem(cls: MeasuredClass, m: int, shape: WeightShape, seed: int = 0):
    """Seeded inputs of one point (the family builds them; `shape` also carries the model's
    facts a family may need, e.g. an MoE layer's experts and top-k)."""
    return hooks_of(cls).make_problem(cls, m, shape.n, shape.k, seed=seed, shape=shape)


def shapes_for(cls: MeasuredClass, shapes: list[WeightShape]) -> list[WeightShape]:
    """The shapes a class is measured on: those its family's tuner accepts (the MoE family:
    expert layers, which name their experts and top-k; by default linear layers, which do not)."""
    accepts = getattr(hooks_of(cls), "accepts_shape", None)
    return [s for s in shapes if (accepts(s) if accepts is not None else not s.experts)]


def grid_for(cls: MeasuredClass, shape: WeightShape, m_grid: tuple[int, ...]) -> tuple[int, ...]:
    """The M values a class is measured at on a shape (the MoE family: not below one token's
    rows, which no batch has)."""
    points = getattr(hooks_of(cls), "grid_for", None)
    return tuple(points(shape, m_grid)) if points is not None else tuple(m_grid)


def default_m_grid(library: Library, options: TuneOptions) -> tuple[int, ...]:
    """The M grid of a tune without --m: the tuned families' tuner M_GRID where they agree (the
    MoE family: its rows grid, which its dispatch rounds rows to), else DEFAULT_M_GRID."""
    grids = {tuple(getattr(hooks_of(cls), "M_GRID", DEFAULT_M_GRID))
             for cls in classes_of(library, options)}
    return grids.pop() if len(grids) == 1 else DEFAULT_M_GRID


def check_plan(library: Library, options: TuneOptions) -> None:
    """Refuse, before anything is measured or written, a tune that cannot give a table: no shape
    any class is measured on, an M grid a family's dispatch would not look up (its tuner's
    check_m_grid), or --select for a family whose rules are not over m (the pruned manifest's
    rules are M buckets)."""
    classes = classes_of(library, options)
    for cls in classes:
        check = getattr(hooks_of(cls), "check_m_grid", None)
        problem = check(options.m_grid) if check is not None else None
        if problem:
            raise GemmgenError(f"--m: {problem}")
    if not any(shapes_for(cls, options.shapes) for cls in classes):
        families = sorted({registry.for_op(c[0]).name for c in classes})
        raise GemmgenError(
            f"none of the {len(options.shapes)} shapes is measured by library {library.name!r} "
            f"({', '.join(families)}): the MoE family's tuner takes expert layers (shape files "
            "naming experts and top_k, e.g. moe_mixtral_8x7b), the other families linear layers")
    if options.select:
        for cls in classes:
            family = registry.for_op(cls[0])
            if family.variables[:3] != ("m", "n", "k"):
                raise GemmgenError(f"--select writes a pruned manifest with rules over m; the "
                                   f"{family.name} family's rules are over "
                                   f"{', '.join(family.variables)}: tune it without --select")


def time_candidate(candidate: Candidate, problem, cls: MeasuredClass) -> float:
    """GPU µs per call of one candidate (the family makes the call)."""
    return hooks_of(cls).time_candidate(candidate, problem)


def classes_of(library: Library, options: TuneOptions) -> list[MeasuredClass]:
    """The classes to measure, chosen per tunable family from the classes the library builds."""
    by_family: dict[str, set[MeasuredClass]] = {}
    for k in library.kernels.values():
        by_family.setdefault(k.spec.family, set()).add(k.spec.dispatch_class)
    classes: list[MeasuredClass] = []
    untunable: list[str] = []
    unselected: list[MeasuredClass] = []  # tunable classes that --dtypes left out
    for name, built in sorted(by_family.items()):
        family = registry.get(name)
        reasons = []
        if family.tuner is None:
            reasons.append("no tuner hooks yet")
        if not family.has_tables:
            reasons.append(f"dispatch variables {', '.join(family.variables)}: no (m, n, k) "
                           "of a tuned table")
        if reasons:
            untunable.append(f"{name} ({'; '.join(reasons)})")
            continue
        try:
            picked = family.tuner.classes(built, options)
        except GemmgenError as exc:
            raise GemmgenError(f"library {library.name!r} {exc}") from None
        classes += picked
        unselected += sorted(set(built) - set(picked))
    if not classes and options.dtypes and unselected:
        raise GemmgenError(f"--dtypes {' '.join(options.dtypes)} selects none of the classes library "
                           f"{library.name!r} builds: "
                           f"{'; '.join(' x '.join(c[1:]) for c in unselected)} (input dtypes "
                           "first; `gemmgen tune --help` lists the names --dtypes takes)")
    if not classes:
        raise GemmgenError(f"library {library.name!r} has no kernels of a tunable op family: "
                           f"{'; '.join(untunable)}")
    return classes


def kernels_of(library: Library, cls: MeasuredClass) -> list[Kernel]:
    ranks = kernel_rank(library)
    return sorted((k for k in library.kernels.values() if k.spec.dispatch_class == cls),
                  key=lambda k: ranks[k.name])


def store_path(library: Library, options: TuneOptions) -> Path:
    """The library's measurement store for this GPU and seed; a family whose tuner names its
    measuring method (`MEASURE_METHOD`, a tuner attribute) gets it in the file name, so a store
    timed another way is never resumed as if it were this method's."""
    gpu, sms = gpu_identity()
    slug = "".join(ch if ch.isalnum() else "_" for ch in gpu).strip("_")
    hooks = hooks_of((next(iter(library.kernels.values())).spec.op,)) if library.kernels else None
    method = f"-{hooks.MEASURE_METHOD}" if getattr(hooks, "MEASURE_METHOD", None) else ""
    retune = "-retune" if options.retune else ""  # re-timed afresh, not taken from a full tune's store
    return settings.build_dir() / "tune" / (f"{library.name}-{library.kernel_set}{method}-{slug}-"
                                            f"{sms}sm-seed{options.seed}{retune}.jsonl")


def _progress(total: int, position: int = 0, desc: str = "tune", disable: bool = False):
    from tqdm import tqdm  # progress bar with rate and ETA
    return tqdm(total=total, position=position, desc=desc, unit="point", dynamic_ncols=True,
                disable=disable)


def measure(library: Library, store: Store, options: TuneOptions, shapes: list[WeightShape],
            position: int = 0, progress: bool = True) -> None:
    """Time every candidate at every point not already in the store (`progress`: a bar); with
    --retune also the table's pick at each point, knobs and all (`previous_picks`)."""
    classes = classes_of(library, options)
    sm_count = gpu_identity()[1]
    previous = previous_picks(library, options)
    bar = _progress(sum(len(grid_for(cls, s, options.m_grid)) for cls in classes
                        for s in shapes_for(cls, shapes)),
                    position, f"tune {torch.cuda.current_device()}", disable=not progress)
    for cls in classes:
        kernels = kernels_of(library, cls)
        hooks = hooks_of(cls)
        # the knob settings of the fastest few are timed, and of the kernels the family says are
        # worth them whatever their first pass (`knobs_always_tried`, an optional hook)
        always = getattr(hooks, "knobs_always_tried", None)
        # how far from the fastest a first-pass time is re-timed side by side, where the family
        # wants more than TIE_WINDOW x tolerance (`retime_window`, an optional hook)
        retime_window = getattr(hooks, "retime_window", None)
        for shape in shapes_for(cls, shapes):
            for m in grid_for(cls, shape, options.m_grid):
                problem = None

                def timed(c: Candidate) -> float:
                    nonlocal problem
                    stored = store.get(cls, shape.n, shape.k, m, c)
                    if stored is not None:
                        return math.inf if stored.us is None else stored.us
                    try:
                        if problem is None:
                            problem = make_problem(cls, m, shape, seed=options.seed)
                        us, error = time_candidate(c, problem, cls), None
                    except (GemmgenError, ValueError) as exc:  # cannot implement this problem
                        us, error = None, str(exc)
                    except torch.OutOfMemoryError as exc:  # e.g. split-K partials of a huge problem
                        torch.cuda.empty_cache()
                        us, error = None, f"out of memory: {str(exc).splitlines()[0]}"
                    store.put(Record(cls, shape.n, shape.k, m, c.kernel, c.raster,
                                     c.swizzle, c.split_k, us, error))
                    return math.inf if us is None else us

                first = {k.name: timed(Candidate.of(k)) for k in kernels}
                fastest = sorted((t, k.name) for k in kernels if math.isfinite(t := first[k.name]))
                chosen = [name for _, name in fastest[:options.knob_top]]
                chosen += [name for _, name in fastest[options.knob_top:] if always is not None
                           and always(library.kernels[name], m, shape.n, sm_count)]
                for name in chosen:
                    kernel = library.kernels[name]
                    if not hooks.knobs_worth_trying(kernel, m, shape.n, sm_count):
                        continue  # e.g. raster/swizzle below one wave of tiles
                    for c in hooks.knob_variants(kernel)[1:]:
                        timed(c)
                incumbents = [c for c in previous(cls, shape.n, shape.k, m) if math.isfinite(timed(c))]
                window = retime_window(m) if retime_window is not None else None

                def unsettled_ties() -> list[Candidate]:
                    """The near-ties (and a re-tuned table's pick, however far behind its first
                    pass: it loses its point only side by side), when one of them has not been
                    re-timed side by side."""
                    ties = near_ties(store, cls, shape.n, shape.k, m, options.tolerance, window)
                    ties += [c for c in incumbents if c not in ties]
                    settled_all = all(store.get(cls, shape.n, shape.k, m, c).settled for c in ties)
                    return [] if len(ties) < 2 or settled_all else ties

                # Re-timing moves the fastest time, which can bring a first-pass time into the
                # window: settle those too, so that a resumed tune finds the point settled.
                for _ in range(SETTLE_PASSES):
                    ties = unsettled_ties()
                    if not ties:
                        break
                    try:
                        if problem is None:
                            problem = make_problem(cls, m, shape, seed=options.seed)
                        settled = retime_side_by_side(ties, lambda c: time_candidate(c, problem, cls))
                    except (GemmgenError, ValueError, torch.OutOfMemoryError):
                        break  # keep the first-pass times; retried on resume
                    for c, us in settled.items():
                        store.put(Record(cls, shape.n, shape.k, m, c.kernel, c.raster, c.swizzle,
                                         c.split_k, us, None, settled=True))
                else:
                    if unsettled_ties():
                        log.info("gemmgen tune: %s n=%d k=%d m=%d: near-ties still unsettled after "
                                 "%d re-timings (a resumed tune re-times them)", " ".join(cls),
                                 shape.n, shape.k, m, SETTLE_PASSES)
                del problem
                bar.update(1)
    bar.close()


def previous_picks(library: Library, options: TuneOptions):
    """(class, n, k, m) -> the candidates a tune times besides its own: with --retune, the pick of
    the table it re-times at that point (its knobs may be ones the knob pass leaves out), re-timed
    side by side with the near-ties, so that the re-tune weighs the pick it may replace without
    the clock's drift between one-pass times; otherwise none."""
    if not options.retune:
        return lambda cls, n, k, m: []
    table = load_table(options.retune)

    def picks(cls: MeasuredClass, n: int, k: int, m: int) -> list[Candidate]:
        ctable = table.classes.get(tuple(cls))
        hit = ctable.lookup(m, n, k) if ctable is not None else None
        if hit is None or not hit.exact_shape or hit.bucket.kernel not in library.kernels:
            return []
        return [_candidate_of(hit.bucket)]
    return picks


TIE_WINDOW = 3  # near-ties: within TIE_WINDOW × tolerance of the fastest get re-timed
RETIME_ROUNDS = 5
SETTLE_PASSES = 3  # re-timings of one point at most, each of the candidates then in the window


def near_ties(store: Store, cls: MeasuredClass, n: int, k: int, m: int, tolerance: float,
              window: float | None = None) -> list[Candidate]:
    """The candidates of one point whose times lie within TIE_WINDOW × tolerance of the fastest
    (or within `window`, a fraction, where that is wider).

    NOTES: one pass times each candidate once, minutes apart from the others; on these GPUs the
    clock (power limit) moves more than the tie tolerance over that span, so two tunes could
    order near-equal kernels differently. Re-timing the near-ties side by side, interleaved,
    takes that drift out of the comparison the winner is picked from."""
    row = store.times(cls, [(n, k)]).get((n, k, m), {})
    finite = {c: t for c, t in row.items() if math.isfinite(t)}
    if not finite:
        return []
    best = min(finite.values())
    spread = max(TIE_WINDOW * tolerance, window or 0.0)
    return sorted(c for c, t in finite.items() if t <= best * (1 + spread))


def retime_rounds(count: int, rounds: int = RETIME_ROUNDS) -> int:
    """The rounds `retime_side_by_side` runs for `count` candidates: `rounds` rounded up to a
    multiple of `count`, so that the rotating order puts each candidate in each position of a
    round equally often (a clock drifting within a round favours no one)."""
    return -(-rounds // max(1, count)) * max(1, count)


def retime_side_by_side(candidates: list[Candidate], time_one, rounds: int = RETIME_ROUNDS) -> dict:
    """µs of each candidate from `retime_rounds(len(candidates), rounds)` interleaved rounds (the
    order rotates each round, so each candidate runs first equally often): its median over the
    rounds of its time / the round's geometric mean, times the median round's geometric mean.

    NOTES: a plain median per candidate fails when the clock steps between rounds, as it does
    when a large GEMM heats the GPU (an H200 at 8192 rows: 15% slower within a second,
    benchmarks/RESULTS.md, session 30): the median then falls in the round of the step, where
    the candidates timed before it are fast and those after it slow, and a 4% slower kernel can
    come out ahead. Dividing by each round's mean compares the candidates within a round, where
    the clock is the same for all of them."""
    samples: dict[Candidate, list[float]] = {c: [] for c in candidates}
    rounds = retime_rounds(len(candidates), rounds)
    for r in range(rounds):
        order = candidates[r % len(candidates):] + candidates[:r % len(candidates)]
        for c in order:
            samples[c].append(time_one(c))
    means = [math.exp(statistics.fmean(math.log(samples[c][r]) for c in candidates)) for r in range(rounds)]
    scale = statistics.median(means)
    return {c: statistics.median(t / mean for t, mean in zip(values, means)) * scale
            for c, values in samples.items()}


def build_tables(library: Library, store: Store, options: TuneOptions,
                 allowed: set[str] | None = None) -> list[ClassTable]:
    """Winners per point → M buckets per shape, for every tuned class (only `allowed` kernels)."""
    rank = candidate_rank(library)
    grid = set(options.m_grid)
    tables = []
    for cls in classes_of(library, options):
        wanted = {(s.n, s.k) for s in shapes_for(cls, options.shapes)}
        if not wanted:
            continue  # e.g. an MoE class when only linear layers were tuned
        times = store.times(cls, wanted)
        entries = []
        for n, k in sorted(wanted):
            winners = {}
            for m in grid:
                row = {c: t for c, t in times.get((n, k, m), {}).items()
                       if allowed is None or c.kernel in allowed}
                if row and any(math.isfinite(t) for t in row.values()):
                    winners[m] = selection.pick(row, rank, tie_tolerance(store, cls, n, k, m, row,
                                                                         options))
            if not winners:
                raise GemmgenError(f"no measurement for {' '.join(cls)} (n={n}, k={k}); run the tune first")
            buckets = tuple(Bucket(m_max, c.kernel, c.knobs) for m_max, c in selection.buckets(winners))
            entries.append(ShapeEntry(n, k, buckets))
        model = fit_cost_model(library, cls, times, grid, allowed)
        tables.append(ClassTable(tuple(cls), tuple(entries), model=model))
    return tables


def tie_tolerance(store: Store, cls: MeasuredClass, n: int, k: int, m: int, row: dict,
                  options: TuneOptions) -> float:
    """The tie tolerance of one point: `options.settled_tolerance` when every candidate within
    `options.tolerance` of the fastest was re-timed side by side with the others (settled), else
    `options.tolerance` (one-pass times minutes apart, with the clock's drift between them)."""
    finite = {c: t for c, t in row.items() if math.isfinite(t)}
    best = min(finite.values(), default=math.inf)
    near = [c for c, t in finite.items() if t <= best * (1 + options.tolerance)]
    if len(near) > 1 and all(store.get(cls, n, k, m, c).settled for c in near):
        return options.settled_tolerance
    return options.tolerance


def fit_cost_model(library: Library, cls: MeasuredClass, times: dict, grid: set[int],
                   allowed: set[str] | None = None) -> CostModel | None:
    """The class's cost model (gemmgen/tuning/cost_model.py): each kernel's µs with its
    manifest knobs at every tuned point, and its coefficients fitted to them. None when the
    family has no cost features."""
    if registry.for_op(cls[0]).cost_feature_set is None:
        return None
    in_grid = {point: row for point, row in times.items() if point[2] in grid}
    return model_from_times(library, cls, manifest_knob_times(library, cls, in_grid, allowed))


def manifest_knob_times(library: Library, cls: MeasuredClass, times: dict,
                        allowed: set[str] | None = None) -> dict[tuple[int, int, int], dict[str, float]]:
    """{(n, k, m): {kernel: µs as a table stores it}} of each kernel of the class (only `allowed`
    ones) timed with its manifest knobs in `times` (store rows); points where none ran are left out."""
    measured: dict[tuple[int, int, int], dict[str, float]] = {}
    for kernel in kernels_of(library, cls):
        if allowed is not None and kernel.name not in allowed:
            continue
        default = Candidate.of(kernel)
        for point, row in times.items():
            if math.isfinite(row.get(default, math.inf)):
                measured.setdefault(point, {})[kernel.name] = stored_time(row[default])
    return measured


def model_from_times(library: Library, cls: MeasuredClass,
                     measured: dict[tuple[int, int, int], dict[str, float]]) -> CostModel | None:
    """A cost model fitted to `measured` ((n, k, m) -> kernel name -> µs with its manifest
    knobs), for the kernels of `library` among them; None when the family has no cost features
    or no kernel is left."""
    family = registry.for_op(cls[0])
    if family.cost_feature_set is None:
        return None
    return cost_model.fit_for_family(family, library.kernels, gpu_identity()[1], measured,
                                     [kernel.name for kernel in kernels_of(library, cls)])


def metadata(library: Library, options: TuneOptions, kernel_set: str,
             kernels: set[str] | None = None) -> dict:
    """The table's metadata; `kernels` (default: the library's) is the kernel set `kernel_set`
    hashes, listed so that a table can tell exactly which kernels a later manifest added."""
    gpu, sms = gpu_identity()
    try:
        from importlib.metadata import version
        cutlass = version("nvidia-cutlass")
    except Exception:
        cutlass = "unknown"
    return {"library": library.name, "arch": library.arch, "kernel_set": kernel_set, "gpu": gpu,
            "sm_count": sms, "cuda": str(torch.version.cuda or "unknown"), "cutlass": cutlass,
            "gemmgen": __version__, "torch": str(torch.__version__),
            "shapes": options.shape_sources or sorted({s.model for s in options.shapes}),
            "m_grid": list(options.m_grid), "tie_tolerance": options.tolerance,
            "settled_tie_tolerance": options.settled_tolerance,
            "kernels": sorted(kernels) if kernels is not None else sorted(library.kernels)}


def manifest_of(library: Library) -> Path:
    return Path(next(iter(library.kernels.values())).spec.origin.file).resolve()


def _header(library: Library, options: TuneOptions, what: str,
            tables: list[ClassTable] = ()) -> list[str]:
    families = sorted({registry.for_op(t.key[0]).name for t in tables})
    counts = [f"m counts {registry.get(f).table_m} ({f} classes)" for f in families
              if registry.get(f).table_m != "M"]
    return [f"{what} for library {library.name} ({library.arch}), written by `gemmgen tune`.",
            f"Command: {options.command}" if options.command else "", *counts,
            "Do not edit: re-run `gemmgen tune` on the target GPU; `gemmgen build` publishes it."]


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` so that a reader (or `gemmgen build`, which publishes the table)
    sees the old file or the whole new one, never a table cut at a line boundary: a temporary in
    the same folder, flushed and fsynced, then os.replace. The fsync costs a few ms for a file of
    a few KB written once per tune, and keeps a power loss from leaving an empty table behind the
    rename (not needed against a killed process, which os.replace already covers)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_table(library: Library, store: Store, options: TuneOptions,
                extending: TunedTable | None = None, updating: TunedTable | None = None) -> Path:
    """Write the table of `options.shapes` (with `extending`, the table `--extend` names as
    `table_to_extend` checked it: that table with the new shapes added; with `updating`, the
    table `--update` names as `table_to_update` checked it: its measured classes replaced)."""
    if extending is not None:
        return extend_table(library, store, options, extending)
    if updating is not None:
        return update_table(library, store, options, updating)
    path = Path(options.out) if options.out else table_path_for(manifest_of(library), gpu_identity()[0])
    tables = build_tables(library, store, options)
    text = render_table(metadata(library, options, library.kernel_set), tables,
                        [h for h in _header(library, options, "Tuned dispatch table", tables) if h])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return path


def table_to_extend(library: Library, options: TuneOptions) -> TunedTable:
    """The table `--extend` names, checked to be one this tune can add to: tuned for this
    library's kernel set on this GPU, on the M grid of this tune (default: its own). Sets
    options.m_grid to the table's grid when none was given, and drops from options.shapes
    the (N, K) the table lists for every class this tune measures (they are kept as tuned)."""
    table = _checked_table("--extend", library, options)
    path = Path(options.extend)
    meta = table.metadata
    if meta["kernel_set"] != library.kernel_set:
        raise GemmgenError(f"--extend {path}: tuned for kernel set {meta['kernel_set']}, the library has "
                           f"{library.kernel_set} (the manifest changed): its times would mix two kernel "
                           "sets; re-tune it whole (`gemmgen tune --fresh`), or the changed classes "
                           "alone (`--update`)")
    measured = [tuple(cls) for cls in classes_of(library, options)]
    listed = [{(s.n, s.k) for s in table.classes[c].shapes} if c in table.classes else set()
              for c in measured]
    kept = [s for s in options.shapes if not all((s.n, s.k) in shapes for shapes in listed)]
    skipped = sorted({f"{s.n}x{s.k}" for s in options.shapes} - {f"{s.n}x{s.k}" for s in kept})
    if skipped:
        _say(f"the table already lists {', '.join(skipped)}: kept as tuned")
    if not kept:
        raise GemmgenError(f"--extend {path}: it lists every shape given; nothing to add")
    options.shapes = kept
    return table


def _checked_table(flag: str, library: Library, options: TuneOptions) -> TunedTable:
    """The table `flag` (--extend, --update, --retune) names, checked to be of this library and
    GPU and of this tune's M grid (options.m_grid defaults to the table's)."""
    path = Path(getattr(options, flag.lstrip("-")))
    if not path.is_file():
        raise GemmgenError(f"{flag} {path}: no such table")
    table = load_table(path)
    meta = table.metadata
    if meta["library"] != library.name:
        raise GemmgenError(f"{flag} {path}: a table of library {meta['library']!r}, this tune measures "
                           f"{library.name!r}")
    if table.gpu != tuple(gpu_identity()):
        raise GemmgenError(f"{flag} {path}: measured on {table.gpu[0]} ({table.gpu[1]} SMs), this GPU is "
                           f"{gpu_identity()[0]} ({gpu_identity()[1]} SMs)")
    grid = tuple(int(m) for m in meta.get("m_grid") or ())
    if options.m_grid and grid and tuple(options.m_grid) != grid:
        raise GemmgenError(f"{flag} {path}: tuned on the M grid {','.join(map(str, grid))}; --m "
                           f"{','.join(map(str, options.m_grid))} would give its shapes other buckets "
                           "(leave --m out to use the table's)")
    options.m_grid = tuple(options.m_grid or grid)
    return table


def table_to_update(library: Library, options: TuneOptions) -> TunedTable:
    """The table `--update` names, checked to be one whose classes this tune may replace while it
    keeps the others: of this library and GPU, on this tune's M grid, listing the kernel set it
    was tuned for; every kernel the library gained since is of a class this tune measures (a
    kept class would not know it), every kernel a kept class names still exists, and the tune's
    shapes cover every shape the table lists for the classes it replaces."""
    table = _checked_table("--update", library, options)
    path = options.update
    measured = {tuple(cls) for cls in classes_of(library, options)}
    listed = set(table.metadata.get("kernels") or ())
    if not listed:
        raise GemmgenError(f"--update {path}: the table does not list the kernels it was tuned for (an "
                           "older gemmgen wrote it): re-tune it whole")
    new = Counter(k.spec.dispatch_class for name, k in library.kernels.items() if name not in listed)
    unmeasured = sorted(set(new) - measured)
    if unmeasured:
        names = ", ".join(f"{_describe(c)} ({new[c]} new)" for c in unmeasured)
        raise GemmgenError(f"--update {path}: the library has kernels the table was not tuned with in "
                           f"classes this tune does not measure: {names}; measure them too (--dtypes) "
                           "or re-tune the table whole")
    for cls in sorted(measured & set(table.classes)):
        given = {(s.n, s.k) for s in shapes_for(cls, options.shapes)}
        missing = sorted({(s.n, s.k) for s in table.classes[cls].shapes} - given)
        if missing:
            raise GemmgenError(f"--update {path}: it lists {', '.join(f'{n}x{k}' for n, k in missing)} "
                               f"for {_describe(cls)}, which this tune "
                               "would drop: give their shape files too (--shapes)")
    kept = [c for key, c in table.classes.items() if key not in measured]
    named = {b.kernel for c in kept for s in c.shapes for b in s.buckets}
    named |= {name for c in kept if c.model is not None for name in c.model.coef}
    gone = sorted(named - set(library.kernels))
    if gone:
        raise GemmgenError(f"--update {path}: classes it keeps name kernels the library no longer has "
                           f"({', '.join(gone)}): measure those classes too (--dtypes) or re-tune whole")
    return table


def table_to_retune(library: Library, options: TuneOptions) -> TunedTable:
    """The table `--retune` names, checked to be one whose points this tune may re-time: of this
    library, GPU and kernel set (a kernel new since the table would be timed at the re-timed
    points alone), --m a subset of its M grid (default: the whole grid), --shapes (default:
    every shape it lists for the measured classes) among the shapes it lists. Sets
    options.m_grid to the M values re-timed and options.shapes to the shapes."""
    wanted_m, options.m_grid = tuple(options.m_grid), ()
    table = _checked_table("--retune", library, options)  # options.m_grid: the table's grid
    path, grid = options.retune, options.m_grid
    off_grid = sorted(set(wanted_m) - set(grid))
    if off_grid:
        raise GemmgenError(f"--retune {path}: --m {','.join(map(str, off_grid))} is not on the table's M "
                           f"grid ({','.join(map(str, grid))}): a re-tune re-times points the table has "
                           "buckets for; re-tune it whole to change its grid")
    options.m_grid = wanted_m or grid
    if table.metadata["kernel_set"] != library.kernel_set:
        raise GemmgenError(f"--retune {path}: tuned for kernel set {table.metadata['kernel_set']}, the library "
                           f"has {library.kernel_set} (the manifest changed): its other points never saw "
                           "the new kernels; re-tune the changed classes whole (`--update`)")
    classes = [cls for cls in classes_of(library, options) if cls in table.classes]
    if not classes:
        raise GemmgenError(f"--retune {path}: the table has none of the classes this tune measures "
                           f"({'; '.join(_describe(c) for c in classes_of(library, options))})")
    listed = {(s.n, s.k) for cls in classes for s in table.classes[cls].shapes}
    if options.shapes:
        unlisted = sorted({(s.n, s.k) for s in options.shapes} - listed)
        if unlisted:
            raise GemmgenError(f"--retune {path}: it does not list {', '.join(f'{n}x{k}' for n, k in unlisted)} "
                               "for the classes this tune measures; add shapes with --extend")
        return table
    options.shapes = [WeightShape(f"n{n}_k{k}", n, k, f"table {Path(path).name}", str(path))
                      for n, k in sorted(listed)]
    for cls in classes:
        if not shapes_for(cls, options.shapes):
            raise GemmgenError(f"--retune {path}: the table keeps only (N, K) of its shapes, and the tuner "
                               f"of {_describe(cls)} needs more of a shape (e.g. an MoE layer's experts "
                               "and top-k): give their shape files (--shapes)")
    return table


def retune_table(library: Library, store: Store, options: TuneOptions, old: TunedTable) -> tuple[Path, list[str]]:
    """Write `old` (the table `options.retune` names) with the picks at the re-timed points (its
    shapes in options.shapes, at options.m_grid, of the classes this tune measures) chosen from
    this tune's times (the old pick kept where it ties with the fastest: a tie moves no pick)
    and every other point's pick kept; each shape's buckets are merged again over the table's
    grid, and a re-tuned class's cost model is fitted to its stored times with the re-timed
    points' replaced. Returns the path and one line per point whose pick changed.

    NOTES: the old pick wins ties because a re-tune otherwise churns. At large M on an H200 many
    tiles and knob settings run within 1-3% of each other: re-timing 56 int8 points of the W8A8
    table by the plain rank changed 36 picks, with the old pick defending its point side by side
    27, and the benchmark ran either table within its spread of the old one (0.2% and 0.5%,
    benchmarks/RESULTS.md, session 60)."""
    measured = set(classes_of(library, options))
    rank = candidate_rank(library)
    grid = tuple(int(m) for m in old.metadata["m_grid"])
    retimed, changed, kept_old = 0, [], []
    classes = []
    for key, ctable in old.classes.items():
        given = {(s.n, s.k): s for s in shapes_for(key, options.shapes)} if key in measured else {}
        if not given.keys() & {(s.n, s.k) for s in ctable.shapes}:
            classes.append(ctable)
            continue
        times = store.times(key, set(given))
        model_times = {point: dict(row) for point, row in (ctable.model.times if ctable.model else {}).items()}
        retimed_rows = {}
        entries = []
        for entry in ctable.shapes:
            n, k = entry.n, entry.k
            if (n, k) not in given:
                entries.append(entry)
                continue
            winners = {m: _candidate_of(entry.bucket_for(m)) for m in grid}
            for m in grid_for(key, given[(n, k)], options.m_grid):  # the points measure() timed
                row = times.get((n, k, m), {})
                if not any(math.isfinite(t) for t in row.values()):
                    kept_old.append(f"{_describe(key)} n={n} k={k} m={m}")
                    continue
                retimed += 1
                incumbent = winners[m]  # a tie keeps it: a pick changes only for a measured gain
                new = selection.pick(row, lambda c, incumbent=incumbent: (c != incumbent, rank(c)),
                                     tie_tolerance(store, key, n, k, m, row, options))
                if new != incumbent:
                    before = row.get(incumbent, math.nan)
                    ratio = (f"{before / row[new]:.3f}x the new one's time" if math.isfinite(before)
                             else "not timed with its knobs")
                    changed.append(f"{_describe(key)} n={n} k={k} m={m}: {incumbent.label()} -> "
                                   f"{new.label()} (the old pick: {ratio})")
                winners[m] = new
                retimed_rows[(n, k, m)] = row
            entries.append(replace(entry, buckets=tuple(Bucket(m_max, c.kernel, c.knobs)
                                                        for m_max, c in selection.buckets(winners))))
        model_times.update(manifest_knob_times(library, key, retimed_rows))
        model = model_from_times(library, key, model_times) if ctable.model is not None else None
        classes.append(ClassTable(key, tuple(entries), model=model))
    if kept_old:
        _say(f"no candidate ran at {len(kept_old)} point(s), their picks kept: {'; '.join(kept_old)}")
    path = _rewrite_table(library, options, old, old.metadata, classes,
                          f"Re-tuned by: {options.command or 'gemmgen tune --retune'} (M "
                          f"{','.join(map(str, options.m_grid))}; {retimed} points re-timed, {len(changed)} "
                          f"picks changed; gemmgen {__version__}, torch {torch.__version__})")
    return path, changed


def _candidate_of(bucket: Bucket) -> Candidate:
    return Candidate(bucket.kernel, bucket.knobs.raster, bucket.knobs.swizzle, bucket.knobs.split_k_slices)


def update_table(library: Library, store: Store, options: TuneOptions, old: TunedTable) -> Path:
    """Write `old` (the table `options.update` names) with the classes this tune measured
    replaced by their new tables (to `options.out`, by default over the table itself,
    atomically); its other classes are kept as they are. The metadata names the library's
    kernel set: every kernel new since `old` is of a replaced class (table_to_update)."""
    new = build_tables(library, store, options)
    replaced = {t.key for t in new}
    tables = [c for key, c in old.classes.items() if key not in replaced] + new
    classes = "; ".join(_describe(key) for key in sorted(replaced))
    return _rewrite_table(library, options, old, metadata(library, options, library.kernel_set),
                          tables, f"Updated by: {options.command or 'gemmgen tune --update'} (re-tuned: "
                                  f"{classes}; gemmgen {__version__}, torch {torch.__version__})")


def _describe(cls: MeasuredClass) -> str:
    """A dispatch class in its family's words, for messages and headers."""
    return registry.for_op(cls[0]).describe_class(cls)


def _rewrite_table(library: Library, options: TuneOptions, old: TunedTable, meta: dict,
                   tables: list[ClassTable], note: str) -> Path:
    """Write `tables` as the table `old` rewritten, to `options.out` or by default over its file,
    atomically: `meta` with old's shape sources and this tune's, the old header's command lines
    and then `note`."""
    source = Path(old.path)
    sources = list(old.metadata.get("shapes") or [])
    meta = dict(meta, shapes=sources + [s for s in options.shape_sources if s not in sources])
    earlier = [h for h in _header_of(source) if h.startswith(_HISTORY)]
    header = [h for h in _header(library, options, "Tuned dispatch table", tables)
              if h and not h.startswith("Command:")]
    header[1:1] = [*earlier, note]
    path = Path(options.out) if options.out else source
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, render_table(meta, tables, header))
    return path


def merge_classes(library: Library, old: TunedTable, new: list[ClassTable]) -> list[ClassTable]:
    """`old`'s class tables with `new`'s shapes added (a shape in both: the new measurement),
    and each merged class's cost model fitted again to the times of both."""
    merged = dict(old.classes)
    for table in new:
        before = merged.get(table.key)
        if before is None:
            merged[table.key] = table
            continue
        shapes = {(s.n, s.k): s for s in before.shapes}
        shapes.update({(s.n, s.k): s for s in table.shapes})
        times = {point: dict(row) for point, row in (before.model.times if before.model else {}).items()}
        times.update((point, dict(row)) for point, row in (table.model.times if table.model else {}).items())
        model = model_from_times(library, table.key, times) if times else None
        merged[table.key] = ClassTable(table.key, tuple(shapes[key] for key in sorted(shapes)), model=model)
    return list(merged.values())


def extend_table(library: Library, store: Store, options: TuneOptions, old: TunedTable) -> Path:
    """Write `old` (the table `options.extend` names) with the shapes of this tune added (to
    `options.out`, by default over the table itself, atomically): its buckets and stored times
    are kept, not re-timed, and the cost model is fitted to the times of both."""
    tables = merge_classes(library, old, build_tables(library, store, options))
    return _rewrite_table(library, options, old, old.metadata, tables,
                          f"Extended by: {options.command or 'gemmgen tune --extend'} "
                          f"(gemmgen {__version__}, torch {torch.__version__})")


# The header lines that say how a table came to be, kept when it is rewritten
_HISTORY = ("Command:", "Extended by:", "Updated by:", "Re-tuned by:", "Merged:")


def _header_of(path: Path) -> list[str]:
    """The comment lines a table file starts with, without their '# ' (what `render_table`'s
    `header` writes)."""
    lines = Path(path).read_text().splitlines()
    head = lines[:next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))]
    return [line[2:] if line.startswith("# ") else line[1:] for line in head]


def refit_table(path: Path, out: Path | None = None, library_name: str | None = None,
                command: str | None = None) -> Path:
    """Rewrite a tuned table's cost models in the feature set this gemmgen computes, fitted to the
    times the table stores (nothing is timed; no GPU): for a table a gemmgen with other cost
    features wrote. Buckets, times and metadata are kept; the header says what was done (one
    `Refitted by:` line, the last refit's). The kernels' shapes come from the first library
    named like the table's (`library_name` overrides) that has every kernel of its models: the
    built one, else the shipped manifest's."""
    table = load_table(path)
    modelled = {key: ctable for key, ctable in table.classes.items() if ctable.model is not None
                and getattr(registry.for_op(key[0]), "cost_feature_set", None) is not None}
    if not modelled:
        raise GemmgenError(f"--refit {path}: the table has no cost model to refit (its op family has no "
                           "cost features, or the table was written without one)")
    needed = {name for ctable in modelled.values() for row in ctable.model.times.values() for name in row}
    library = _library_for_refit(library_name or table.metadata["library"], needed, path)
    sm_count = int(table.metadata["sm_count"])
    classes, sets = [], set()
    for key, ctable in table.classes.items():
        if key in modelled:
            family = registry.for_op(key[0])
            ctable = replace(ctable, model=cost_model.fit_for_family(family, library.kernels, sm_count,
                                                                     ctable.model.times))
            sets.add(family.cost_feature_set)
        classes.append(ctable)
    header = [h for h in _header_of(path) if not h.startswith("Refitted by:")]
    at = max((i + 1 for i, h in enumerate(header) if h.startswith(_HISTORY)),
             default=len(header))
    header.insert(at, f"Refitted by: {command or 'gemmgen tune --refit'} (gemmgen {__version__}): cost "
                      f"model feature set {', '.join(sorted(sets))}, fitted to the stored times")
    target = Path(out) if out else path
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, render_table(table.metadata, classes, header))
    return target


def _library_for_refit(name: str, kernels: set[str], table_path: Path) -> Library:
    """The first library called `name` that has every one of `kernels` (their specs are all a
    refit needs; nothing runs): a built one, else the shipped manifest's."""
    from ..bindings.library import manifest_libraries
    try:
        built = list(libraries())
    except GemmgenError:  # nothing built
        built = []
    for library in built + list(manifest_libraries()):
        if library.name == name and kernels <= set(library.kernels):
            return library
    raise GemmgenError(f"--refit {table_path}: no built library {name!r} and no shipped manifest of it holds "
                       f"every kernel of the table's cost model ({len(kernels)}); build the manifest the "
                       "table was tuned for (a built library is looked up by the name --library gives)")


def _plain(node):
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def select_and_write(library: Library, store: Store, options: TuneOptions) -> str:
    """Prune each tuned family to the smallest config set within the thresholds; write the
    pruned manifest and its table to `select_dir`; return a report."""
    manifest_path = manifest_of(library)
    doc, _ = load_yaml(manifest_path)
    wanted = {(s.n, s.k) for s in options.shapes}
    kernel_of = library.kernels
    report = []
    kept_kernels: set[str] = set()
    tuned_families = {}
    for cls in classes_of(library, options):
        a = cls[1]  # the first class field (W8A8: the input dtype) labels the selection points
        for (n, k, m), row in store.times(cls, wanted).items():
            if m not in options.m_grid:
                continue
            for c, t in row.items():  # a class may be served by several families
                family = kernel_of[c.kernel].spec.origin.family
                tuned_families.setdefault(family, {}).setdefault((a, n, k, m), {})[c] = t
    for family, times in sorted(tuned_families.items()):
        def group_of(c: Candidate) -> str:
            return kernel_of[c.kernel].spec.origin.config

        lines = {kern.spec.origin.config: kern.spec.origin.line for kern in kernel_of.values()
                 if kern.spec.origin.family == family}
        chosen = selection.select_groups(times, group_of, lambda g: (lines[g], g))
        rules = selection.RuleTree.grow(times, group_of, lambda g: (lines[g], g), chosen.kept).rules()
        fam = next(f for f in doc["families"] if f["name"] == family)
        entries = fam["configs"]
        keep_lines = {lines[g] for g in chosen.kept}
        fam["configs"] = [_plain(c) for i, c in enumerate(entries) if entries.line_of(i) in keep_lines]
        for c, line in zip(fam["configs"], sorted(keep_lines)):
            c.setdefault("name", next(g for g in chosen.kept if lines[g] == line))
        fam["dispatch"] = [{"when": condition, "use": g} for condition, g in rules]
        kept_kernels |= {kern.name for kern in kernel_of.values()
                         if kern.spec.origin.family == family and kern.spec.origin.config in chosen.kept}
        where = "" if chosen.worst_point is None else f" at (a, n, k, m) = {chosen.worst_point}"
        report.append(f"family {family!r}: kept {len(chosen.kept)} of {len(lines)} configs "
                      f"({', '.join(chosen.kept)}); worst {chosen.worst:.3f} of the oracle{where}, "
                      f"geomean {chosen.geomean:.4f}")
    kept_kernels |= {kern.name for kern in kernel_of.values()
                     if kern.spec.origin.family not in tuned_families}
    out_dir = Path(options.select_dir) if options.select_dir else settings.build_dir() / "tune" / "pruned"
    out_dir.mkdir(parents=True, exist_ok=True)
    pruned_path = out_dir / manifest_path.name
    header = "".join(f"# {line}\n" for line in [
        f"Pruned by `gemmgen tune --select` from {manifest_path.name}: the smallest config set whose",
        f"best is >= {selection.MIN_RATIO:.0%} of the oracle at every tuned point and >= "
        f"{selection.MIN_GEOMEAN:.0%} in geomean;",
        "dispatch rules over m, n and k learned from the same measurements (select.RuleTree).", *report])
    write_atomic(pruned_path, header + yaml.safe_dump(_plain(doc), sort_keys=False,
                                                      default_flow_style=None, width=110))
    pruned_names = {spec.name for spec in expand(load_manifest(pruned_path))}
    table_text = render_table(metadata(library, options, kernel_set_hash(pruned_names), pruned_names),
                              build_tables(library, store, options, allowed=kept_kernels),
                              [h for h in _header(library, options, "Tuned table of the pruned manifest") if h])
    pruned_table = table_path_for(pruned_path, gpu_identity()[0])
    write_atomic(pruned_table, table_text)
    report.append(f"kernels: {len(library.kernels)} -> {len(pruned_names)}; wrote {pruned_path} "
                  f"and {pruned_table}")
    return "\n".join(report)


def cached_shapes(library: Library, known: list[WeightShape]) -> list[WeightShape]:
    """The (N, K) shapes tuning at first use recorded for this library on this GPU (timed or
    pending), less those in `known`."""
    from . import autotune
    cache = autotune.cache_for(library.name, gpu_identity())
    seen = {(s.n, s.k) for s in known}
    found = sorted({shape for shapes in cache.shapes().values() for shape in shapes} - seen)
    _say(f"{len(found)} shape(s) from the autotune cache {cache.path}")
    return [WeightShape(f"n{n}_k{k}", n, k, "autotune cache", str(cache.path)) for n, k in found]


def _worker(payload: str) -> None:
    """One GPU's share (python -m gemmgen.tuning.tune --worker JSON)."""
    spec = json.loads(payload)
    options = TuneOptions(**{**spec["options"], "shapes": [WeightShape(**s) for s in spec["options"]["shapes"]]})
    library = choose_library(options.library, options.family)
    store = Store(Path(spec["store"]), part=f"gpu{spec['index']}")
    measure(library, store, options, options.shapes[spec["index"]::spec["count"]], spec["index"])


def tune(options: TuneOptions) -> Path:
    """Measure (resuming), then write the table (and with --select the pruned manifest)."""
    if not torch.cuda.is_available():
        raise GemmgenError("gemmgen tune measures kernels on a GPU; no CUDA device is visible")
    library = choose_library(options.library, options.family)
    options.library = library.name
    rewrites = [flag for flag in ("extend", "update", "retune") if getattr(options, flag)]
    if len(rewrites) > 1:
        raise GemmgenError("--extend adds shapes to a table, --update replaces its measured classes, "
                           f"--retune re-times its points: one at a time (given: --{', --'.join(rewrites)})")
    if rewrites and options.select:
        raise GemmgenError(f"--{rewrites[0]} writes into a table; --select prunes the manifest: one at a time")
    if options.retune and options.from_cache:
        raise GemmgenError("--retune re-times shapes a table lists; --from-cache adds shapes (--extend): "
                           "one at a time")
    if options.from_cache:
        options.shapes = options.shapes + cached_shapes(library, options.shapes)
    if not options.shapes and not options.retune:
        raise GemmgenError("no shapes to tune: give --shapes, or --from-cache once tuning at first "
                           "use recorded some (gemmgen.autotune(), GEMMGEN_AUTOTUNE=1)")
    extending = updating = retuning = None
    if options.extend:
        extending = table_to_extend(library, options)
    if options.update:
        updating = table_to_update(library, options)
    if options.retune:
        retuning = table_to_retune(library, options)
    if not options.m_grid:
        options.m_grid = default_m_grid(library, options)
    check_plan(library, options)
    path = store_path(library, options)
    if options.fresh:
        for old in Store(path).siblings():
            old.unlink(missing_ok=True)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = ([d.strip() for d in visible.split(",") if d.strip()] if visible
               else [str(i) for i in range(torch.cuda.device_count())])[:torch.cuda.device_count()]
    if options.gpus is not None and not 1 <= options.gpus <= len(devices):
        raise GemmgenError(f"--gpus {options.gpus}: expected 1..{len(devices)} (the visible GPUs)")
    gpus = min(options.gpus or len(devices), len(options.shapes))
    _say(f"library {library.name} ({library.arch}), {len(options.shapes)} shapes x "
         f"{len(options.m_grid)} M values on {gpus} GPU(s); measurements in {path}")
    if gpus > 1:
        payload = {"options": {**asdict(options), "shapes": [asdict(s) for s in options.shapes]},
                   "store": str(path), "count": gpus}
        procs = [subprocess.Popen([sys.executable, "-m", "gemmgen.tuning.tune", "--worker",
                                   json.dumps({**payload, "index": i})],
                                  env={**os.environ, "CUDA_VISIBLE_DEVICES": devices[i]})
                 for i in range(gpus)]
        failed = [i for i, p in enumerate(procs) if p.wait() != 0]
        if failed:
            raise GemmgenError(f"tuning workers on GPU(s) {failed} failed; re-run to resume")
    else:
        measure(library, Store(path), options, options.shapes)
    store = Store(path)
    if retuning is not None:
        table, changed = retune_table(library, store, options, retuning)
        _say(f"the pick changed at {len(changed)} point(s)" + "".join(f"\n  {line}" for line in changed))
    else:
        table = write_table(library, store, options, extending, updating)
    _say(f"wrote {table}")
    if options.select:
        _say(select_and_write(library, store, options))
    return table


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        sys.exit("internal entry point: use `gemmgen tune`")
