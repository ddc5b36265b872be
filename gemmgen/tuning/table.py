"""The tuned dispatch table: its YAML schema, reading (file:line errors), writing, and lookup.

A table lives next to its manifest as `<manifest>.tuned.<gpu>.yaml`, one per GPU it was measured
on (`<manifest>.tuned.yaml` is read too); `gemmgen build` publishes them with the library and
dispatch consults the GPU's own (`table_for_gpu`) before the manifest's rules. It is keyed by
kernel name and carries the metadata that says where it was measured:

    format: 1
    metadata: {library, arch, kernel_set, gpu, sm_count, cuda, cutlass, gemmgen, torch, ...}
    tables:
      - op: scaled_mm
        a: int8
        d: bf16
        epilogue: ScaledEpilogueBias
        shapes:
          - n: 4096
            k: 4096
            buckets:                       # m <= m_max, first match; the last covers any m
              - {m_max: 16, kernel: <name>, raster: heuristic, swizzle: 1}

            model:                         # optional: for shapes the table does not list
              features: w8a8-tiles-1       # the op family's cost features (their version)
              kernels: [<name>, ...]
              coef: [[...], ...]           # per kernel: fitted cost-model coefficients
              times: [[n, k, m, µs, ...], ...]   # per tuned point: each kernel's µs (null: none)

The `model` section lets dispatch estimate every kernel's time on an (N, K) the table does not
list (gemmgen/tuning/cost_model.py) instead of taking the nearest listed shape's winner.

A table tuned for another kernel set (the manifest changed since `gemmgen tune`) is still used,
bucket by bucket (`fit_table`): a bucket is kept when it names a kernel the library still has (and
asks split_k only of a split-K kernel). A bucket that fails is not removed, which would hand its M
range to a neighbour that was never the winner there (buckets partition M: "m <= m_max, first
match; the last covers any m"), but left as a hole: `Bucket.dropped` says why, and the problems
whose m falls in it go to the manifest's rules; every other bucket keeps exactly the M range it
was measured for. The same holds through the nearest-shape fallback. Kernels the table does not
name (new configs) are never chosen by it; the rules still can.

Nothing here imports torch: the table is read at library load and looked up from Python.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

import yaml

from ..errors import ManifestError
from .cost_model import CostModel
from ..generator.kernel_config import RASTER_ORDERS, SWIZZLES, RuntimeKnobs
from ..generator.yaml_lines import LocatedDict, Reader

FORMAT = 2  # 2: optional `model` sections (format 1, without them, is read too)
_READABLE_FORMATS = (1, 2)
TABLE_SUFFIX = ".tuned.yaml"
TUNED_TABLE_FILE = "tuned.yaml"  # its name inside a published library folder
_METADATA_KEYS = ("library", "arch", "kernel_set", "gpu", "sm_count", "cuda", "cutlass", "gemmgen",
                  "torch", "shapes", "m_grid", "tie_tolerance", "settled_tie_tolerance", "kernels",
                  "buckets")
_REQUIRED_METADATA = {"library", "arch", "kernel_set", "gpu", "sm_count"}
_BUCKET_KEYS = {"m_max", "kernel", "raster", "swizzle", "split_k"}

ClassKey = tuple[str, ...]  # (op, *the op family's class fields), e.g. (op, a, d, epilogue)


def class_fields(op: str) -> tuple[str, ...]:
    """The keys naming a problem class of `op` in a table: `op` and its family's class fields
    (the W8A8 family: a, d, epilogue). Tables are keyed by the GEMM shape (n, k) and bucketed
    over m (what m counts is the family's: `OpFamily.table_point`, `table_m`)."""
    from .. import families as registry
    family = registry.for_op(op)
    if family is None:
        raise KeyError(op)
    return ("op", *family.spec_type.class_fields)


def gpu_slug(gpu: str) -> str:
    """A GPU name as a file-name part: 'NVIDIA H100 80GB HBM3' → 'h100-80gb-hbm3'."""
    words = gpu.removeprefix("NVIDIA ").lower()
    return "-".join("".join(ch if ch.isalnum() else " " for ch in words).split()) or "gpu"


def _stem(manifest_path: str | Path) -> str:
    return Path(manifest_path).name.removesuffix(".yaml").removesuffix(".yml")


def table_path_for(manifest_path: str | Path, gpu: str | None = None) -> Path:
    """`foo.yaml` → `foo.tuned.yaml` next to the manifest; with a GPU name, that GPU's table
    `foo.tuned.<gpu slug>.yaml` (e.g. foo.tuned.h200.yaml)."""
    path = Path(manifest_path)
    suffix = TABLE_SUFFIX if gpu is None else f".tuned.{gpu_slug(gpu)}.yaml"
    return path.with_name(_stem(path) + suffix)


def table_paths_for(manifest_path: str | Path) -> list[Path]:
    """The tuned tables beside a manifest: every per-GPU `foo.tuned.<gpu>.yaml` in name order,
    then `foo.tuned.yaml` (a table of no GPU in its name, e.g. from `gemmgen tune --out`)."""
    path = Path(manifest_path)
    plain = [table_path_for(path)] if table_path_for(path).exists() else []
    return sorted(path.parent.glob(glob_escape(_stem(path)) + ".tuned.*.yaml")) + plain


def glob_escape(text: str) -> str:
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in text)


def published_table_name(table_path: str | Path, manifest_path: str | Path) -> str:
    """The name a table of `table_paths_for` takes in a published library folder:
    `foo.tuned.yaml` → `tuned.yaml`, `foo.tuned.h200.yaml` → `tuned.h200.yaml`."""
    return Path(table_path).name.removeprefix(_stem(manifest_path) + ".")


def is_published_table(name: str) -> bool:
    return name == TUNED_TABLE_FILE or (name.startswith("tuned.") and name.endswith(".yaml"))


def kernel_set_hash(kernel_names: Iterable[str]) -> str:
    """Identity of a library's kernel set: a table measured on another set is not used."""
    return hashlib.sha256("\n".join(sorted(kernel_names)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Bucket:
    m_max: int
    kernel: str
    knobs: RuntimeKnobs
    line: int = 0
    dropped: str | None = None  # why, when fitted to a library it no longer fits (a hole)


@dataclass(frozen=True)
class ShapeEntry:
    n: int
    k: int
    buckets: tuple[Bucket, ...]
    line: int = 0

    def bucket_for(self, m: int) -> Bucket:
        """The first bucket with m <= m_max; past the last measured M, the last bucket."""
        index = bisect.bisect_left([b.m_max for b in self.buckets], m)
        return self.buckets[min(index, len(self.buckets) - 1)]


@dataclass(frozen=True)
class Hit:
    """What the table says for one problem: the bucket, and which measured shape it came from.
    A bucket with `dropped` set is a hole: the manifest's rules serve the problem."""

    bucket: Bucket
    shape: ShapeEntry
    exact_shape: bool

    @property
    def dropped(self) -> str | None:
        return self.bucket.dropped


@dataclass(frozen=True)
class ClassTable:
    key: ClassKey
    shapes: tuple[ShapeEntry, ...]
    line: int = 0
    model: CostModel | None = None  # for shapes not listed (the table's `model` section)
    _by_shape: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        self._by_shape.update({(s.n, s.k): s for s in self.shapes})

    def lookup(self, m: int, n: int, k: int) -> Hit | None:
        """Exact (N, K) if measured, else the nearest measured shape in log-space (ties: the
        smaller (n, k)); then the M bucket containing m. None when the class has no shape."""
        exact = self._by_shape.get((n, k))
        if exact is not None:
            return Hit(exact.bucket_for(m), exact, True)
        if not self.shapes:
            return None
        nearest = min(self.shapes, key=lambda s: (abs(math.log(s.n / n)) + abs(math.log(s.k / k)),
                                                   s.n, s.k))
        return Hit(nearest.bucket_for(m), nearest, False)


@dataclass(frozen=True)
class TableFit:
    """How a table tuned for another kernel set was fitted to a library's kernels (`fit_table`).

    `kernel_set`: the library's. `shapes_whole` of `shapes` shape entries kept every bucket,
    `shapes_gone` lost all of them; `buckets_kept` of `buckets`. `dropped`: (class key, shape
    entry, bucket) of each hole. `new_kernels`: the library's kernels added since the tune,
    None when that cannot be told (an older table that records its kernel set as a hash only);
    `vanished`: kernels the table names that the library no longer has; `new_classes_only`:
    every new kernel is of a dispatch class the table does not list (e.g. a new family entry),
    so no listed shape's choice would have differed."""

    kernel_set: str
    shapes: int
    shapes_whole: int
    shapes_gone: int
    buckets: int
    buckets_kept: int
    dropped: tuple[tuple[ClassKey, ShapeEntry, Bucket], ...]
    new_kernels: frozenset[str] | None
    vanished: frozenset[str]
    new_classes_only: bool = False

    @property
    def usable(self) -> bool:
        return self.buckets_kept > 0

    def summary(self) -> str:
        """'partial: 16 of 16 shape entries kept' or 'partial: 8 of 16 shape entries kept whole,
        8 in part'."""
        text = f"partial: {self.shapes_whole} of {self.shapes} shape entries kept"
        if self.dropped:
            partly = self.shapes - self.shapes_whole - self.shapes_gone
            text += f" whole, {partly} in part" + (f", {self.shapes_gone} not at all"
                                                    if self.shapes_gone else "")
        return text

    def note(self) -> str:
        """One line, e.g. 'tuned table partial: 16 of 16 shape entries kept; 8 new kernels are
        not in it: re-run `gemmgen tune` to measure them'."""
        text = "tuned table " + self.summary()
        if self.dropped:
            text += (f" ({self.buckets - self.buckets_kept} of {self.buckets} M buckets name kernels "
                     "that are gone: the rules serve those M ranges)")
        if self.new_kernels:
            count = len(self.new_kernels)
            if self.new_classes_only:
                return (text + f"; {count} new kernel{'s' if count != 1 else ''}, all of dispatch "
                        "classes it does not list: the manifest's rules serve them (`gemmgen "
                        "tune` measures them)")
            return (text + f"; {count} new kernel{'s are' if count != 1 else ' is'} not in it: "
                    "re-run `gemmgen tune` to measure them")
        if self.new_kernels is None:
            return (text + "; kernels added since the tune, if any, are not in it: re-run "
                    "`gemmgen tune` to measure them")
        if self.dropped:
            return text + "; re-run `gemmgen tune` to measure those ranges again"
        return text + " (only kernels it never chose were removed)"


@dataclass(frozen=True)
class TunedTable:
    path: str
    metadata: dict
    classes: dict[ClassKey, ClassTable]
    fit: TableFit | None = None  # set when fitted to another kernel set than it was tuned for

    def kernel_names(self) -> set[str]:
        return {b.kernel for c in self.classes.values() for s in c.shapes for b in s.buckets
                if not b.dropped}

    @property
    def partial(self) -> bool:
        return self.fit is not None

    @property
    def gpu(self) -> tuple[str, int]:
        return str(self.metadata["gpu"]), int(self.metadata["sm_count"])

    def mismatch(self, *, gpu: tuple[str, int] | None, kernel_set: str) -> str | None:
        """Why this table must not serve a library/GPU (None: it may). gpu: (name, SM count).
        A table fitted to `kernel_set` (`fit_table`) serves it, entry by entry."""
        meta = self.metadata
        fitted = self.fit is not None and self.fit.kernel_set == kernel_set
        if meta["kernel_set"] != kernel_set and not fitted:
            return (f"it was measured on another kernel set ({meta['kernel_set']}, the library has "
                    f"{kernel_set}): the manifest changed since `gemmgen tune`")
        if gpu is not None and (meta["gpu"], meta["sm_count"]) != tuple(gpu):
            return (f"it was measured on {meta['gpu']} ({meta['sm_count']} SMs), this GPU is "
                    f"{gpu[0]} ({gpu[1]} SMs)")
        return None


def table_for_gpu(tables: Sequence[TunedTable], gpu: tuple[str, int] | None,
                  kernel_set: str) -> tuple[TunedTable | None, str | None]:
    """(the table that serves `gpu` (name, SM count), a note on how it was chosen or why none
    was). The table measured on that GPU; without a GPU visible, the first; for a GPU no table
    was measured on, one measured on a GPU with the same SM count (the tables of a library share
    its arch): measured on the H100 and the H200, each one's table beat the manifest's rules on
    the other (benchmarks/RESULTS.md), so it is better evidence than the rules. Tables tuned for
    another kernel set serve only as fitted (`fit_table`)."""
    usable = [t for t in tables if t.mismatch(gpu=None, kernel_set=kernel_set) is None]
    if not usable:
        return None, (tables[0].mismatch(gpu=None, kernel_set=kernel_set) if tables else None)
    if gpu is None:
        note = None if len(usable) == 1 else (
            f"no GPU visible: using the table measured on {usable[0].gpu[0]} ({usable[0].path}) "
            f"of {len(usable)}")
        return usable[0], note
    exact = [t for t in usable if t.gpu == tuple(gpu)]
    if exact:
        return exact[0], None
    measured = ", ".join(f"{t.gpu[0]} ({t.gpu[1]} SMs)" for t in usable)
    alike = [t for t in usable if t.gpu[1] == gpu[1]]
    if alike:
        return alike[0], (f"no table was measured on {gpu[0]} ({gpu[1]} SMs); using the one "
                          f"measured on {alike[0].gpu[0]}, a GPU of the same arch and SM count "
                          f"({alike[0].path}). Run `gemmgen tune` on this GPU for its own")
    return None, (f"the tuned tables were measured on {measured}, this GPU is {gpu[0]} "
                  f"({gpu[1]} SMs)")


def _positive_int(reader: Reader, node: LocatedDict, key: str) -> int:
    value = node[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise reader.error(node, key, f"expected a positive integer, got {value!r}")
    return value


def _read_bucket(reader: Reader, node, previous: int, line: int) -> Bucket:
    b = reader.mapping(node, "bucket", _BUCKET_KEYS, ("m_max", "kernel"), line=line)
    m_max = _positive_int(reader, b, "m_max")
    if m_max <= previous:
        raise reader.error(b, "m_max", f"buckets must grow: {m_max} after {previous}")
    kernel = b["kernel"]
    if not isinstance(kernel, str) or not kernel:
        raise reader.error(b, "kernel", f"expected a kernel name, got {kernel!r}")
    raster = reader.choice(b, "raster", RASTER_ORDERS, "heuristic")
    swizzle = reader.choice(b, "swizzle", SWIZZLES, 1)
    split_k = b.get("split_k", 1)
    if not isinstance(split_k, int) or isinstance(split_k, bool) or not 1 <= split_k <= 64:
        raise reader.error(b, "split_k", f"expected an integer in [1, 64], got {split_k!r}")
    return Bucket(m_max, kernel, RuntimeKnobs(raster, swizzle, split_k), b.line)


def load_table(path: str | Path, known_kernels: Iterable[str] | None = None,
               split_k_kernels: Iterable[str] = (), *, if_kernel_set: str | None = None) -> TunedTable:
    """Read and validate a tuned table. With `known_kernels`, every kernel it names must be one,
    and a bucket's `split_k` other than 1 must name one of `split_k_kernels`; with
    `if_kernel_set`, only when the table was tuned for that kernel set (one parse where a caller
    checks a table of its own kernel set and fits one of another)."""
    path = str(path)
    reader = Reader(path)
    doc = reader.load("the tuned table", fast=True)  # a large machine-written file
    top = reader.top(doc, "the table", {"format", "metadata", "tables"}, ("format", "metadata", "tables"))
    if top["format"] not in _READABLE_FORMATS or isinstance(top["format"], bool):
        raise reader.error(top, "format", f"expected one of {', '.join(map(str, _READABLE_FORMATS))} "
                                          f"(re-run `gemmgen tune`), got {top['format']!r}")
    meta = reader.mapping(top["metadata"], "metadata", set(_METADATA_KEYS), _REQUIRED_METADATA,
                          line=top.line_of("metadata"))
    _positive_int(reader, meta, "sm_count")
    known = set(known_kernels) if known_kernels is not None else None
    if if_kernel_set is not None and meta["kernel_set"] != if_kernel_set:
        known = None
    splittable = set(split_k_kernels)
    classes: dict[ClassKey, ClassTable] = {}
    tables = reader.sequence(top, "tables")
    for ti, node in enumerate(tables):
        op = reader.mapping(node, "tables entry", {"op"} | (set(node) if isinstance(node, dict) else set()),
                            {"op"}, line=tables.line_of(ti))["op"]
        try:
            keys = class_fields(str(op))
        except KeyError:
            from .. import families as registry
            raise reader.error(node, "op", f"unknown op {op!r}; expected one of "
                                           f"{', '.join(registry.known_ops())}") from None
        c = reader.mapping(node, "tables entry", {*keys, "shapes", "model"}, {*keys, "shapes"})
        key = tuple(str(c[k]) for k in keys)
        if key in classes:
            raise reader.error(tables, "tables", f"{' '.join(key)} appears twice", ti)
        shapes: list[ShapeEntry] = []
        seen: dict[tuple[int, int], int] = {}
        shape_nodes = reader.sequence(c, "shapes")
        for si, snode in enumerate(shape_nodes):
            s = reader.mapping(snode, "shape", {"n", "k", "buckets"}, ("n", "k", "buckets"),
                               line=shape_nodes.line_of(si))
            n, k = _positive_int(reader, s, "n"), _positive_int(reader, s, "k")
            if (n, k) in seen:
                raise reader.error(s, "n", f"shape ({n}, {k}) already listed at line {seen[(n, k)]}")
            seen[(n, k)] = s.line
            buckets: list[Bucket] = []
            bucket_nodes = reader.sequence(s, "buckets")
            for bi, bnode in enumerate(bucket_nodes):
                bucket = _read_bucket(reader, bnode, buckets[-1].m_max if buckets else 0,
                                      bucket_nodes.line_of(bi))
                if known is not None and bucket.kernel not in known:
                    raise ManifestError(path, bucket.line, "kernel",
                                        f"{bucket.kernel} is not a kernel of this library "
                                        "(re-run `gemmgen tune` after changing the manifest)")
                if known is not None and bucket.knobs.split_k_slices != 1 and bucket.kernel not in splittable:
                    raise ManifestError(path, bucket.line, "split_k",
                                        f"{bucket.kernel} was built without split-K; expected 1 "
                                        f"(or no split_k), got {bucket.knobs.split_k_slices}")
                buckets.append(bucket)
            shapes.append(ShapeEntry(n, k, tuple(buckets), s.line))
        if "model" in c and top["format"] < 2:
            raise reader.error(c, "model", "a `model` section needs format 2 (re-run `gemmgen tune`)")
        model = _read_model(reader, c) if "model" in c else None
        if model is not None and known is not None:
            unknown = sorted(set(model.coef) - known)
            if unknown:
                raise reader.error(c, "model", f"names {unknown[0]}, which is not a kernel of this "
                                               "library (re-run `gemmgen tune` after changing the manifest)")
        classes[key] = ClassTable(key, tuple(shapes), c.line, model)
    # `buckets` (written by render_table; absent from older tables): a table cut short at a line
    # boundary still parses, so its bucket count is what tells.
    if "buckets" in meta:
        listed = sum(len(s.buckets) for t in classes.values() for s in t.shapes)
        expected = _positive_int(reader, meta, "buckets")
        if listed != expected:
            raise reader.error(meta, "buckets", f"the table lists {listed} buckets but its metadata "
                                                f"says {expected}: it was cut short or edited; "
                                                "re-run `gemmgen tune` (or restore the file)")
    return TunedTable(path, dict(meta), classes)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# An exponent without a decimal point (`2e+04`): a number to YAML 1.2, a string to PyYAML; gemmgen
# wrote such values before session 32, so the reader takes them as the numbers they spell.
_POINTLESS_EXPONENT = re.compile(r"[0-9]+[eE][+-]?[0-9]+")


def _numeric(value):
    """`value`, or the float a pointless-exponent string spells."""
    return float(value) if isinstance(value, str) and _POINTLESS_EXPONENT.fullmatch(value) else value


def _read_model(reader: Reader, node: LocatedDict) -> CostModel:
    """A class's `model` section: feature-set name, kernels, their coefficients and times."""
    model = reader.mapping(node["model"], "model", {"features", "kernels", "coef", "times"},
                           {"features", "kernels", "coef", "times"}, line=node.line_of("model"))
    features = model["features"]
    if not isinstance(features, str) or not features:
        raise reader.error(model, "features", f"expected a feature-set name, got {features!r}")
    kernels = reader.sequence(model, "kernels")
    if not kernels or not all(isinstance(k, str) and k for k in kernels) or len(set(kernels)) != len(kernels):
        raise reader.error(model, "kernels", "expected a list of distinct kernel names")
    coefs = [[_numeric(v) for v in c] if isinstance(c, list) else c
             for c in reader.sequence(model, "coef")]
    if len(coefs) != len(kernels) or not all(
            isinstance(c, list) and c and all(_number(v) and v >= 0 for v in c) for c in coefs):
        raise reader.error(model, "coef", f"expected {len(kernels)} lists of non-negative numbers, "
                                          "one per kernel")
    if len({len(c) for c in coefs}) != 1:
        raise reader.error(model, "coef", "expected as many coefficients for every kernel")
    times: dict[tuple[int, int, int], dict[str, float]] = {}
    rows = reader.sequence(model, "times")
    for index, row in enumerate(rows):
        row = [*row[:3], *map(_numeric, row[3:])] if isinstance(row, list) else row
        if (not isinstance(row, list) or len(row) != 3 + len(kernels)
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in row[:3])
                or not all(v is None or (_number(v) and v > 0) for v in row[3:])):
            raise reader.error(model, "times", f"expected [n, k, m, then {len(kernels)} positive "
                                               f"times or null], got {row!r}", index)
        if tuple(row[:3]) in times:
            raise reader.error(model, "times", f"point (n, k, m) = {tuple(row[:3])} listed twice", index)
        times[tuple(row[:3])] = {name: float(t) for name, t in zip(kernels, row[3:]) if t is not None}
    return CostModel(features, {name: tuple(map(float, c)) for name, c in zip(kernels, coefs)}, times)


def _why_dropped(b: Bucket, names: set[str], splittable: set[str]) -> str | None:
    if b.kernel not in names:
        return f"bucket m <= {b.m_max} (line {b.line}) names {b.kernel}, which is not a kernel of this library"
    if b.knobs.split_k_slices != 1 and b.kernel not in splittable:
        return (f"bucket m <= {b.m_max} (line {b.line}) asks split_k {b.knobs.split_k_slices} of "
                f"{b.kernel}, which is built without split-K")
    return None


_MAX_KERNEL_SET_GUESSES = 1024


def _new_kernels(table: TunedTable, specs: Sequence, names: set[str]) -> frozenset[str] | None:
    """The library's kernels added since the tune: exact when the table lists the kernel set it
    was tuned for (`kernels` in its metadata, written by `gemmgen tune` since session 3); for an
    older table, when the table's kernel-set hash can confirm a guess; else None. A config added to the manifest adds kernels for all its variants, none of
    which the table names: the guess is the kernels of some configs the table never names, and
    it counts only when (library - them + the vanished kernels the table names) hashes to the
    table's kernel set."""
    target = table.metadata["kernel_set"]
    listed = table.metadata.get("kernels")
    if isinstance(listed, list) and kernel_set_hash(map(str, listed)) == target:
        return frozenset(names - set(map(str, listed)))  # the tune wrote its kernel set: exact
    named = table.kernel_names()
    vanished = named - names
    groups: dict[tuple, set[str]] = {}
    for spec in specs:
        origin = getattr(spec, "origin", None)
        group = (origin.family, origin.config, origin.line) if origin is not None else (spec.name,)
        groups.setdefault(group, set()).add(spec.name)
    candidates = [frozenset(g) for _, g in sorted(groups.items(), key=lambda kv: str(kv[0]))
                  if not g & named]
    tried = 0
    for size in range(len(candidates) + 1):
        for combo in itertools.combinations(candidates, size):
            tried += 1
            if tried > _MAX_KERNEL_SET_GUESSES:
                return None
            added = frozenset().union(*combo)
            if kernel_set_hash((names - added) | vanished) == target:
                return added
    return None


def fit_table(table: TunedTable, specs: Sequence) -> TunedTable:
    """`table` fitted to a library's kernels (`specs`: each with `.name` and `.split_k`).

    A table tuned for this kernel set comes back as is. Otherwise every bucket that names a
    kernel of the library (split_k only on a split-K kernel) is kept; any other bucket becomes a
    hole (`Bucket.dropped`), whose M range the rules serve (see the module docstring). The
    result's `fit` says what was kept, what was dropped and why, and which kernels are new;
    `fit.usable` is False when no bucket is left."""
    names = {s.name for s in specs}
    library_set = kernel_set_hash(names)
    if table.metadata["kernel_set"] == library_set or table.fit is not None:
        return table
    splittable = {s.name for s in specs if s.split_k}
    classes: dict[ClassKey, ClassTable] = {}
    dropped: list[tuple[ClassKey, ShapeEntry, Bucket]] = []
    shapes = whole = gone = buckets = 0
    for key, ctable in table.classes.items():
        fitted: list[ShapeEntry] = []
        for shape in ctable.shapes:
            kept = [b if (why := _why_dropped(b, names, splittable)) is None else replace(b, dropped=why)
                    for b in shape.buckets]
            holes = [b for b in kept if b.dropped]
            shapes += 1
            buckets += len(kept)
            whole += not holes
            gone += len(holes) == len(kept)
            entry = ShapeEntry(shape.n, shape.k, tuple(kept), shape.line)
            dropped += [(key, entry, b) for b in holes]
            fitted.append(entry)
        model = ctable.model
        if model is not None:
            model = replace(model, coef={k: v for k, v in model.coef.items() if k in names})
        classes[key] = ClassTable(key, tuple(fitted), ctable.line, model)
    new = _new_kernels(table, specs, names)
    listed = set(table.classes)
    new_classes_only = bool(new) and all(
        getattr(spec, "dispatch_class", None) is not None and spec.dispatch_class not in listed
        for spec in specs if spec.name in new)
    fit = TableFit(library_set, shapes, whole, gone, buckets, buckets - len(dropped), tuple(dropped),
                   new, frozenset(table.kernel_names() - names), new_classes_only)
    return TunedTable(table.path, table.metadata, classes, fit)


def _scalar(value) -> str:
    """A YAML scalar that reads back as the same value ('13.0' stays a string)."""
    value = str(value) if isinstance(value, str) else value  # e.g. torch's TorchVersion
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).strip()
    return text.removesuffix("...").strip()


def render_table(metadata: dict, classes: Sequence[ClassTable], header: Sequence[str] = ()) -> str:
    """Deterministic, human-diffable YAML text of a table (load_table reads it back)."""
    lines = [f"# {h}" if h else "#" for h in header]
    lines += [f"format: {FORMAT}", "metadata:"]
    metadata = dict(metadata, buckets=sum(len(s.buckets) for t in classes for s in t.shapes))
    for key in _METADATA_KEYS:
        if key in metadata:
            value = metadata[key]
            text = ("[" + ", ".join(_scalar(v) for v in value) + "]" if isinstance(value, (list, tuple))
                    else _scalar(value))
            lines.append(f"  {key}: {text}")
    lines.append("tables:")
    for table in sorted(classes, key=lambda t: t.key):
        names = class_fields(table.key[0])
        lines += [f"  {'-' if i == 0 else ' '} {name}: {value}"
                  for i, (name, value) in enumerate(zip(names, table.key))]
        lines.append("    shapes:")
        for shape in sorted(table.shapes, key=lambda s: (s.n, s.k)):
            lines += [f"      - n: {shape.n}", f"        k: {shape.k}", "        buckets:"]
            for b in shape.buckets:
                extra = f", split_k: {b.knobs.split_k_slices}" if b.knobs.split_k_slices != 1 else ""
                lines.append(f"          - {{m_max: {b.m_max}, kernel: {b.kernel}, raster: "
                             f"{b.knobs.raster}, swizzle: {b.knobs.swizzle}{extra}}}")
        if table.model is not None:
            lines += _render_model(table.model)
    return "\n".join(lines) + "\n"


# Significant digits a table keeps of each stored time (µs).
TIME_DIGITS = 4


def stored_time(us: float) -> float:
    """`us` as a table stores it: the cost model a tune writes is fitted to these, so that it is
    the fit of the table's own times (what `gemmgen tune --refit` computes from the file)."""
    return float(f"{us:.{TIME_DIGITS}g}")


def _yaml_number(value: float, digits: int) -> str:
    """`value` to `digits` significant digits, spelled so that YAML reads it back as a number:
    PyYAML (YAML 1.1) takes an exponent without a decimal point (`2e+04`, `1e-06`) for a string."""
    text = f"{value:.{digits}g}"
    return text.replace("e", ".0e") if "e" in text and "." not in text else text


def _render_model(model: CostModel) -> list[str]:
    kernels = sorted(model.coef)
    lines = ["    model:", f"      features: {model.features}", "      kernels:"]
    lines += [f"        - {name}" for name in kernels]
    lines.append("      coef:")
    lines += ["        - [" + ", ".join(_yaml_number(v, 6) for v in model.coef[name]) + "]" for name in kernels]
    lines.append("      times:")
    for point in sorted(model.times):
        row = model.times[point]
        values = ", ".join(_yaml_number(row[name], TIME_DIGITS) if name in row else "null" for name in kernels)
        lines.append(f"        - [{point[0]}, {point[1]}, {point[2]}, {values}]")
    return lines
