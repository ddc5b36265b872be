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
import logging
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .. import families as registry
from .. import settings
from ..errors import GemmgenError, LibraryNotBuiltError, ManifestError
from ..family import OpFamily
from ..generator.dispatch_rules import Condition, parse_condition
from ..generator.kernel_config import KernelSpec
from ..tuning.table import TUNED_TABLE_FILE, TunedTable, kernel_set_hash, load_table

BINDINGS_FILE = "bindings.py"


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
    def family(self) -> OpFamily:
        return registry.get(self.spec.family)

    def __call__(self, *args, **kwargs):
        """Run this kernel through its family's public op (e.g. the arguments of
        `gemmgen.scaled_mm`, or `gemmgen.scaled_mm_azp` for the azp epilogues)."""
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
    tuned: TunedTable | None = None  # the measured table `gemmgen tune` wrote, if published

    @property
    def kernel_set(self) -> str:
        return kernel_set_hash(self.kernels)

    def last_error(self) -> str:
        return self.cdll.gemmgen_last_error().decode(errors="replace")


def _import_bindings(path: Path) -> ModuleType:
    tag = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(f"gemmgen._generated_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _load_tuned_table(path: Path, specs) -> TunedTable | None:
    """The published tuned table, checked against the kernels; one that does not fit is dropped
    with a warning (dispatch then uses the manifest's rules), never breaking the library."""
    if not path.exists():
        return None
    try:
        return load_table(path, known_kernels=[s.name for s in specs],
                          split_k_kernels=[s.name for s in specs if s.split_k])
    except ManifestError as exc:
        logging.getLogger("gemmgen.dispatch").warning(
            "gemmgen: ignoring the tuned table %s: %s; dispatch uses the manifest's rules", path, exc)
        return None


def _check_abi(cdll: ctypes.CDLL, so_path: Path, family: OpFamily) -> None:
    """The library's sizeof of the family's argument struct must equal the ctypes mirror's."""
    try:
        size_fn = getattr(cdll, family.args.size_symbol)
    except AttributeError:
        raise LibraryNotBuiltError(f"{so_path} lacks {family.args.size_symbol}() for op family "
                                   f"{family.name!r}; rebuild with `gemmgen build`") from None
    size_fn.restype = ctypes.c_size_t
    if size_fn() != ctypes.sizeof(family.args.mirror):
        raise LibraryNotBuiltError(f"{so_path} was built from another gemmgen version (argument "
                                   f"struct {family.args.typedef} size differs); rebuild with "
                                   "`gemmgen build`")


def load_library(directory: Path) -> Library:
    """Load one published library folder (shared object + bindings) and check they match."""
    directory = directory.resolve()
    module = _import_bindings(directory / BINDINGS_FILE)
    so_path = directory / module.SHARED_OBJECT
    try:
        cdll = ctypes.CDLL(str(so_path))
    except OSError as exc:
        raise LibraryNotBuiltError(f"cannot load {so_path}: {exc}; rebuild with `gemmgen build`") from None
    cdll.gemmgen_last_error.restype = ctypes.c_char_p
    cdll.gemmgen_library_fingerprint.restype = ctypes.c_char_p
    built = cdll.gemmgen_library_fingerprint().decode()
    if built != module.FINGERPRINT:
        raise LibraryNotBuiltError(f"{so_path} has fingerprint {built} but its bindings expect "
                                   f"{module.FINGERPRINT}; rebuild with `gemmgen build`")
    for family in sorted({registry.get(spec.family) for spec in module.KERNELS}, key=lambda f: f.name):
        _check_abi(cdll, so_path, family)
    kernels: dict[str, Kernel] = {}
    tuned = _load_tuned_table(directory / TUNED_TABLE_FILE, module.KERNELS)
    library = Library(module.LIBRARY, module.ARCH, directory, built, cdll, kernels, {}, module, tuned)
    for spec in module.KERNELS:
        run = _RUN_PROTOTYPE(("gemmgen_run_" + spec.name, cdll))
        workspace = _WORKSPACE_PROTOTYPE(("gemmgen_workspace_" + spec.name, cdll))
        kernels[spec.name] = Kernel(spec, library, run, workspace)
    for key, rules in module.DISPATCH.items():
        variables = registry.get(kernels[rules[0][1]].spec.family).variables
        library.dispatch[key] = tuple((parse_condition(when, variables), name, line)
                                      for when, name, line in rules)
    return library


@functools.cache
def libraries() -> tuple[Library, ...]:
    """Every published library under the build directory (loaded once per process)."""
    root = settings.build_dir()
    found = sorted(p for p in root.glob(f"*/current/{BINDINGS_FILE}")) if root.exists() else []
    if not found:
        raise LibraryNotBuiltError(
            f"no gemmgen kernel library is built in {root}. Build the default manifest with "
            f"`gemmgen build` (or point {settings.BUILD_DIR_VARIABLE} at the directory you built into).")
    loaded = tuple(load_library(path.parent) for path in found)
    owners: dict[tuple, str] = {}
    for library in loaded:
        for key in library.dispatch:
            owned = (library.arch, *key)
            if owned in owners:
                raise GemmgenError(
                    f"libraries {owners[owned]!r} and {library.name!r} in {root} both carry "
                    f"{library.arch} dispatch rules for {' '.join(key)}: which one serves it would "
                    "be arbitrary. Drop the `dispatch` list from one manifest's family (its kernels "
                    "stay callable by name) and rebuild it.")
            owners[owned] = library.name
    return loaded


def reload() -> None:
    """Forget loaded libraries so the next call picks up a fresh `gemmgen build`."""
    libraries.cache_clear()
    all_kernels.cache_clear()


@functools.cache
def all_kernels() -> dict[str, Kernel]:
    merged: dict[str, Kernel] = {}
    for library in libraries():
        merged.update(library.kernels)
    return merged
