"""Build one manifest into a published kernel library: validate → render → ninja → publish.

Layout under the build directory, per library:

    <build>/<library>/src/*.cu            generated sources (written only when changed)
    <build>/<library>/obj/*.o             object files (ninja, incremental, nvcc depfiles)
    <build>/<library>/build.ninja
    <build>/<library>/staging/lib….so     the last successful link
    <build>/<library>/lib/<fingerprint>/  a published library + its generated bindings (+ the
                                          manifest's tuned tables, tuned.<gpu>.yaml)
    <build>/<library>/current ->          symlink to the published one; swapped atomically

NOTES: the shared object and its bindings are published together by one symlink swap, so a
reader never sees a new library with old bindings, and a failed or interrupted build leaves the
previous `current` untouched.

Robustness (all under the per-library lock, `<library>/.lock`, an flock the kernel drops when
its holder dies, however it dies):
- ninja runs in its own session; an exception or signal in the build stops it. A `kill -9` of the
  build cannot be caught, so ninja's pid/session is recorded in `<library>/.ninja.json` and the
  next build stops what is left of that session (in this directory) before starting its own.
- every object's compile command carries the toolchain identity (nvcc version, CUTLASS headers,
  flags): another compiler or other headers at the same paths recompile everything.
- the release folder is keyed by the content of what was linked (+ bindings + table), and it
  carries `checksums.json`; a release folder whose files do not match it is re-published.
- temporaries of an interrupted build are removed by the next one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..bindings.library import (CHECKSUMS_FILE, checksums_of, damaged_files, file_sha256,
                                read_checksums)
from ..errors import BuildError
from ..generator.expand import expand
from ..generator.kernel_config import KernelSpec
from ..generator.manifest import Manifest, load_manifest
from ..generator.render import (BINDINGS_FILE, LIBRARY_SOURCE, TranslationUnit, include_dirs,
                                render_bindings, render_kernel_sources, render_library_source,
                                write_tree)
from ..tuning.table import (fit_table, kernel_set_hash, load_table, published_table_name,
                             table_path_for, table_paths_for)
from .ninja_file import ninja_file
from .toolchain import LINK_FLAGS, Toolchain, find_toolchain, max_parallel_jobs

KEEP_PUBLISHED = 2  # the current library and the one before it (a running process may hold it)
NINJA_STATE = ".ninja.json"  # the running ninja (pid = session id, start time) while a build runs
STAGING_STATE = ".staging.json"  # size, mtime and sha256 of the staging library last published
NINJA_STOP_SECONDS = 10.0  # SIGTERM → SIGKILL grace for a ninja being stopped


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


def cutlass_tree_digest(cutlass_root: Path) -> str:
    """Identity of the CUTLASS headers a compile reads: version.h's text plus every file's
    (path, size, mtime) under the two include roots. Cheap (~900 stats, ~20 ms, no file read
    but one) and it changes on an in-place header edit or a reinstall, which the wheel's RECORD
    (hashes of the files as shipped) would not see; a reinstall of the same wheel costs a
    needless full rebuild, never a stale object."""
    h = hashlib.sha256()
    version = cutlass_root / "include" / "cutlass" / "version.h"
    h.update(version.read_bytes() if version.is_file() else b"no version.h")
    for root in (cutlass_root / "include", cutlass_root / "tools" / "util" / "include"):
        h.update(b"\0root\0" + str(root).encode())
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                h.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def toolchain_identity(toolchain: Toolchain, flags: list[str]) -> str:
    """What every object is keyed by besides its source (see ninja_file's `toolchain_id`)."""
    h = hashlib.sha256()
    for part in (toolchain.nvcc_version, toolchain.cutlass_version,
                 cutlass_tree_digest(toolchain.cutlass_root), " ".join(flags), " ".join(LINK_FLAGS)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Cross-process lock: two builds of one library never interleave. An flock belongs to the
    open file, which the kernel closes when the process dies (kill -9 included), and the file is
    opened close-on-exec so ninja and nvcc never inherit it: a dead build never holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, process group, session, start time in clock ticks) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[2]), int(rest[3]), int(rest[19])


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _session_members(session: int, directory: Path) -> list[int]:
    """Live processes of `session` that run in `directory` (ninja -C and every compiler it
    starts do): what is left of a build's ninja. The directory check keeps a reused session id
    from naming anything else."""
    found = []
    where = str(directory.resolve())
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        stat = _proc_stat(int(entry.name))
        if stat is None or stat[2] != session or stat[0] in ("Z", "X"):
            continue
        try:
            cwd = os.readlink(f"/proc/{entry.name}/cwd")
        except OSError:
            continue
        if cwd == where:
            found.append(int(entry.name))
    return found


def _stop_session(leader: int, members: list[int], wait: Callable[[float], bool]) -> None:
    """SIGTERM the ninja (it stops its compiles and removes their partial outputs); after
    NINJA_STOP_SECONDS, SIGKILL whatever of the session is left."""
    for pid in ([leader] if leader in members else members):
        try:
            os.killpg(pid, signal.SIGTERM) if pid == leader else os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    if wait(NINJA_STOP_SECONDS):
        return
    for pid in members:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    wait(NINJA_STOP_SECONDS)


def _poll_until(done, deadline: float) -> bool:
    """Whether `done()` became true before time.monotonic() reached `deadline` (polled every
    50 ms)."""
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _stop_leftover_ninja(library_dir: Path, log: Callable[[str], None]) -> None:
    """Stop the ninja of a build that died without stopping it (kill -9): it would compile the
    same objects beside ours. Called with the lock held, so no live build owns that ninja."""
    state_path = library_dir / NINJA_STATE
    try:
        state = json.loads(state_path.read_text())
        leader, start = int(state["pid"]), int(state["start"])
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):
        state_path.unlink(missing_ok=True)
        return
    members = _session_members(leader, library_dir)
    stat = _proc_stat(leader)
    if stat is not None and stat[3] != start:  # the pid was reused: that is not our ninja
        members = [pid for pid in members if pid != leader]
    if members:
        log(f"gemmgen: stopping the ninja (pid {leader}, {len(members)} process(es)) left running "
            f"in {library_dir} by a build that was killed")

        def wait(seconds: float) -> bool:
            return _poll_until(lambda: not any(_alive(pid) for pid in members),
                               time.monotonic() + seconds)

        _stop_session(leader, members, wait)
    state_path.unlink(missing_ok=True)


def _clean_temporaries(library_dir: Path) -> None:
    """Temporaries of a build that was interrupted (under the lock, none is in use)."""
    patterns = [(library_dir / "lib", ".*.tmp"), (library_dir, ".current.*.tmp"),
                (library_dir, "*.tmp"), (library_dir / "src", "*.tmp"),
                (library_dir / "staging", "*.tmp"), (library_dir / "obj", "*.tmp")]
    for folder, pattern in patterns:
        if not folder.is_dir():
            continue
        for path in folder.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


_NINJA_STATUS = re.compile(r"\[(\d+)/(\d+) (\d+(?:\.\d+)?)s\] ")


def _with_eta(line: str) -> str:
    """ninja's `[finished/total elapsed]` status plus the time left: wall seconds per finished
    edge (mean compile time / parallel jobs) × edges left."""
    match = _NINJA_STATUS.match(line)
    if not match:
        return line
    done, total, elapsed = int(match.group(1)), int(match.group(2)), float(match.group(3))
    if not 0 < done < total:
        return line
    left = elapsed / done * (total - done)
    text = f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"
    return f"{line}  (~{text} left)"


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class _Signalled(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP raise (in the main thread) so that the build stops its ninja on the way
    out; the process then exits as the signal would have made it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_(signum, frame):
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, raise_) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    except _Signalled as exc:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        previous = {}
        raise SystemExit(128 + exc.signum) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_ninja(library_dir: Path, jobs: int, units: dict[str, TranslationUnit],
               log: Callable[[str], None]) -> None:
    ninja = shutil.which("ninja")
    if ninja is None:
        raise BuildError("ninja not found: `pip install ninja` (a dependency of gemmgen)")
    env = dict(os.environ, NINJA_STATUS="[%f/%t %es] ")
    state_path = library_dir / NINJA_STATE
    failed: list[str] = []
    with _signals_raise():
        # Its own session (and process group): a Ctrl-C of the terminal reaches gemmgen only,
        # which stops ninja below; the session id finds its compilers if gemmgen is killed.
        proc = subprocess.Popen([ninja, "-C", str(library_dir), "-j", str(jobs)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            stat = _proc_stat(proc.pid)
            _write_json_atomic(state_path, {"pid": proc.pid, "start": stat[3] if stat else -1,
                                            "directory": str(library_dir.resolve())})
            assert proc.stdout is not None
            for line in proc.stdout:
                log(_with_eta(line.rstrip("\n")))
                match = re.match(r"FAILED: (?:\[code=\d+\] )?obj/(\S+)\.o", line)
                if match:
                    failed.append(match.group(1) + ".cu")
            status = proc.wait()
        except BaseException:
            if proc.poll() is None:
                def wait(seconds: float) -> bool:
                    # ninja, then every compiler of its session: a process signalled a moment
                    # ago may still be exiting when ninja is reaped (once seen in CI after the
                    # SIGKILL round), and the next build must not start beside it
                    deadline = time.monotonic() + seconds
                    try:
                        proc.wait(timeout=seconds)
                    except subprocess.TimeoutExpired:
                        return False
                    return _poll_until(lambda: not _session_members(proc.pid, library_dir),
                                       deadline)

                _stop_session(proc.pid, [proc.pid, *_session_members(proc.pid, library_dir)], wait)
            raise
        finally:
            if proc.poll() is not None:
                state_path.unlink(missing_ok=True)
            if proc.stdout is not None:
                proc.stdout.close()
    if status != 0:
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


def tuned_table_status(manifest_path: str | Path, kernels: list[KernelSpec],
                       path: str | Path | None = None) -> tuple[str | None, str, str | None]:
    """(the text to publish or None, a status for `gemmgen validate`, a line to log or None) of
    one tuned table of the manifest (`path`; default its `<name>.tuned.yaml`).

    A table tuned for this kernel set must name only its kernels (file:line ManifestError). One
    tuned for another kernel set (the manifest changed since `gemmgen tune`) is published when
    at least one bucket still fits (`fit_table`: buckets naming a kernel the library no longer
    has are holes at load, served by the rules; new kernels are not in it); status and log line
    say how partial it is. A table with nothing left is not published ("stale, not used")."""
    path = Path(path) if path is not None else table_path_for(manifest_path)
    if not path.exists():
        return None, "none", None
    names = {k.name for k in kernels}
    own = kernel_set_hash(names)
    # tuned for this kernel set: every kernel it names must exist, and split_k go to split-K
    # kernels (file:line if not)
    table = load_table(path, known_kernels=names, split_k_kernels={k.name for k in kernels if k.split_k},
                       if_kernel_set=own)
    if table.metadata["kernel_set"] == own:
        return path.read_text(), "OK", None
    fit = fit_table(table, kernels).fit
    if not fit.usable:
        return None, "stale, not used", (
            f"gemmgen: warning: {path} was tuned for another kernel set and none of its "
            f"{fit.buckets} buckets fits this one (their kernels are gone); it is not "
            "published and dispatch uses the manifest's rules. Re-run `gemmgen tune`.")
    return (path.read_text(), fit.note().removeprefix("tuned table "),
            f"gemmgen: note: {path.name}: {fit.note()}")


def tuned_tables_text(manifest_path: str | Path, kernels: list[KernelSpec],
                      log: Callable[[str], None]) -> dict[str, str]:
    """The manifest's tuned tables (`<name>.tuned.yaml`, `<name>.tuned.<gpu>.yaml`), validated,
    to publish with the library, by their published names (`tuned.yaml`, `tuned.<gpu>.yaml`):
    whole when tuned for this kernel set, partial (logged: how many shape entries are kept, how
    many kernels are new) when the manifest changed since; left out when nothing of one fits
    (warned)."""
    published: dict[str, str] = {}
    for path in table_paths_for(manifest_path):
        text, _, message = tuned_table_status(manifest_path, kernels, path)
        if message is not None:
            log(message)
        if text is not None:
            published[published_table_name(path, manifest_path)] = text
    return published


def _intact(target: Path, names: set[str], shared_object: str, so_sha256: str | None) -> bool:
    """A published folder whose checksum record names exactly `names`, all matching (and its
    shared object is the staging one, when its sha256 is given)."""
    try:
        record = read_checksums(target)
    except ValueError:
        return False
    return (record is not None and set(record["files"]) == names
            and so_sha256 in (None, record["files"][shared_object]["sha256"])
            and not damaged_files(target, record, cached=False))


def _publish(library_dir: Path, shared_object: str, bindings: str, release: str,
             tuned_tables: dict[str, str] | None = None, *, manifest: str | None = None,
             so_sha256: str | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Publish staging/<shared object> + bindings (+ table) as lib/<release> and swap `current`
    to it. A release folder that exists but does not match its checksums (damaged, truncated,
    or published without them) is published again from staging."""
    published_root = library_dir / "lib"
    published_root.mkdir(parents=True, exist_ok=True)
    target = published_root / release
    tuned_tables = tuned_tables or {}
    names = {shared_object, BINDINGS_FILE} | set(tuned_tables)
    link_tmp = library_dir / f".current.{os.getpid()}.tmp"
    staging = published_root / f".{release}.{os.getpid()}.tmp"
    damaged = published_root / f".{release}.{os.getpid()}.damaged.tmp"
    try:
        if not _intact(target, names, shared_object, so_sha256):
            if target.exists() and log is not None:
                log(f"gemmgen: {target} does not match its checksums; publishing it again")
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            shutil.copy2(library_dir / "staging" / shared_object, staging / shared_object)
            (staging / BINDINGS_FILE).write_text(bindings)
            for table_name, text in tuned_tables.items():
                (staging / table_name).write_text(text)
            record = checksums_of(staging, names, manifest)
            if so_sha256 is not None and record["files"][shared_object]["sha256"] != so_sha256:
                raise BuildError(f"copying staging/{shared_object} to {staging} changed its content "
                                 "(disk full or failing?); nothing was published")
            (staging / CHECKSUMS_FILE).write_text(json.dumps(record, indent=1) + "\n")
            if target.exists():  # a damaged folder: moved aside, replaced, then removed
                os.replace(target, damaged)
            os.replace(staging, target)
        else:
            os.utime(target)  # republished: it is the newest again, so pruning keeps it
        link_tmp.unlink(missing_ok=True)
        link_tmp.symlink_to(Path("lib") / release)
        os.replace(link_tmp, library_dir / "current")
    finally:
        link_tmp.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(damaged, ignore_errors=True)
    versions = sorted((p for p in published_root.iterdir() if not p.name.startswith(".")),
                      key=lambda p: p.stat().st_mtime, reverse=True)
    for old in versions[KEEP_PUBLISHED:]:
        if old.name != release:
            shutil.rmtree(old, ignore_errors=True)
    return target


def _staging_digest(library_dir: Path, so_name: str) -> str | None:
    """sha256 of the staging library; None when it is not the file last published under the
    same size and mtime (it was damaged in place: ninja, which looks at mtimes, would not
    relink it)."""
    path = library_dir / "staging" / so_name
    st = path.stat()
    digest = file_sha256(path)
    try:
        last = json.loads((library_dir / STAGING_STATE).read_text())
    except (OSError, ValueError):
        return digest
    if (last.get("size"), last.get("mtime_ns")) == (st.st_size, st.st_mtime_ns) and last.get("sha256") != digest:
        return None
    return digest


def build_manifest(manifest_path: str | Path, build_root: Path, *, jobs: int | None = None,
                   allow_wgmma_serialization: bool = False, log: Callable[[str], None] = print) -> BuildReport:
    """Validate, generate, compile and publish the library of one manifest."""
    manifest: Manifest = load_manifest(manifest_path)
    kernels: list[KernelSpec] = expand(manifest)
    toolchain = find_toolchain()
    flags = toolchain.compile_flags(manifest.arch, sorted({k.family for k in kernels}))
    tuned_tables = tuned_tables_text(manifest_path, kernels, log)
    units = render_kernel_sources(manifest, kernels)
    print_id = fingerprint(units, toolchain, flags, allow_wgmma_serialization)
    so_name = shared_object_name(manifest.library)
    library_dir = build_root / manifest.library
    with _locked(library_dir):
        _stop_leftover_ninja(library_dir, log)
        _clean_temporaries(library_dir)
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
                                allow_wgmma_serialization=allow_wgmma_serialization,
                                toolchain_id=toolchain_identity(toolchain, flags))
        write_tree(library_dir, {"build.ninja": ninja_text}, ())
        (library_dir / "staging").mkdir(exist_ok=True)
        jobs = jobs or max_parallel_jobs()
        log(f"gemmgen: {manifest.library}: {len(kernels)} kernels in {len(units)} translation "
            f"units; {len(written)} source(s) changed, {len(removed)} removed; {jobs} parallel jobs")
        ninja_log = library_dir / ".ninja_log"
        offset = ninja_log.stat().st_size if ninja_log.exists() else 0
        started = time.monotonic()
        _run_ninja(library_dir, jobs, {u.name: u for u in units}, log)
        so_digest = _staging_digest(library_dir, so_name)
        if so_digest is None:
            log(f"gemmgen: staging/{so_name} changed since it was linked (damaged?); linking again")
            (library_dir / "staging" / so_name).unlink()
            _run_ninja(library_dir, jobs, {u.name: u for u in units}, log)
            so_digest = file_sha256(library_dir / "staging" / so_name)
        times = _compile_times(library_dir, offset)
        bindings = render_bindings(manifest, kernels, print_id, so_name)
        # The published folder is keyed by the content of what was linked, with the bindings and
        # the table: a dispatch-only edit compiles nothing but still publishes new bindings, and
        # a relink (a header edit under the same CUTLASS version) is always published.
        tables_text = "\0".join(f"{name}\0{text}" for name, text in sorted(tuned_tables.items()))
        release = hashlib.sha256("\0".join((so_digest, bindings, tables_text)).encode()).hexdigest()[:16]
        published = _publish(library_dir, so_name, bindings, release, tuned_tables,
                             manifest=str(Path(manifest_path).resolve()), so_sha256=so_digest, log=log)
        st = (library_dir / "staging" / so_name).stat()
        _write_json_atomic(library_dir / STAGING_STATE,
                           {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": so_digest})
    report = BuildReport(manifest.library, len(kernels), published, times, bool(times))
    if times:
        log(f"gemmgen: compiled {len(times)} translation unit(s) in "
            f"{time.monotonic() - started:.0f} s wall; slowest first:")
        for name, seconds in sorted(times.items(), key=lambda kv: -kv[1]):
            per_kernel = len(next((u.kernels for u in units if u.name == name), ())) or 1
            log(f"  {seconds:7.1f} s  {name}  ({per_kernel} kernel(s))")
    log(f"gemmgen: published {published}")
    return report
