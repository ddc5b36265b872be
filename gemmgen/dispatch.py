"""Dispatch: which compiled kernel (and run-time knobs) serves a problem, looked up from Python.

The chain, first hit wins:
  1. the GPU's tuned table, for an (N, K) it lists (the table `gemmgen tune` measured on this GPU;
     a GPU without one uses a table of a GPU with the same SM count, see
     `gemmgen.tuning.table.table_for_gpu`; a table tuned for another kernel set serves the
     entries whose kernels still exist, see `fit_table`);
  2. a winner recorded by tuning at first use on this GPU (`gemmgen.autotune()`,
     gemmgen/tuning/autotune.py) for the problem's M bucket;
  3. the table again, for an (N, K) it does not list: its cost model's lowest estimate
     (gemmgen/tuning/cost_model.py; averaged with the kernel's time at that shape in the table of
     another GPU with the same SM count, where one lists it), else the nearest measured shape's
     winner;
  4. the manifest's ordered `dispatch` rules;
  5. a guaranteed default (the family's first config).
Each fallback is logged once at WARNING with its reason. Tables and rules are parsed once at
library load; lookups are memoized per problem.

    gemmgen.dispatch.lookup("scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16,
                            epilogue="ScaledEpilogueBias", m=37, n=4096, k=4096)
    gemmgen.dispatch.explain(...)      # for which arch/GPU, which rule chose it, and why
    gemmgen.dispatch.kernels()         # every built kernel

`source="manifests"` (or `manifests=[paths]`) on `choose`/`lookup`/`explain`/`kernels` answers
from the manifests alone (default: the shipped ones) and the tuned tables beside them, before
anything is built: the same decisions a build of them would make, but the kernels cannot run.
Rules are numbered from 1 in messages, as they stand in the manifest (`Choice.rule_index` is
0-based).

Generic over op families: the op's family turns the keyword problem description into a
dispatch class (op, *class fields) and the values of its dispatch variables; rules are matched
over those variables. Tuned tables are keyed by (n, k) and bucketed over m; a family's
`table_point` maps its values there (W8A8 and mixed-input: (m, n, k) themselves; MoE: (rows, n,
k), listed layers only).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import sys
from dataclasses import dataclass, replace

from . import arch as arch_policy
from . import families as registry
from .bindings import library as _library_module
from .bindings.library import Kernel, Library, all_kernels, libraries, manifest_sources
from .dtypes import dtype_name  # noqa: F401  (part of this module's API)
from .errors import NoKernelError
from .family import OpFamily
from .generator.kernel_config import RuntimeKnobs
from .tuning import cost_model

log = logging.getLogger("gemmgen.dispatch")

# Without an explicit arch, the fastest arch that serves the problem (gemmgen/arch.py).
ARCH_PREFERENCE = arch_policy.PREFERENCE


@dataclass(frozen=True)
class Choice:
    """A dispatch decision: the kernel and run-time knobs, which link of the chain chose them
    (`source`: "autotune", "table", "rule" or "default") and why, in words (`reason`).
    `settled`: tuning at first use has nothing to add: the problem's own (N, K) was timed on
    this GPU (its tuned table lists it, or a record of tuning at first use), or it cannot be
    timed (a family without the tuner's hooks, a timing that failed)."""

    kernel: Kernel
    knobs: RuntimeKnobs
    source: str
    reason: str
    rule: str | None = None
    rule_index: int | None = None
    line: int | None = None
    settled: bool = False
    # made while tuning at first use could not time (CUDA graph capture, torch.compile
    # tracing): the ops do not memoize it, so the next call outside tunes
    provisional: bool = False


_warned: set[str] = set()
_untuned_noted: set[str] = set()
_SOURCES = ("built", "manifests")


def _warn_once(message: str, level: int = logging.WARNING) -> None:
    if message not in _warned:
        _warned.add(message)
        log.log(level, "%s", message)


def _device_facts(device: int | None):
    """(name, SM count, compute capability) of a CUDA device (None: the current one), or None
    without CUDA."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    return _facts_of(torch.cuda.current_device() if device is None else device)


@functools.lru_cache(maxsize=16)
def _facts_of(index: int) -> tuple[str, int, tuple[int, int]]:
    import torch
    props = torch.cuda.get_device_properties(index)
    return props.name, props.multi_processor_count, (props.major, props.minor)


def gpu_identity(device: int | None = None) -> tuple[str, int] | None:
    """(name, SM count) of a CUDA device (None: the current one), or None without CUDA."""
    facts = _device_facts(device)
    return None if facts is None else facts[:2]


def gpu_capability(device: int | None = None) -> tuple[int, int] | None:
    """Compute capability of a CUDA device (None: the current one), or None without CUDA."""
    facts = _device_facts(device)
    return None if facts is None else facts[2]


def _usable_table(library: Library, device: int | None):
    """(the library's tuned table that serves this GPU, else None; why not, or None). The GPU's
    own table, else one of a GPU like it (`Library.table_for`), said once. The GPU is asked for
    its identity only here, when there is a table to check."""
    if not library.tables:
        return None, None
    table, note = library.table_for(gpu_identity(device))
    if table is None:
        _warn_once(f"gemmgen: the tuned tables of library {library.name!r} are not used: {note}. "
                   "Dispatch falls back to the manifest's rules; run `gemmgen tune` on this GPU.")
        return None, note
    if note is not None:
        _warn_once(f"gemmgen: library {library.name!r}: {note}.")
    if table.fit is not None and library.name not in _untuned_noted:
        _untuned_noted.add(library.name)
        log.info("gemmgen: library %r: %s (%s)", library.name, table.fit.note(), table.path)
    return table, None


def _sibling(library: Library, measured: Kernel, key: tuple[str, ...]) -> Kernel | None:
    """The kernel of the same manifest config as `measured`, for another dispatch class."""
    origin = measured.spec.origin
    for kernel in library.kernels.values():
        spec = kernel.spec
        if ((spec.origin.family, spec.origin.config) == (origin.family, origin.config)
                and spec.dispatch_class == key):
            return kernel
    return None


def _proxy_class(table, key: tuple[str, ...], fields: tuple[int, ...]):
    """The measured class that stands in for an unmeasured one: the first that shares the key's
    `fields` (the family's `table_proxy_fields`; W8A8: op and input dtype, so another output
    dtype or epilogue; mixed: op, weight and scheme, so another activation dtype)."""
    if any(not 0 <= i < len(key) for i in fields):
        raise ValueError(f"table_proxy_fields {fields} of op family {key[0]!r}: indices into its "
                         f"class key {key} expected")
    return next((t for c, t in sorted(table.classes.items())
                 if len(c) == len(key) and all(c[i] == key[i] for i in fields)), None)


def _stand_in_note(measured: tuple[str, ...], key: tuple[str, ...]) -> str:
    """What a choice's reason adds when another class's entries stood in for `key`'s."""
    return (f", measured as {' '.join(measured[1:])} and applied to the same config's "
            f"{' '.join(key[1:])} kernel")


def _from_table(library: Library, table, key: tuple[str, ...], m: int, n: int, k: int,
                device: int | None = None) -> tuple[Choice | None, str | None]:
    """(the table's choice or None, a note for the reason of the rule that serves instead).
    A family whose tables serve listed shapes only (`table_nearest_shape` False: the MoE family,
    whose shapes differ from model to model in more than N and K, and the mixed-input family,
    whose best kernel a nearby shape does not predict) takes no nearest shape's entries; another
    class's entries stand in as the family's `table_proxy_fields` allow (the MoE family: none)."""
    what = " ".join(key)
    family = registry.for_op(key[0])
    listed_only = family is not None and not family.table_nearest_shape
    proxy_fields = (family or OpFamily).table_proxy_fields
    exact_class = table.classes.get(key)
    ctable = exact_class or (None if proxy_fields is None else _proxy_class(table, key, proxy_fields))
    if ctable is None:
        if proxy_fields is not None:
            shared = ", ".join(f"{key[i]!r}" for i in proxy_fields)
            new = table.fit.new_kernels if table.fit is not None else None
            # a class whose every kernel came after the tune (e.g. a family entry added since):
            # nothing the table says is wrong for it, so this is news, not a warning
            added = bool(new) and all(kern.name in new for kern in library.kernels.values()
                                      if kern.spec.dispatch_class == key)
            _warn_once(f"gemmgen: the tuned table of library {library.name!r} has no entries for "
                       f"{what} nor for a class sharing its {shared}"
                       + ("; its kernels came after the tune (`gemmgen tune` measures them)"
                          if added else "") + "; it uses the manifest's rules",
                       logging.INFO if added else logging.WARNING)
        return None, None
    hit = ctable.lookup(m, n, k)
    if hit is None or (listed_only and not hit.exact_shape):
        return None, None
    if hit.dropped:  # a hole left by fitting a table tuned for another kernel set
        shape = "measured shape" if hit.exact_shape else "nearest measured shape"
        note = (f"tuned table ({table.path}:{hit.shape.line}), {shape} (n={hit.shape.n}, "
                f"k={hit.shape.k}): {hit.dropped}, so the rules serve this M range")
        _warn_once(f"gemmgen: library {library.name!r}: {note} ({' '.join(ctable.key)} at n={n}, "
                   f"k={k}; re-run `gemmgen tune`)")
        return None, note
    if not hit.exact_shape and ctable.model is not None:
        modelled = _from_cost_model(library, table, ctable, key, m, n, k, exact_class is not None)
        if modelled is not None:
            return modelled, None
    measured = library.kernels[hit.bucket.kernel]
    kernel = measured if exact_class else _sibling(library, measured, key)
    if kernel is None:
        _warn_once(f"gemmgen: tuned kernel {measured.name} has no {' '.join(key[1:])} sibling in "
                   f"library {library.name!r}; {what} uses the manifest's rules")
        return None, None
    where = f"{table.path}:{hit.bucket.line}"
    if table.fit is not None:
        where += "; " + table.fit.summary()
    identity = gpu_identity(device)
    if identity is None:
        where += (f"; measured on {table.metadata['gpu']} ({table.metadata['sm_count']} SMs), "
                  "not checked: no GPU visible")
    elif tuple(identity) != table.gpu:
        where += f"; measured on {table.gpu[0]}, a GPU of the same arch and SM count"

    if hit.exact_shape:
        shape = f"measured shape (n={n}, k={k})"
    else:
        shape = f"nearest measured shape (n={hit.shape.n}, k={hit.shape.k})"
        _warn_once(f"gemmgen: (n={n}, k={k}) was not tuned for {' '.join(ctable.key)}; dispatch "
                   f"uses the nearest measured shape (n={hit.shape.n}, k={hit.shape.k})")
    proxy = "" if exact_class else _stand_in_note(ctable.key, key)
    knobs = hit.bucket.knobs
    variable = family.table_m_name if family is not None else "m"
    reason = (f"tuned table ({where}): {shape}, bucket {variable} <= {hit.bucket.m_max}{proxy}; raster "
              f"{knobs.raster}, swizzle {knobs.swizzle}"
              + (f", split_k {knobs.split_k_slices}" if knobs.split_k_slices != 1 else ""))
    own = identity is None or tuple(identity) == table.gpu
    return Choice(kernel, knobs, "table", reason,
                  settled=hit.exact_shape and exact_class is not None and own), None


def _lists(table, key: tuple[str, ...], n: int, k: int, device: int | None) -> bool:
    """Whether `table` is this GPU's own and measured (n, k) for the class: it then comes before
    the records of tuning at first use (`gemmgen tune --from-cache` supersedes them)."""
    if table is None:
        return False
    identity = gpu_identity(device)
    ctable = table.classes.get(key)
    hit = None if ctable is None else ctable.lookup(1, n, k)
    return (identity is None or tuple(identity) == table.gpu) and hit is not None and hit.exact_shape


def _from_autotune(library: Library, key: tuple[str, ...], m: int, n: int, k: int,
                   device: int | None) -> Choice | None:
    """The winner tuning at first use recorded for this problem's M bucket on this GPU, if any
    (gemmgen/tuning/autotune.py); None without a GPU, a record, or its kernel."""
    if not library.built:
        return None
    gpu = gpu_identity(device)
    if gpu is None:
        return None
    from .tuning import autotune
    cache = autotune.cache_for(library.name, gpu)
    entry = cache.winner(key, n, k, m)
    kernel = None if entry is None else library.kernels.get(entry.kernel)
    if (kernel is None or entry.kernel_set != library.kernel_set or kernel.spec.dispatch_class != key
            or (entry.knobs.split_k_slices != 1 and not kernel.spec.split_k)):
        return None  # none; or timed for another kernel set (the manifest changed), or not this class's
    reason = (f"tuned at first use ({cache.path}:{entry.line or '?'}): measured at m={entry.m}, "
              f"bucket m <= {entry.bucket}, {entry.us:.1f} µs; raster {entry.knobs.raster}, "
              f"swizzle {entry.knobs.swizzle}")
    return Choice(kernel, entry.knobs, "autotune", reason, settled=True)


# id(class table) -> (the class table, its model refitted to this gemmgen's feature set)
_REFITTED: dict[int, tuple] = {}


def _current_model(library: Library, table, ctable, family: OpFamily | None):
    """The class's cost model in the feature set this gemmgen computes: the table's own, or, for a
    table written with another (an older gemmgen's), one refitted from the times it stores, once
    a process, at the class's first unlisted shape (the times are what `gemmgen tune` measured;
    only the features changed). None when the family has no cost features or no kernel of the
    stored times is left in the library."""
    model = ctable.model
    if family is None or family.cost_feature_set is None:
        return None
    if model.features == family.cost_feature_set:
        return model
    cached = _REFITTED.get(id(ctable))
    if cached is None or cached[0] is not ctable:
        refitted = cost_model.fit_for_family(family, library.kernels, int(table.metadata["sm_count"]), model.times)
        cached = _REFITTED[id(ctable)] = (ctable, refitted)
        done = ("refitted from the times the table stores, once a process" if refitted is not None else
                "no kernel of its stored times is in the library, so untuned shapes take the nearest "
                "measured shape's winner")
        _warn_once(f"gemmgen: the tuned table {table.path} has a cost model of feature set "
                   f"{model.features!r}, this gemmgen computes {family.cost_feature_set!r}: {done} "
                   f"(`gemmgen tune --refit {table.path}` rewrites it)")
    return cached[1]


def _from_cost_model(library: Library, table, ctable, key: tuple[str, ...], m: int, n: int, k: int,
                     exact_class: bool) -> Choice | None:
    """For an (N, K) the table does not list: the kernel whose time, estimated from its
    measurements at the nearest listed shapes and the table's cost model, is lowest
    (gemmgen/tuning/cost_model.py; a model of another feature set refitted first, `_current_model`).
    None when the model cannot serve (no kernel of it left in the library)."""
    family = registry.for_op(key[0])
    model = _current_model(library, table, ctable, family)
    if model is None:
        return None
    sm_count = int(table.metadata["sm_count"])
    available = [name for name in model.coef if name in library.kernels]

    def features_of(name: str, mm: int, nn: int, kk: int):
        return family.cost_features(library.kernels[name].spec, mm, nn, kk, sm_count)

    references = model.nearest_shapes(n, k)  # the nearest shapes with times (normally the table's)
    try:
        estimates = model.blended_estimates(m, n, k, references, features_of, available)
    except ValueError as exc:  # coefficients that do not match the features: a damaged table
        _warn_once(f"gemmgen: the cost model of {table.path} does not fit this gemmgen ({exc}): "
                   "untuned shapes take the nearest measured shape's winner; re-run `gemmgen tune`")
        return None
    if not estimates:
        return None
    also = ""
    other = _sibling_measurement(library, table, ctable, model, family, m, n, k, features_of, list(estimates))
    if other is not None:
        there, other_table, shared = other
        estimates = {name: math.sqrt(estimates[name] * there[name]) for name in estimates if name in there}
        also = (f"; averaged (geometric mean) with its time at this very shape on {other_table.gpu[0]} "
                f"({other_table.path}), scaled by the kernel's time ratio between the GPUs over the "
                f"{shared} shapes both tables list")
    best = min(estimates, key=lambda name: (estimates[name], name))
    kernel = library.kernels[best] if exact_class else _sibling(library, library.kernels[best], key)
    if kernel is None:
        return None
    runner_up = sorted(estimates.values())[1] if len(estimates) > 1 else None
    margin = f", next best {runner_up:.1f} µs" if runner_up is not None else ""
    where = f"{table.path}:{ctable.line}" + (f"; {table.fit.summary()}" if table.fit is not None else "")
    proxy = "" if exact_class else _stand_in_note(ctable.key, key)
    reason = (f"tuned table ({where}): (n={n}, k={k}) not measured; cost model estimate "
              f"{estimates[best]:.1f} µs{margin}, from the {_shape_list(references)}{also}{proxy}; the "
              "kernel's manifest knobs")
    return Choice(kernel, kernel.spec.knobs, "table", reason)


# (id(this class table), id(the other GPU's)) -> (both class tables, the kernels' time ratios, the
# count of shapes both list)
_GPU_RATIOS: dict[tuple[int, int], tuple] = {}


def _sibling_measurement(library: Library, table, ctable, own_model, family, m: int, n: int, k: int,
                         features_of, kernels: list[str]):
    """(each of `kernels`' estimated µs on this table's GPU (`own_model`: its class's current cost
    model) from its time at (n, k) in the table of another GPU of the same SM count, that table,
    the count of shapes both list), or None when no such table lists (n, k) for the class
    (`cost_model.sibling_estimates`). The H100's and the
    H200's tables run the same kernels over the same tile grids; a shape tuned on one GPU only is
    then served on the other from both its own cost model and this: scored on the shipped tables,
    leaving each model out of one (benchmarks/prototypes/sibling_table_cv.py, session 31), the
    geometric mean of the two picks within 0.987-0.995 of the oracle, where the H100's own model
    (fitted on 4 models) alone reaches 0.975-0.979 and the transfer across GPUs alone 0.987-0.990."""
    for other_table in library.tables:
        if other_table is table or other_table.gpu[1] != table.gpu[1] or other_table.gpu == table.gpu:
            continue
        other_class = other_table.classes.get(ctable.key)
        hit = None if other_class is None else other_class.lookup(m, n, k)
        if hit is None or not hit.exact_shape or hit.dropped:
            continue
        other_model = _current_model(library, other_table, other_class, family)
        if other_model is None:
            continue
        cached = _GPU_RATIOS.get((id(ctable), id(other_class)))
        if cached is None or cached[0] is not ctable or cached[1] is not other_class:
            cached = _GPU_RATIOS[(id(ctable), id(other_class))] = (
                ctable, other_class, cost_model.gpu_time_ratios(own_model, other_model),
                len(own_model.shapes & other_model.shapes))
        there = cost_model.sibling_estimates(cached[2], other_model, m, n, k, features_of, kernels)
        if there:
            return there, other_table, cached[3]
    return None


def _shape_list(shapes: list[tuple[int, int]]) -> str:
    """'nearest measured shape (n=.., k=..)' or 'N nearest measured shapes (n=.., k=..; ...)'."""
    listed = "; ".join(f"n={n}, k={k}" for n, k in shapes)
    return (f"nearest measured shape ({listed})" if len(shapes) == 1 else
            f"{len(shapes)} nearest measured shapes ({listed})")


def rule_label(index: int, count: int, line: int | None, file: str | None = None) -> str:
    """A rule as the manifest names it: 'rule 3 of 5 (line 68)' (index is 0-based), or with the
    file: 'rule 3 of 5 (w8a8_sm90.yaml:68)'."""
    where = f"{file}:{line}" if file else f"line {line}"
    return f"rule {index + 1} of {count} ({where})"


def _describe_values(variables: tuple[str, ...], values: tuple[int, ...]) -> str:
    return ", ".join(f"{name}={value}" for name, value in zip(variables, values))


def _serving_libraries(source) -> tuple[Library, ...]:
    return libraries() if source is None else _library_module._manifest_libraries(source)


def _known_kernels(source) -> dict[str, Kernel]:
    if source is None:
        return all_kernels()
    return {n: k for lib in _serving_libraries(source) for n, k in lib.kernels.items()}


@functools.lru_cache(maxsize=8192)
def _choose(arches: tuple[str, ...], key: tuple[str, ...], values: tuple[int, ...],
            device: int | None, tuned: bool, source: tuple | None = None) -> Choice:
    """The lookup chain, first hit wins (the module docstring): the GPU's tuned table for a listed
    shape → records of tuning at first use → the table's cost model (or nearest shape) → the
    manifest's rules → a guaranteed default (the first config of the family that builds it).
    `source`: None for the built libraries, else `manifest_sources(...)` of the manifests."""
    family = registry.for_op(key[0])
    point = family.table_point(values) if family is not None else None  # (m, n, k) in a table
    tunable = point is not None
    for arch in arches:
        serving = [lib for lib in _serving_libraries(source) if lib.arch == arch and any(
            kern.spec.dispatch_class == key for kern in lib.kernels.values())]
        if not serving:
            continue
        owner = next((lib for lib in serving if key in lib.dispatch), serving[0])
        table, unusable = _usable_table(owner, device) if tuned and tunable else (None, None)
        if tuned and not owner.tables and owner.name not in _untuned_noted:
            # INFO, not WARNING: nothing fell back; the library never had a table
            _untuned_noted.add(owner.name)
            log.info("gemmgen: library %r has no tuned table; dispatch uses the manifest's rules "
                     "(measure one with `gemmgen tune` on this GPU)", owner.name)
        note = None
        if tuned and tunable and not _lists(table, key, *point[1:3], device):
            choice = _from_autotune(owner, key, *point, device)
            if choice is not None:
                return choice
        if table is not None:
            choice, note = _from_table(owner, table, key, *point, device)
            if choice is not None:
                return choice
        rules = owner.dispatch.get(key)
        if rules is not None:
            for index, (condition, name, line) in enumerate(rules):
                if condition.matches(*values):
                    kernel = owner.kernels[name]
                    why = ("" if tuned and owner.tables and unusable is None else
                           f" (tuned table not used: {unusable})" if tuned and unusable else
                           " (no tuned table)" if tuned else " (tuned table not consulted)")
                    label = rule_label(index, len(rules), line, kernel.spec.origin.file)
                    reason = (f"{note + '; ' if note else ''}{label}: {condition.source!r} is the "
                              f"first that matches{why}")
                    return Choice(kernel, kernel.spec.knobs, "rule", reason, condition.source, index, line)
            # check_rule_table proved the table has no gap at build time
            raise AssertionError(f"dispatch table for {key} has a gap at "
                                 f"{_describe_values(family.variables, values)}")
        kernel = min((kern for kern in owner.kernels.values() if kern.spec.dispatch_class == key),
                     key=lambda kern: (kern.spec.origin.line, kern.name))
        _warn_once(f"gemmgen: library {owner.name!r} has no dispatch rules for {' '.join(key)}; "
                   f"using its first config's kernel {kernel.name} for every shape")
        return Choice(kernel, kernel.spec.knobs, "default",
                      f"default: no table entry or rule serves {' '.join(key)}, so the first "
                      f"config of the family ({kernel.spec.origin.file}:{kernel.spec.origin.line}) serves it")
    built = sorted({(k.spec.arch, *k.spec.dispatch_class[1:]) for k in _known_kernels(source).values()
                    if k.spec.op == key[0]})
    described = family.describe_class(key) if family is not None else " ".join(key)
    fields = ", ".join(("arch", *family.spec_type.class_fields)) if family is not None else "arch, ..."
    if source is not None:
        raise NoKernelError(key, arches, f"no kernel of the manifests "
                            f"{', '.join(p for p, *_ in source)} for {'/'.join(arches)} computes "
                            f"{described}; they build ({fields}): {built}.", from_manifests=True)
    raise NoKernelError(key, arches, f"no built kernel for {'/'.join(arches)} computes {described}; "
                        f"built ({fields}): {built}. Add it to a manifest and run `gemmgen build`.")


def _arches(arch, device: int | None = None) -> tuple[str, ...]:
    """The arches to try, fastest first: the ones asked for, else those that run on the GPU
    (gemmgen/arch.py), else, with no GPU visible, the arch preference."""
    if arch is None:
        capability = gpu_capability(device)
        found = arch_policy.arches_for(capability) if capability is not None else ()
        return found or ARCH_PREFERENCE
    arches = (arch,) if isinstance(arch, str) else tuple(arch)
    for name in arches:
        if name not in ARCH_PREFERENCE:
            raise ValueError(f"unknown arch {name!r}; expected one of {', '.join(ARCH_PREFERENCE)}")
    return arches


def _source(source: str, manifests) -> tuple | None:
    """None for the built libraries; the manifests' key (`manifest_sources`) otherwise."""
    if manifests is not None:
        return manifest_sources(manifests)
    if source not in _SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {', '.join(_SOURCES)}")
    return manifest_sources(None) if source == "manifests" else None


def choose_class(key: tuple[str, ...], values: tuple[int, ...], *, arch=None, tuned: bool = True,
                 device: int | None = None) -> Choice:
    """The dispatch decision for a dispatch class and its variable values (what the ops call).
    With tuning at first use on (`gemmgen.autotune()`), a problem whose (N, K) was never timed
    on this GPU is timed now and its winner recorded (gemmgen/tuning/autotune.py)."""
    arches = _arches(arch, device)
    choice = _choose(arches, key, values, device, tuned, None)
    if not tuned or choice.settled or not choice.kernel.library.built:
        return choice
    from .tuning import autotune
    if not autotune.enabled():
        return choice
    family = registry.for_op(key[0])
    gpu = gpu_identity(device)
    if gpu is None or family is None or family.variables[:3] != ("m", "n", "k"):
        return replace(choice, settled=True)  # nothing the tuner can time
    provisional = autotune.not_now_reason() is not None
    entry = autotune.tune_point(choice.kernel.library, key, *values[:3], gpu, _device_index(device))
    if entry is not None:
        _forget_choices()  # the new record is the first link of the chain now
        return _choose(arches, key, values, device, tuned, None)
    # under capture: not kept by the ops, tuned at the next call outside; otherwise (no hooks,
    # a failed timing, warned) this choice stays
    return replace(choice, provisional=True) if provisional else replace(choice, settled=True)


def _forget_choices() -> None:
    """Drop memoized decisions, here and in the ops (loaded once an op ran; never import torch)."""
    _choose.cache_clear()
    _calls.clear()
    launch = sys.modules.get("gemmgen.bindings.launch")
    if launch is not None:
        launch.forget_choices()


def _device_index(device: int | None) -> int:
    if device is not None:
        return device
    import torch
    return torch.cuda.current_device()


def _dispatch_request(op: str, problem: dict):
    """The family's (class key, variable values) of a problem description; a ValueError that
    names an unknown or missing argument and the ones the op's problem takes (not a TypeError
    from the call). The family's named parameters after `op` are the contract: a family that
    also takes `**problem` gets no unknown-name check."""
    family = registry.for_api_op(op)
    named, required, open_ended = _problem_parameters(type(family).dispatch_request)
    unknown = [] if open_ended else [name for name in problem if name not in named]
    missing = [name for name in required if name not in problem]
    if unknown or missing:
        what = (f"unknown argument {unknown[0]!r}" if unknown
                else f"missing argument {missing[0]!r}")
        described = ", ".join(name if name in required else f"{name} (optional)" for name in named)
        raise ValueError(f"{op}: {what}; a problem of {op} is described by {described}")
    return family, family.dispatch_request(op, **problem)


@functools.lru_cache(maxsize=None)
def _problem_parameters(dispatch_request) -> tuple[tuple[str, ...], frozenset[str], bool]:
    """A family's `dispatch_request` read once: its named parameters after `op`, the required
    ones, and whether it also takes `**problem`."""
    params = list(inspect.signature(dispatch_request).parameters.values())[2:]  # after self, op
    named = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    required = frozenset(p.name for p in params if p.name in named and p.default is p.empty)
    return named, required, any(p.kind == p.VAR_KEYWORD for p in params)


def choose(op: str = "scaled_mm", *, arch=None, tuned: bool = True, device: int | None = None,
           source: str = "built", manifests=None, **problem) -> Choice:
    """The dispatch decision for a problem: kernel, knobs, and which link of the chain chose it.

    `problem` is the op family's description of a problem (W8A8: a_dtype, out_dtype, epilogue,
    m, n, k). `arch` ("sm90a", "sm80" or a preference list) picks the kernel arch; by default
    the first arch that runs on the GPU (ARCH_PREFERENCE order; all of it when no GPU is
    visible) whose libraries serve the problem. `tuned=False` skips the tuned table (the
    manifest's rules only). `device` is the CUDA device whose identity a tuned table must match
    (default: the current one; without CUDA the table is used unchecked). `source="manifests"`
    answers from the shipped manifests (`manifests=[paths]`: those) without a build.
    """
    if device is None:  # the current one, by its index: a choice is memoized per GPU
        device = _current_device()
    memo = _call_key(op, arch, tuned, device, source, manifests, problem)
    chosen = _calls.get(memo) if memo is not None else None
    if chosen is None:
        _, (key, values) = _dispatch_request(op, problem)
        chosen = _choose(_arches(arch, device), key, values, device, tuned, _source(source, manifests))
        if memo is not None:
            if len(_calls) >= _MAX_CALLS:
                _calls.clear()
            _calls[memo] = chosen
    return chosen


# `choose` of the built libraries memoized by its arguments and the CUDA device: a repeated call
# skips the problem's check and its translation into a dispatch class (~10 µs on an H200 host).
# Cleared with the choices (`cache_clear`, `_forget_choices`).
_calls: dict[tuple, Choice] = {}
_MAX_CALLS = 1 << 14


def _call_key(op, arch, tuned, device, source, manifests, problem) -> tuple | None:
    """The memo key of a `choose` call of the built libraries, or None when it has none: an
    unhashable argument, or an answer from the manifests (whose files may change between calls:
    `manifest_sources` reads them again)."""
    if source != "built" or manifests is not None:
        return None
    try:
        key = (op, tuple(arch) if isinstance(arch, list) else arch, tuned, device,
               tuple(sorted(problem.items())))
        hash(key)
    except TypeError:
        return None
    return key


def _current_device() -> int | None:
    """The current CUDA device's index, or None without CUDA (`is_available` reads the
    environment each call: asked only until CUDA is initialized)."""
    import torch
    if torch.cuda.is_initialized() or torch.cuda.is_available():
        return torch.cuda.current_device()
    return None


def lookup(op: str = "scaled_mm", *, arch=None, tuned: bool = True, source: str = "built",
           manifests=None, **problem) -> Kernel:
    """The kernel dispatch picks: `.name`, `.config`, and callable like the op (not when it
    comes from the manifests: nothing is built)."""
    return choose(op, arch=arch, tuned=tuned, source=source, manifests=manifests, **problem).kernel


def _context(arch, arches: tuple[str, ...], kernel: Kernel, device: int | None) -> str:
    """For which arch and GPU a decision is: 'for sm90a on NVIDIA H200 (cc 9.0)', or 'for sm90a
    (no GPU visible: assuming the arch preference sm90a, sm80)'."""
    chosen = kernel.spec.arch
    capability = gpu_capability(device)
    asked = f"arch {'/'.join(arches)} asked for" if arch is not None else None
    if capability is None:
        detail = f"{asked}; no GPU visible" if asked else (
            f"no GPU visible: assuming the arch preference {', '.join(arches)}")
    else:
        identity = gpu_identity(device)
        name = identity[0] if identity else "the GPU"
        runs = "" if arch_policy.arches_for(capability) else (
            f", which no gemmgen arch runs: assuming the arch preference {', '.join(arches)}")
        detail = f"cc {capability[0]}.{capability[1]}{runs}" + (f"; {asked}" if asked else "")
        return f"for {chosen} on {name} ({detail})" + _from_manifest(kernel)
    return f"for {chosen} ({detail})" + _from_manifest(kernel)


def _from_manifest(kernel: Kernel) -> str:
    manifest = kernel.library.manifest
    return f", from the manifest {manifest} (not built)" if manifest else ""


def explain(op: str = "scaled_mm", *, arch=None, tuned: bool = True, source: str = "built",
            manifests=None, **problem) -> str:
    """One paragraph: for which arch and GPU, which link of the chain (tuned table, rule,
    default) chose which kernel and knobs for this problem, and why."""
    family, (key, values) = _dispatch_request(op, problem)
    arches = _arches(arch)
    c = _choose(arches, key, values, None, tuned, _source(source, manifests))
    split = f", split_k {c.knobs.split_k_slices}" if c.knobs.split_k_slices != 1 else ""
    return (f"{_context(arch, arches, c.kernel, None)}, {_describe_values(family.variables, values)}: "
            f"{c.reason}; it picks {c.kernel.name} (config {c.kernel.spec.origin.config!r}, raster "
            f"{c.knobs.raster}, swizzle {c.knobs.swizzle}{split}).")


def kernels(op: str | None = None, *, source: str = "built", manifests=None) -> list[Kernel]:
    """Every built kernel (`source="manifests"`: every kernel of the manifests), sorted by name;
    `op` keeps the kernels of one user op (e.g. 'scaled_mm_azp': the azp epilogues)."""
    found = sorted(_known_kernels(_source(source, manifests)).values(), key=lambda kernel: kernel.name)
    if op is None:
        return found
    family = registry.for_api_op(op)
    return [k for k in found if k.spec.family == family.name and family.api_op(k.spec) == op]


def cache_clear() -> None:
    """Forget memoized choices and which fallbacks were warned about (GPU identities stay)."""
    _choose.cache_clear()
    _calls.clear()
    _warned.clear()
    _untuned_noted.clear()
    _REFITTED.clear()
    _GPU_RATIOS.clear()
