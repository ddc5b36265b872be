"""Find, load and check the published kernel libraries; bind every kernel through ctypes.

A library is a plain C ABI shared object plus the bindings module generated with it (the kernel
table and dispatch rules). Both are read from `<build dir>/<library>/current/`, resolved once,
so a rebuild that swaps `current` never changes a running process under its feet.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .. import families as registry
from .. import settings
from ..errors import GemmgenError, LibraryNotBuiltError, ManifestError
from ..family import OpFamily
from ..generator.dispatch_rules import Condition, parse_condition
from ..generator.kernel_config import KernelSpec
from ..tuning.table import (TUNED_TABLE_FILE, TunedTable, fit_table, is_published_table, kernel_set_hash, load_table,
                            table_for_gpu)

BINDINGS_FILE = "bindings.py"
# Written last into every published folder: sha256 and size of each file published beside it, and
# the manifest it was built from (the repair command names it).
CHECKSUMS_FILE = "checksums.json"


# Every kernel of every family: run(args*, workspace, workspace_bytes, stream) and
# workspace(args*), the args struct by address (a ctypes struct via byref, or a packed buffer).
_RUN_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                  ctypes.c_void_p)
_WORKSPACE_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)


@dataclass(frozen=True, eq=False)
class Kernel:
    """One compiled kernel: its spec (name, config, origin) and its C entry points."""

    spec: KernelSpec
    library: "Library"
    run: object
    workspace_size: object

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def config(self):
        return self.spec.config

    @property
    def origin(self):
        """The manifest entry that produced it (file, line)."""
        return self.spec.origin

    @property
    def family(self) -> OpFamily:
        return registry.get(self.spec.family)

    def __call__(self, *args, **kwargs):
        """Run this kernel through its family's public op (e.g. the arguments of
        `gemmgen.scaled_mm`, or `gemmgen.scaled_mm_azp` for the azp epilogues)."""
        if self.library.manifest is not None:
            raise LibraryNotBuiltError(
                f"kernel {self.name} was read from the manifest {self.library.manifest} (dispatch "
                f"from the manifests), not loaded from a built library: it has no code to run. "
                f"Build it with `gemmgen build {self.library.manifest}` and look it up without "
                "source='manifests'.")
        return self.family.call_kernel(self, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Kernel({self.name})"


@dataclass(frozen=True, eq=False)
class Library:
    name: str
    arch: str
    directory: Path
    fingerprint: str
    cdll: ctypes.CDLL
    kernels: dict[str, Kernel]
    # dispatch class (op, *class fields) -> ((condition, kernel name, manifest line), ...)
    dispatch: dict[tuple[str, ...], tuple[tuple[Condition, str, int], ...]]
    bindings: ModuleType
    # the measured tables `gemmgen tune` wrote (one per GPU it ran on), as published
    tables: tuple[TunedTable, ...] = ()
    # Set for a library read from its manifest alone (`manifest_library`): nothing built, its
    # kernels have no C entry points (calling one raises LibraryNotBuiltError).
    manifest: str | None = None

    @property
    def built(self) -> bool:
        return self.manifest is None

    @property
    def kernel_set(self) -> str:
        return kernel_set_hash(self.kernels)

    def table_for(self, gpu: tuple[str, int] | None) -> tuple[TunedTable | None, str | None]:
        """(the tuned table serving GPU (name, SM count), a note: how it was chosen or why
        none serves); see `gemmgen.tuning.table.table_for_gpu`."""
        return table_for_gpu(self.tables, gpu, self.kernel_set)

    def last_error(self) -> str:
        if self.cdll is None:
            return ""
        return self.cdll.gemmgen_last_error().decode(errors="replace")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# (path, device, inode, size, mtime_ns) -> sha256: each published file is hashed once per process;
# a file replaced or rewritten since has another key and is hashed again.
_DIGESTS: dict[tuple, str] = {}


def _cached_sha256(path: Path, st: os.stat_result) -> str:
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        _DIGESTS[key] = file_sha256(path)
    return _DIGESTS[key]


def checksums_of(directory: Path, names, manifest: str | None) -> dict:
    """The checksum record of the named files of a folder (what publish writes)."""
    files = {}
    for name in sorted(names):
        path = directory / name
        files[name] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    return {"manifest": manifest, "files": files}


def read_checksums(directory: Path) -> dict | None:
    """The checksum record of a published folder; None when it has none (published by a gemmgen
    that wrote none); ValueError when it is unreadable."""
    path = directory / CHECKSUMS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    try:
        record = json.loads(text)
        files = record["files"]
        if not isinstance(files, dict) or not files or not all(
                isinstance(v.get("size"), int) and isinstance(v.get("sha256"), str) for v in files.values()):
            raise ValueError("no file entries")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path} is damaged ({exc})") from None
    return record


def damaged_files(directory: Path, record: dict, *, cached: bool = True) -> list[str]:
    """The files of a published folder that do not match its checksum record (missing, another
    size, another sha256), each with the reason; [] when all match. Sizes are always compared,
    contents once per process per (file, size, mtime) when `cached`."""
    problems = []
    for name, expected in sorted(record["files"].items()):
        path = directory / name
        try:
            st = path.stat()
        except OSError:
            problems.append(f"{name} is missing")
            continue
        if st.st_size != expected["size"]:
            problems.append(f"{name} has {st.st_size} bytes, {expected['size']} were published")
            continue
        digest = _cached_sha256(path, st) if cached else file_sha256(path)
        if digest != expected["sha256"]:
            problems.append(f"{name} differs from what was published (sha256 mismatch)")
    return problems


_GENERATED_FROM = re.compile(r'"""Generated by gemmgen from (.+?): the kernel table')


def manifest_of_folder(directory: Path, record: dict | None = None) -> str | None:
    """The manifest a published folder was built from: from its checksum record, else from the
    header of its bindings (readable even when they do not import), else None."""
    if record and isinstance(record.get("manifest"), str):
        return record["manifest"]
    try:
        head = (directory / BINDINGS_FILE).read_text(errors="replace")[:4096]
    except OSError:
        return None
    match = _GENERATED_FROM.search(head.replace("\n", " "))
    return match.group(1).strip() if match else None


def repair_hint(directory: Path, manifest: str | None = None) -> str:
    """`…; repair it with `gemmgen build <manifest>``, naming the library folder."""
    library_dir = directory.parent.parent if directory.parent.name == "lib" else directory
    command = f"gemmgen build {manifest}" if manifest else "gemmgen build <manifest>"
    return f"the library in {library_dir} is damaged or stale; repair it with `{command}`"


def _manifest_of_library(library_dir: Path) -> str | None:
    """The manifest of a library folder whose `current` is gone: from any release kept in lib/."""
    for release in sorted((library_dir / "lib").glob("[!.]*"), reverse=True):
        try:
            manifest = manifest_of_folder(release, read_checksums(release))
        except ValueError:
            continue
        if manifest:
            return manifest
    return None


def _damaged(directory: Path, detail: str, record: dict | None = None) -> LibraryNotBuiltError:
    return LibraryNotBuiltError(f"{detail}; {repair_hint(directory, manifest_of_folder(directory, record))}")


def _import_bindings(path: Path) -> ModuleType:
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"gemmgen._generated_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _load_tuned_table(path: Path, specs) -> TunedTable | None:
    """The published tuned table, checked against the kernels; one that does not fit is dropped
    with a warning (dispatch then uses the manifest's rules), never breaking the library.

    A table tuned for this kernel set must name only its kernels (file:line otherwise). One tuned
    for another kernel set (the manifest changed since `gemmgen tune`) is fitted entry by entry
    (`fit_table`): the shape entries whose kernels all still exist serve; the rest go to the
    rules. Only a table with no entry left is dropped."""
    if not path.exists():
        return None
    log = logging.getLogger("gemmgen.dispatch")
    names = [s.name for s in specs]
    try:
        own = kernel_set_hash(names)
        table = load_table(path, known_kernels=names, split_k_kernels=[s.name for s in specs if s.split_k],
                           if_kernel_set=own)
        if table.metadata["kernel_set"] == own:
            return table
    except ManifestError as exc:
        log.warning("gemmgen: ignoring the tuned table %s: %s; dispatch uses the manifest's rules",
                    path, exc)
        return None
    fitted = fit_table(table, specs)
    if not fitted.fit.usable:
        why = fitted.fit.dropped[0][2].dropped if fitted.fit.dropped else "it has no shape entries"
        log.warning("gemmgen: ignoring the tuned table %s: it was tuned for another kernel set and "
                    "none of its %d buckets fits this library (e.g. %s); dispatch uses the "
                    "manifest's rules. Re-run `gemmgen tune`.", path, fitted.fit.buckets, why)
        return None
    log.info("gemmgen: %s: %s", path, fitted.fit.note())
    return fitted


def _load_tuned_tables(paths, specs) -> tuple[TunedTable, ...]:
    """Every table of `paths` that fits the kernels (`_load_tuned_table`); two measured on one
    GPU: the first, the other ignored with a warning."""
    tables: list[TunedTable] = []
    for path in paths:
        table = _load_tuned_table(Path(path), specs)
        if table is None:
            continue
        twin = next((t for t in tables if t.gpu == table.gpu), None)
        if twin is not None:
            logging.getLogger("gemmgen.dispatch").warning(
                "gemmgen: ignoring the tuned table %s: %s was measured on the same GPU (%s)",
                path, twin.path, table.gpu[0])
            continue
        tables.append(table)
    return tuple(tables)


def _check_abi(cdll: ctypes.CDLL, so_path: Path, family: OpFamily, record: dict | None = None) -> None:
    """The library's sizeof of the family's argument struct must equal the ctypes mirror's."""
    try:
        size_fn = getattr(cdll, family.args.size_symbol)
    except AttributeError:
        raise _damaged(so_path.parent, f"{so_path} lacks {family.args.size_symbol}() for op family "
                                       f"{family.name!r}", record) from None
    size_fn.restype = ctypes.c_size_t
    if size_fn() != ctypes.sizeof(family.args.mirror):
        raise _damaged(so_path.parent, f"{so_path} was built from another gemmgen version (argument "
                                       f"struct {family.args.typedef} size differs)", record)


def load_library(directory: Path) -> Library:
    """Load one published library folder (shared object + bindings) and check they match.

    Its files are first checked against the folder's checksum record (sizes always, contents
    once per process): a damaged or truncated file, bindings that do not import or do not fit
    this gemmgen all give a LibraryNotBuiltError naming the folder and `gemmgen build <manifest>`.
    """
    directory = directory.resolve()
    try:
        record = read_checksums(directory)
    except ValueError as exc:
        raise _damaged(directory, str(exc)) from None
    if record is not None:
        problems = damaged_files(directory, record)
        if problems:
            raise _damaged(directory, f"published library {directory} does not match its "
                                      f"checksums: {'; '.join(problems)}", record)
    try:
        return _load_checked(directory, record)
    except LibraryNotBuiltError:
        raise
    except Exception as exc:  # bindings of another gemmgen, or damaged beyond what checksums see
        raise _damaged(directory, f"cannot load the bindings {directory / BINDINGS_FILE}: "
                                  f"{type(exc).__name__}: {exc}", record) from exc


def _load_checked(directory: Path, record: dict | None) -> Library:
    module = _import_bindings(directory / BINDINGS_FILE)
    so_path = directory / module.SHARED_OBJECT
    try:
        cdll = ctypes.CDLL(str(so_path))
    except OSError as exc:
        raise _damaged(directory, f"cannot load {so_path}: {exc}", record) from None
    try:
        cdll.gemmgen_last_error.restype = ctypes.c_char_p
        cdll.gemmgen_library_fingerprint.restype = ctypes.c_char_p
    except AttributeError as exc:
        raise _damaged(directory, f"{so_path} is not a gemmgen library: {exc}", record) from None
    built = cdll.gemmgen_library_fingerprint().decode()
    if built != module.FINGERPRINT:
        raise _damaged(directory, f"{so_path} has fingerprint {built} but its bindings expect "
                                  f"{module.FINGERPRINT}", record)
    for family in sorted({registry.get(spec.family) for spec in module.KERNELS}, key=lambda f: f.name):
        _check_abi(cdll, so_path, family, record)
    kernels: dict[str, Kernel] = {}
    published = sorted(p for p in directory.iterdir() if is_published_table(p.name))
    tables = _load_tuned_tables([p for p in published if p.name != TUNED_TABLE_FILE]
                                + [p for p in published if p.name == TUNED_TABLE_FILE], module.KERNELS)
    library = Library(module.LIBRARY, module.ARCH, directory, built, cdll, kernels, {}, module, tables)
    for spec in module.KERNELS:
        run = _RUN_PROTOTYPE(("gemmgen_run_" + spec.name, cdll))
        workspace = _WORKSPACE_PROTOTYPE(("gemmgen_workspace_" + spec.name, cdll))
        kernels[spec.name] = Kernel(spec, library, run, workspace)
    for key, rules in module.DISPATCH.items():
        variables = registry.get(kernels[rules[0][1]].spec.family).variables
        library.dispatch[key] = tuple((parse_condition(when, variables), name, line)
                                      for when, name, line in rules)
    return library


def _dispatch_of(manifest, kernels) -> dict:
    """The manifest's expanded dispatch rules, as a built library's bindings hold them (see
    `render_bindings`): class key -> ((condition, kernel name, manifest line), ...)."""
    names = {(k.dispatch_class, k.config): k.name for k in kernels}
    dispatch = {}
    for family in manifest.families:
        if not family.dispatch:
            continue
        for variant in family.variants:
            key = (family.op, *(value for _, value in variant))
            dispatch[key] = tuple((rule.condition, names[(key, family.configs[rule.config_index].config)],
                                   rule.line) for rule in family.dispatch)
    return dict(sorted(dispatch.items()))


def manifest_library(path: str | os.PathLike) -> Library:
    """A library as `gemmgen build` would publish it from the manifest at `path`, read from the
    manifest alone (validated and expanded) with the tuned table beside it, for dispatch
    decisions before anything is built. Its kernels cannot run (no shared object)."""
    from ..generator.expand import expand
    from ..generator.manifest import load_manifest
    from ..tuning.table import table_paths_for

    path = Path(path)
    manifest = load_manifest(path)
    specs = expand(manifest)
    tables = _load_tuned_tables(table_paths_for(path), specs)
    library = Library(manifest.library, manifest.arch, path.resolve().parent, "", None, {},
                      _dispatch_of(manifest, specs), None, tables, manifest=str(path))
    library.kernels.update({spec.name: Kernel(spec, library, None, None) for spec in specs})
    return library


def _check_owners(loaded, where: str) -> None:
    """No two libraries of one arch may both carry dispatch rules for one dispatch class."""
    owners: dict[tuple, str] = {}
    for library in loaded:
        for key in library.dispatch:
            owned = (library.arch, *key)
            if owned in owners:
                raise GemmgenError(
                    f"libraries {owners[owned]!r} and {library.name!r} in {where} both carry "
                    f"{library.arch} dispatch rules for {' '.join(key)}: which one serves it would "
                    "be arbitrary. Drop the `dispatch` list from one manifest's family (its kernels "
                    "stay callable by name) and rebuild it.")
            owners[owned] = library.name


def _file_state(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return (None,)
    return (st.st_size, st.st_mtime_ns)


def manifest_sources(paths=None) -> tuple:
    """A hashable key for `manifest_libraries(paths)`: each manifest (default: the shipped ones)
    with the state of it and of its tuned table, so an edit is read again."""
    from ..tuning.table import table_paths_for

    if isinstance(paths, (str, os.PathLike)):  # one manifest, not a string of path characters
        paths = [paths]
    # resolved, so one file named two ways is one manifest (as `gemmgen validate` counts them)
    chosen = [Path(p).resolve() for p in paths] if paths else settings.default_manifests()
    if not chosen:
        raise GemmgenError(f"no manifests given and none found in {settings.DEFAULT_MANIFEST_DIR}")
    return tuple((str(p), _file_state(p), tuple((str(t), _file_state(t)) for t in table_paths_for(p)))
                 for p in dict.fromkeys(chosen))


@functools.lru_cache(maxsize=8)
def _manifest_libraries(sources: tuple) -> tuple[Library, ...]:
    loaded = tuple(manifest_library(path) for path, *_ in sources)
    names: dict[str, str] = {}
    for library in loaded:
        if library.name in names:
            raise GemmgenError(f"manifests {names[library.name]} and {library.manifest} both build "
                               f"library {library.name!r}; give one of them another `library` name")
        names[library.name] = library.manifest
    _check_owners(loaded, "the manifests " + ", ".join(lib.manifest for lib in loaded))
    return loaded


def manifest_libraries(paths=None) -> tuple[Library, ...]:
    """The libraries the manifests at `paths` (default: the shipped ones) would build, read from
    the manifests alone (`manifest_library`); memoized until a manifest or table changes."""
    return _manifest_libraries(manifest_sources(paths))


@functools.cache
def libraries() -> tuple[Library, ...]:
    """Every published library under the build directory (loaded once per process)."""
    root = settings.build_dir()
    # Every published `current` (a damaged one, bindings missing or the folder it names gone,
    # is an error naming it, not a library silently left out).
    found = sorted(d / "current" / BINDINGS_FILE for d in root.iterdir()
                   if os.path.lexists(d / "current")) if root.is_dir() else []
    if not found:
        raise LibraryNotBuiltError(
            f"no gemmgen kernel library is built in {root}. Build the default manifest with "
            f"`gemmgen build` (or point {settings.BUILD_DIR_VARIABLE} at the directory you built into).")
    for path in found:
        if not path.parent.is_dir():
            raise LibraryNotBuiltError(
                f"{path.parent} names {os.readlink(path.parent) if path.parent.is_symlink() else '?'}, "
                f"which does not exist; {repair_hint(path.parent.parent, _manifest_of_library(path.parent.parent))}")
    loaded = tuple(load_library(path.parent) for path in found)
    _check_owners(loaded, str(root))
    return loaded


def reload() -> None:
    """Forget loaded libraries so the next call picks up a fresh `gemmgen build`."""
    libraries.cache_clear()
    all_kernels.cache_clear()
    _manifest_libraries.cache_clear()


@functools.cache
def all_kernels() -> dict[str, Kernel]:
    merged: dict[str, Kernel] = {}
    for library in libraries():
        merged.update(library.kernels)
    return merged
