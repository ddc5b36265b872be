"""Build one manifest into a published kernel library: validate → render → ninja → publish.

Layout under the build directory, per library:

    <build>/<library>/src/*.cu            generated sources (written only when changed)
    <build>/<library>/obj/*.o             object files (ninja, incremental, nvcc depfiles)
    <build>/<library>/build.ninja
    <build>/<library>/staging/lib….so     the last successful link
    <build>/<library>/lib/<fingerprint>/  a published library + its generated bindings (+ the
                                          manifest's tuned table, tuned.yaml)
    <build>/<library>/current ->          symlink to the published one; swapped atomically

NOTES: the shared object and its bindings are published together by one symlink swap, so a
reader never sees a new library with old bindings, and a failed or interrupted build leaves the
previous `current` untouched.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BuildError
from ..generator.expand import expand
from ..generator.kernel_config import KernelSpec
from ..generator.manifest import Manifest, load_manifest
from ..generator.render import (BINDINGS_FILE, LIBRARY_SOURCE, TranslationUnit, include_dirs,
                                render_bindings, render_kernel_sources, render_library_source,
                                write_tree)
from ..tuning.table import TUNED_TABLE_FILE, kernel_set_hash, load_table, table_path_for
from .ninja_file import ninja_file
from .toolchain import LINK_FLAGS, Toolchain, find_toolchain, max_parallel_jobs

KEEP_PUBLISHED = 2  # the current library and the one before it (a running process may hold it)


@dataclass
class BuildReport:
    library: str
    kernel_count: int
    published: Path
    compile_seconds: dict[str, float] = field(default_factory=dict)  # translation unit → seconds
    rebuilt: bool = False


def shared_object_name(library: str) -> str:
    return f"libgemmgen_{library}.so"


def fingerprint(units: list[TranslationUnit], toolchain: Toolchain, flags: list[str],
                allow_wgmma_serialization: bool) -> str:
    """Hash of everything that shapes the binary: sources, headers, compiler, flags."""
    h = hashlib.sha256()
    for part in (toolchain.nvcc_version, toolchain.cutlass_version, " ".join(LINK_FLAGS),
                 " ".join(f for f in flags if not f.startswith("-I")), str(allow_wgmma_serialization)):
        h.update(part.encode() + b"\0")
    for unit in units:
        h.update(unit.name.encode() + b"\0" + unit.source.encode() + b"\0")
    families = sorted({spec.family for unit in units for spec in unit.kernels})
    for root in include_dirs(families):
        for header in sorted(root.rglob("*")):
            if header.is_file():
                h.update(str(header.relative_to(root)).encode() + b"\0" + header.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Cross-process lock: two builds of one library never interleave."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_ninja(library_dir: Path, jobs: int, units: dict[str, TranslationUnit],
               log: Callable[[str], None]) -> None:
    ninja = shutil.which("ninja")
    if ninja is None:
        raise BuildError("ninja not found: `pip install ninja` (a dependency of gemmgen)")
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    proc = subprocess.Popen([ninja, "-C", str(library_dir), "-j", str(jobs)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failed: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        log(line.rstrip("\n"))
        match = re.match(r"FAILED: (?:\[code=\d+\] )?obj/(\S+)\.o", line)
        if match:
            failed.append(match.group(1) + ".cu")
    if proc.wait() != 0:
        details = []
        for name in failed:
            for spec in units[name].kernels if name in units else ():
                details.append(f"  {spec.name}  (declared at {spec.origin})")
        raise BuildError("build failed; the previously published library is unchanged.\n"
                         + ("Kernels that failed to compile:\n" + "\n".join(details)
                            if details else "See the compiler output above."))


def _compile_times(library_dir: Path, log_offset: int) -> dict[str, float]:
    """Seconds per translation unit compiled in this run, read from .ninja_log."""
    times: dict[str, float] = {}
    path = library_dir / ".ninja_log"
    if not path.exists():
        return times
    with open(path) as handle:
        handle.seek(log_offset)
        for line in handle:
            parts = line.split("\t")
            if len(parts) >= 4 and parts[3].startswith("obj/"):
                times[parts[3][4:-2] + ".cu"] = (int(parts[1]) - int(parts[0])) / 1000.0
    return times


def tuned_table_text(manifest_path: str | Path, kernels: list[KernelSpec], log: Callable[[str], None]) -> str | None:
    """The manifest's `<name>.tuned.yaml`, validated, if it matches this kernel set; None if
    there is none or it is stale (the manifest changed since `gemmgen tune`: warned, not used)."""
    path = table_path_for(manifest_path)
    if not path.exists():
        return None
    names = {k.name for k in kernels}
    table = load_table(path)
    if table.metadata["kernel_set"] != kernel_set_hash(names):
        log(f"gemmgen: warning: {path} was tuned for another kernel set; it is not published "
            "and dispatch uses the manifest's rules. Re-run `gemmgen tune`.")
        return None
    # every kernel it names must exist, and split_k go to split-K kernels (file:line if not)
    load_table(path, known_kernels=names,
               split_k_kernels={k.name for k in kernels if k.split_k})
    return path.read_text()


def _publish(library_dir: Path, shared_object: str, bindings: str, release: str,
             tuned_table: str | None = None) -> Path:
    published_root = library_dir / "lib"
    target = published_root / release
    if not target.exists():
        staging = published_root / f".{release}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        shutil.copy2(library_dir / "staging" / shared_object, staging / shared_object)
        (staging / BINDINGS_FILE).write_text(bindings)
        if tuned_table is not None:
            (staging / TUNED_TABLE_FILE).write_text(tuned_table)
        os.replace(staging, target)
    else:
        os.utime(target)  # republished: it is the newest again, so pruning keeps it
    link_tmp = library_dir / f".current.{os.getpid()}.tmp"
    link_tmp.unlink(missing_ok=True)
    link_tmp.symlink_to(Path("lib") / release)
    os.replace(link_tmp, library_dir / "current")
    versions = sorted((p for p in published_root.iterdir() if not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime, reverse=True)
    for old in versions[KEEP_PUBLISHED:]:
        if old.name != release:
            shutil.rmtree(old, ignore_errors=True)
    return target


def build_manifest(manifest_path: str | Path, build_root: Path, *, jobs: int | None = None,
                   allow_wgmma_serialization: bool = False, log: Callable[[str], None] = print) -> BuildReport:
    """Validate, generate, compile and publish the library of one manifest."""
    manifest: Manifest = load_manifest(manifest_path)
    kernels: list[KernelSpec] = expand(manifest)
    toolchain = find_toolchain()
    flags = toolchain.compile_flags(manifest.arch, sorted({k.family for k in kernels}))
    tuned_table = tuned_table_text(manifest_path, kernels, log)
    units = render_kernel_sources(manifest, kernels)
    print_id = fingerprint(units, toolchain, flags, allow_wgmma_serialization)
    so_name = shared_object_name(manifest.library)
    library_dir = build_root / manifest.library
    with _locked(library_dir):
        current = library_dir / "current"
        if current.exists() and not current.is_symlink():  # checked before anything compiles
            raise BuildError(f"{current} is not the symlink gemmgen publishes through (was the build "
                             "directory copied with links followed?); remove it and rebuild")
        sources = {u.name: u.source for u in units}
        sources[LIBRARY_SOURCE] = render_library_source(manifest, len(kernels), print_id, kernels)
        written, removed = write_tree(library_dir / "src", sources, (".cu",))
        for name in removed:
            (library_dir / "obj" / (name[:-3] + ".o")).unlink(missing_ok=True)
        ninja_text = ninja_file(python=sys.executable, nvcc=toolchain.nvcc, compile_flags=flags,
                                link_flags=LINK_FLAGS, sources=sorted(sources),
                                shared_object=f"staging/{so_name}",
                                allow_wgmma_serialization=allow_wgmma_serialization)
        write_tree(library_dir, {"build.ninja": ninja_text}, ())
        (library_dir / "staging").mkdir(exist_ok=True)
        jobs = jobs or max_parallel_jobs()
        log(f"gemmgen: {manifest.library}: {len(kernels)} kernels in {len(units)} translation "
            f"units; {len(written)} source(s) changed, {len(removed)} removed; {jobs} parallel jobs")
        ninja_log = library_dir / ".ninja_log"
        offset = ninja_log.stat().st_size if ninja_log.exists() else 0
        started = time.monotonic()
        _run_ninja(library_dir, jobs, {u.name: u for u in units}, log)
        times = _compile_times(library_dir, offset)
        bindings = render_bindings(manifest, kernels, print_id, so_name)
        # The published folder is keyed by library and bindings together: a dispatch-only edit
        # compiles nothing but still publishes new bindings.
        release = hashlib.sha256((print_id + bindings + (tuned_table or "")).encode()).hexdigest()[:16]
        published = _publish(library_dir, so_name, bindings, release, tuned_table)
    report = BuildReport(manifest.library, len(kernels), published, times, bool(times))
    if times:
        log(f"gemmgen: compiled {len(times)} translation unit(s) in "
            f"{time.monotonic() - started:.0f} s wall; slowest first:")
        for name, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
            per_kernel = len(next((u.kernels for u in units if u.name == name), ())) or 1
            log(f"  {seconds:7.1f} s  {name}  ({per_kernel} kernel(s))")
    log(f"gemmgen: published {published}")
    return report
