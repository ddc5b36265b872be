"""Robustness of build → publish → load, with a fake nvcc (a Python script): a killed build and
its ninja, a toolchain or header change at the same paths, damaged published files, leaked
temporaries, tables written in place, bindings that do not fit. Linux only (/proc, flock)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from gemmgen import families as registry
from gemmgen.bindings import library as binding_library
from gemmgen.build import builder, toolchain
from gemmgen.build.ninja_file import ninja_file
from gemmgen.errors import LibraryNotBuiltError
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest
from gemmgen.generator.render import render_bindings

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists() or shutil.which("ninja") is None,
                                reason="needs Linux /proc and ninja")

# ------------------------------------------------------------------ fake nvcc

FAKE_NVCC = r'''#!{python}
"""Fake nvcc: `--version` from STATE/version; a compile writes an object naming the compiler
version, the source and STATE/header.h (listed in the depfile), after sleeping STATE/sleep
seconds; a link concatenates its inputs. Every compile is logged to STATE/log."""
import os, pathlib, sys, time
state = pathlib.Path({state!r})
argv = sys.argv[1:]
version = (state / "version").read_text()
if argv == ["--version"]:
    print("nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n" + version)
    sys.exit(0)
out = pathlib.Path(argv[argv.index("-o") + 1])
if "-c" in argv:
    source = argv[argv.index("-c") + 1]
    sleep = float((state / "sleep").read_text() or 0)
    with open(state / "log", "a") as log:
        log.write(f"start {{out}} {{os.getpid()}} {{sleep}} {{version}}\n")
    time.sleep(sleep)
    header = state / "header.h"
    out.write_text(f"object of {{source}} by {{version}} with {{header.read_text()}}\n")
    dep = pathlib.Path(argv[argv.index("-MF") + 1])
    dep.write_text(f"{{out}}: {{source}} {{header}}\n")
    with open(state / "log", "a") as log:
        log.write(f"done {{out}} {{os.getpid()}} {{version}}\n")
else:
    inputs = [a for a in argv if a.endswith(".o")]
    out.write_text("".join(pathlib.Path(i).read_text() for i in inputs))
'''


class FakeNvcc:
    def __init__(self, directory: Path):
        self.state = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / "nvcc"
        self.path.write_text(FAKE_NVCC.format(python=sys.executable, state=str(directory)))
        self.path.chmod(0o755)
        self.set(version="Build fake_1", sleep=0, header="header v1")
        (directory / "log").write_text("")

    def set(self, *, version: str | None = None, sleep: float | None = None, header: str | None = None):
        if version is not None:
            (self.state / "version").write_text(version)
        if sleep is not None:
            (self.state / "sleep").write_text(str(sleep))
        if header is not None:
            (self.state / "header.h").write_text(header)

    def log(self) -> list[list[str]]:
        return [line.split() for line in (self.state / "log").read_text().splitlines()]

    def compiles(self) -> list[str]:
        return [parts[1] for parts in self.log() if parts[0] == "done"]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    nvcc = FakeNvcc(tmp_path / "fake")
    monkeypatch.setenv("CUDACXX", str(nvcc.path))
    toolchain.find_toolchain.cache_clear()
    yield nvcc
    toolchain.find_toolchain.cache_clear()


@pytest.fixture
def manifest(tmp_path, minimal_manifest) -> Path:
    path = tmp_path / "one.yaml"
    path.write_text(minimal_manifest("one"))
    return path


def build(manifest: Path, root: Path, log: list[str] | None = None, **kw) -> builder.BuildReport:
    toolchain.find_toolchain.cache_clear()  # the fake's version may have changed
    return builder.build_manifest(manifest, root, jobs=2, log=(log if log is not None else []).append, **kw)


def processes_in(directory: Path) -> list[int]:
    """Live processes whose working directory is `directory` (ninja -C and its compilers)."""
    where = str(directory.resolve())
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry.name}/cwd") != where:
                continue
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_for(predicate, seconds: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def published_so(root: Path) -> Path:
    return root / "one" / "current" / "libgemmgen_one.so"


def staging_so(root: Path) -> Path:
    return root / "one" / "staging" / "libgemmgen_one.so"


# ------------------------------------------------- 1. lock, killed build, ninja

LOCK_HOLDER = """
import sys, time
from pathlib import Path
from gemmgen.build import builder
with builder._locked(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_lock_of_a_killed_holder_is_taken_over(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path / "lib")],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "locked"
        import fcntl
        with open(tmp_path / "lib" / ".lock", "a") as handle:  # held: a second taker must wait
            with pytest.raises(BlockingIOError):
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        started = time.monotonic()
        with builder._locked(tmp_path / "lib"):
            pass
        assert time.monotonic() - started < 2.0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


BUILDER = """
import sys
from pathlib import Path
from gemmgen.build import builder
builder.build_manifest(sys.argv[1], Path(sys.argv[2]), jobs=2, log=lambda line: print(line, flush=True))
"""


def _start_slow_build(fake: FakeNvcc, manifest: Path, root: Path) -> subprocess.Popen:
    fake.set(sleep=120)
    proc = subprocess.Popen([sys.executable, "-c", BUILDER, str(manifest), str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
                            env=dict(os.environ, CUDACXX=str(fake.path)))
    wait_for(lambda: len([p for p in fake.log() if p[0] == "start"]) == 2, what="both compiles to start")
    return proc


def test_kill_9_of_a_build_its_ninja_is_stopped_by_the_next_build(fake, manifest, tmp_path):
    root = tmp_path / "build"
    library_dir = root / "one"
    first = _start_slow_build(fake, manifest, root)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    orphans = processes_in(library_dir)
    assert orphans, "ninja and its compile survive a kill -9 of the build (they cannot be caught)"
    fake.set(sleep=0)
    log: list[str] = []
    build(manifest, root, log)
    assert any("stopping the ninja" in line and "left running" in line for line in log)
    assert processes_in(library_dir) == []
    assert not any(Path(f"/proc/{pid}").exists() and pid in processes_in(library_dir) for pid in orphans)
    # The killed build's compiles were stopped, never finished beside ours: each object once.
    slow = {p[2] for p in fake.log() if p[0] == "start" and float(p[3]) > 0}
    assert len(slow) == 2 and not slow & {p[2] for p in fake.log() if p[0] == "done"}
    done = fake.compiles()
    assert sorted(done) == sorted(set(done)) and len(done) == 2
    assert published_so(root).read_bytes() == staging_so(root).read_bytes()
    assert not (library_dir / builder.NINJA_STATE).exists()


def test_sigterm_of_a_build_stops_its_ninja(fake, manifest, tmp_path):
    root = tmp_path / "build"
    proc = _start_slow_build(fake, manifest, root)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    wait_for(lambda: processes_in(root / "one") == [], seconds=15, what="ninja to stop")
    assert not (root / "one" / builder.NINJA_STATE).exists()
    assert not (root / "one" / "current").exists()


def test_ctrl_c_during_ninja_stops_it(fake, manifest, tmp_path):
    """KeyboardInterrupt (or any exception) in the build while ninja runs: ninja (in its own
    session, so the terminal's Ctrl-C reaches only gemmgen) and its compiles are stopped."""
    import threading
    root = tmp_path / "build"
    fake.set(sleep=120)

    def interrupt() -> None:
        wait_for(lambda: len([p for p in fake.log() if p[0] == "start"]) == 2, what="compiles")
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    toolchain.find_toolchain.cache_clear()
    # Python's own SIGINT handler, as in a terminal: a process started in the background by a
    # non-interactive shell (e.g. `nohup pytest &`) inherits SIGINT ignored, and Python then
    # installs none, so the signal would never arrive as KeyboardInterrupt
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            builder.build_manifest(manifest, root, jobs=2, log=lambda line: None)
    finally:
        thread.join()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 60
    assert processes_in(root / "one") == []
    assert not (root / "one" / builder.NINJA_STATE).exists()
    fake.set(sleep=0)
    build(manifest, root)  # and the next build just works
    assert published_so(root).read_bytes() == staging_so(root).read_bytes()


def test_leftover_state_of_another_process_is_not_acted_on(tmp_path):
    """A recorded pid that is now some other process (other start time, other directory) is
    left alone."""
    library_dir = tmp_path / "one"
    library_dir.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        (library_dir / builder.NINJA_STATE).write_text(json.dumps({"pid": sleeper.pid, "start": 1}))
        builder._stop_leftover_ninja(library_dir, lambda line: None)
        assert sleeper.poll() is None
        assert not (library_dir / builder.NINJA_STATE).exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# ---------------------------------------------- 2. toolchain identity per object

NINJA_ARGS = dict(python="/usr/bin/python3", nvcc="/opt/cuda/bin/nvcc", compile_flags=["-O3"],
                  link_flags=["-shared"], sources=["library.cu", "k.cu"],
                  shared_object="staging/libgemmgen_t.so", allow_wgmma_serialization=False)


def test_ninja_file_keys_objects_by_toolchain():
    a = ninja_file(**NINJA_ARGS, toolchain_id="aaaa")
    assert a == ninja_file(**NINJA_ARGS, toolchain_id="aaaa")
    assert "cflags = -O3 -DGEMMGEN_TOOLCHAIN=aaaa" in a.splitlines()
    assert "  command = $guard -- $nvcc $cflags -MD -MF $out.d -c $in -o $out" in a.splitlines()
    b = ninja_file(**NINJA_ARGS, toolchain_id="bbbb")
    assert [l for l in a.splitlines() if l.startswith("cflags")] != [l for l in b.splitlines() if l.startswith("cflags")]
    assert "GEMMGEN_TOOLCHAIN" not in ninja_file(**NINJA_ARGS)


def test_toolchain_identity(tmp_path):
    root = tmp_path / "cutlass"
    (root / "include" / "cutlass").mkdir(parents=True)
    (root / "tools" / "util" / "include").mkdir(parents=True)
    header = root / "include" / "cutlass" / "gemm.h"
    header.write_text("// v1\n")
    (root / "include" / "cutlass" / "version.h").write_text("#define CUTLASS_MAJOR 4\n")
    tc = toolchain.Toolchain("nvcc", "Build a", root, "4.2.0")
    base = builder.toolchain_identity(tc, ["-O3"])
    assert builder.toolchain_identity(tc, ["-O3"]) == base
    assert builder.toolchain_identity(toolchain.Toolchain("nvcc", "Build b", root, "4.2.0"), ["-O3"]) != base
    assert builder.toolchain_identity(tc, ["-O2"]) != base
    header.write_text("// v2, same CUTLASS version\n")
    assert builder.toolchain_identity(tc, ["-O3"]) != base
    stamp = builder.toolchain_identity(tc, ["-O3"])
    os.utime(header, ns=(1, 1))  # same size, older mtime: e.g. a reinstall from a wheel
    assert builder.toolchain_identity(tc, ["-O3"]) != stamp


def test_nvcc_change_at_the_same_path_recompiles_every_object(fake, manifest, tmp_path):
    root = tmp_path / "build"
    first = build(manifest, root)
    assert len(fake.compiles()) == 2  # the kernel unit and library.cu
    build(manifest, root)
    assert len(fake.compiles()) == 2  # nothing changed: nothing compiled
    fake.set(version="Build fake_2")
    second = build(manifest, root)
    assert sorted(fake.compiles()[2:]) == sorted(fake.compiles()[:2])  # every object again
    assert "fake_1" not in published_so(root).read_text()
    assert published_so(root).read_text().count("fake_2") == 2
    assert second.published != first.published


# -------------------------------------------------- 3. a relink is always published

def test_header_change_with_the_same_versions_publishes_the_new_library(fake, manifest, tmp_path):
    root = tmp_path / "build"
    first = build(manifest, root)
    fake.set(header="header v2")  # a header the depfile names: recompiled and relinked
    second = build(manifest, root)
    assert len(fake.compiles()) == 4
    assert published_so(root).read_bytes() == staging_so(root).read_bytes()
    assert "header v2" in published_so(root).read_text()
    assert second.published != first.published
    assert (root / "one" / "current").resolve() == second.published.resolve()


# ------------------------------------------ 4. checksums: recorded, checked, repaired

def test_publish_records_checksums(fake, manifest, tmp_path):
    root = tmp_path / "build"
    report = build(manifest, root)
    record = json.loads((report.published / binding_library.CHECKSUMS_FILE).read_text())
    assert record["manifest"] == str(manifest.resolve())
    assert set(record["files"]) == {"libgemmgen_one.so", "bindings.py"}
    for name, entry in record["files"].items():
        data = (report.published / name).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == __import__("hashlib").sha256(data).hexdigest()


@pytest.mark.parametrize("damage", ["truncate", "zero", "delete", "bindings", "checksums"])
def test_build_repairs_a_damaged_published_library(fake, manifest, tmp_path, damage):
    root = tmp_path / "build"
    report = build(manifest, root)
    so = published_so(root)
    good = so.read_bytes()
    if damage == "truncate":
        so.write_bytes(b"")
    elif damage == "zero":
        so.write_bytes(b"\0" * 16 + good[16:])
    elif damage == "delete":
        so.unlink()
    elif damage == "bindings":
        (root / "one" / "current" / "bindings.py").write_text("garbage")
    else:
        (root / "one" / "current" / binding_library.CHECKSUMS_FILE).write_text("{")
    log: list[str] = []
    again = build(manifest, root, log)
    assert so.read_bytes() == good
    assert again.published == report.published and again.compile_seconds == {}
    assert any("does not match its checksums; publishing it again" in line for line in log)
    record = binding_library.read_checksums(again.published)
    assert binding_library.damaged_files(again.published, record, cached=False) == []
    assert not [p for p in (root / "one" / "lib").iterdir() if p.name.startswith(".")]


def test_damaged_staging_library_is_relinked(fake, manifest, tmp_path):
    root = tmp_path / "build"
    build(manifest, root)
    staging = staging_so(root)
    st = staging.stat()
    good = staging.read_bytes()
    staging.write_bytes(b"X" * len(good))  # same size, mtime restored: ninja would not see it
    os.utime(staging, ns=(st.st_atime_ns, st.st_mtime_ns))
    log: list[str] = []
    build(manifest, root, log)
    assert any("linking again" in line for line in log)
    assert staging.read_bytes() == good and published_so(root).read_bytes() == good


# A real loadable library without nvcc: a C stub with the symbols of the generated library,
# padded to the size of a real one.
STUB_C = """
#include <stddef.h>
static const char fingerprint[] = "{fingerprint}";
const char* gemmgen_last_error(void) {{ return ""; }}
const char* gemmgen_library_fingerprint(void) {{ return fingerprint; }}
size_t {size_symbol}(void) {{ return {args_size}; }}
int gemmgen_run_{kernel}(void* a, void* w, size_t n, void* s) {{ return 5; }}
size_t gemmgen_workspace_{kernel}(void* a) {{ return 0; }}
__attribute__((used)) const unsigned char padding[{padding}] = {{1, [{padding} - 1] = 1}};
"""


@pytest.fixture
def stub_release(tmp_path, manifest):
    """A published folder (builder._publish) of a real .so (gcc) + its bindings, ~7 MB."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    loaded = load_manifest(manifest)
    kernels = expand(loaded)
    (kernel,) = kernels
    family = registry.get(kernel.family)
    source = tmp_path / "stub.c"
    source.write_text(STUB_C.format(fingerprint="f" * 16, size_symbol=family.args.size_symbol,
                                    args_size=ctypes.sizeof(family.args.mirror), kernel=kernel.name,
                                    padding=7 << 20))
    library_dir = tmp_path / "build" / "one"
    (library_dir / "staging").mkdir(parents=True)
    so = library_dir / "staging" / "libgemmgen_one.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(source)], check=True)
    data = bytearray(so.read_bytes())
    data[1 << 20:6 << 20] = b"\xa5" * (5 << 20)  # inside the padding: bytes that zeroing changes
    so.write_bytes(bytes(data))
    bindings = render_bindings(loaded, kernels, "f" * 16, "libgemmgen_one.so")
    published = builder._publish(library_dir, "libgemmgen_one.so", bindings, "r1",
                                 manifest=str(manifest.resolve()))
    return SimpleNamespace(folder=published, so=published / "libgemmgen_one.so", manifest=manifest,
                           kernel=kernel.name)


def _expect_damaged(stub, match: str) -> LibraryNotBuiltError:
    with pytest.raises(LibraryNotBuiltError, match=match) as info:
        binding_library.load_library(stub.folder)
    message = str(info.value)
    assert str(stub.folder.parent.parent) in message  # the library folder
    assert f"`gemmgen build {stub.manifest.resolve()}`" in message  # the repairing command
    return info.value


def test_stub_library_loads(stub_release):
    library = binding_library.load_library(stub_release.folder)
    assert set(library.kernels) == {stub_release.kernel}


def test_load_rejects_zeroed_bytes(stub_release):
    data = bytearray(stub_release.so.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64 * 1024] = bytes(64 * 1024)
    stub_release.so.write_bytes(bytes(data))
    # (the damage is in the padding: without the checksum, this library would load)
    _expect_damaged(stub_release, r"does not match its checksums: libgemmgen_one\.so differs")


def test_load_rejects_a_truncated_library(stub_release):
    with open(stub_release.so, "r+b") as handle:
        handle.truncate(4096)
    _expect_damaged(stub_release, r"libgemmgen_one\.so has 4096 bytes")


def test_load_hashes_each_file_once_per_process(stub_release, monkeypatch):
    binding_library._DIGESTS.clear()
    calls = []
    real = binding_library.file_sha256
    monkeypatch.setattr(binding_library, "file_sha256", lambda path: calls.append(path) or real(path))
    binding_library.load_library(stub_release.folder)
    assert len(calls) == 2  # the .so and the bindings
    binding_library.load_library(stub_release.folder)
    assert len(calls) == 2
    data = bytearray(stub_release.so.read_bytes())
    data[-1] ^= 0xFF
    # NOTES: replaced by a new file, not rewritten in place: this process has the old one mapped
    # (dlopen), and changing a mapped library's pages under it crashes the process at exit.
    replacement = stub_release.so.with_name(stub_release.so.name + ".new")
    replacement.write_bytes(bytes(data))
    os.replace(replacement, stub_release.so)  # new inode and mtime: hashed again, and caught
    with pytest.raises(LibraryNotBuiltError):
        binding_library.load_library(stub_release.folder)


# ------------------------------------------------------ 7. bindings that do not fit

def _rerecord(stub) -> None:
    """Checksums that match the (edited) files: what a gemmgen of another version published."""
    record = binding_library.checksums_of(stub.folder, ["libgemmgen_one.so", "bindings.py"],
                                          str(stub.manifest.resolve()))
    (stub.folder / binding_library.CHECKSUMS_FILE).write_text(json.dumps(record))


def test_bindings_with_an_unexpected_field(stub_release):
    bindings = stub_release.folder / "bindings.py"
    text = bindings.read_text()
    assert "origin=Origin(" in text
    bindings.write_text(text.replace("origin=Origin(", "unexpected=1, origin=Origin(", 1))
    _rerecord(stub_release)
    error = _expect_damaged(stub_release, r"cannot load the bindings .*TypeError")
    assert "unexpected" in str(error)


@pytest.mark.parametrize("with_checksums", [True, False], ids=["checksummed", "legacy"])
def test_bindings_that_do_not_import(stub_release, with_checksums):
    bindings = stub_release.folder / "bindings.py"
    bindings.write_text(bindings.read_text() + "\ndef broken(:\n")
    if with_checksums:
        _rerecord(stub_release)
    else:
        (stub_release.folder / binding_library.CHECKSUMS_FILE).unlink()
    _expect_damaged(stub_release, r"cannot load the bindings .*SyntaxError")


def test_damaged_checksum_file(stub_release):
    (stub_release.folder / binding_library.CHECKSUMS_FILE).write_text('{"files": {}}')
    _expect_damaged(stub_release, r"checksums\.json is damaged")


def test_legacy_release_without_checksums_still_loads(stub_release):
    (stub_release.folder / binding_library.CHECKSUMS_FILE).unlink()
    assert binding_library.load_library(stub_release.folder).name == "one"


# ------------------------------------------------------------- 5. temporaries

def test_next_build_removes_leaked_temporaries(fake, manifest, tmp_path):
    root = tmp_path / "build"
    build(manifest, root)
    library_dir = root / "one"
    leaks = [library_dir / "lib" / ".0123456789abcdef.4242.tmp", library_dir / "src" / "library.cu.tmp",
             library_dir / ".current.4242.tmp", library_dir / "staging" / "libgemmgen_one.so.tmp",
             library_dir / "build.ninja.tmp", library_dir / ".ninja.json.tmp"]
    leaks[0].mkdir()
    (leaks[0] / "libgemmgen_one.so").write_text("half")
    for path in leaks[1:]:
        path.write_text("half")
    build(manifest, root)
    assert [p for p in leaks if os.path.lexists(p)] == []


def test_failed_publish_leaves_no_temporaries(fake, manifest, tmp_path, monkeypatch):
    root = tmp_path / "build"
    first = build(manifest, root)
    manifest.write_text("# a line\n" + manifest.read_text())  # new bindings: a new release

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(builder.shutil, "copy2", fail)
    with pytest.raises(OSError, match="No space left"):
        build(manifest, root)
    library_dir = root / "one"
    assert (library_dir / "current").resolve() == first.published.resolve()
    assert not [p for p in (library_dir / "lib").iterdir() if p.name.startswith(".")]
    assert not list(library_dir.glob(".current.*"))


def test_write_tree_failure_leaves_no_temporary(tmp_path, monkeypatch):
    from gemmgen.generator import render
    (tmp_path / "src").mkdir()

    def fail(self, target):
        raise OSError(5, "I/O error")

    monkeypatch.setattr(render.Path, "replace", fail)
    with pytest.raises(OSError):
        render.write_tree(tmp_path / "src", {"a.cu": "text"}, (".cu",))
    assert list((tmp_path / "src").iterdir()) == []


# ------------------------------------------------------------- 6. atomic tables

def test_tuned_table_write_is_atomic(tmp_path, monkeypatch):
    from gemmgen.tuning import tune
    path = tmp_path / "demo.tuned.yaml"
    path.write_text("the previous table\n")
    # A write that fails half-way (here: text that cannot be encoded, after a valid first part).
    monkeypatch.setattr(tune, "render_table", lambda meta, tables, header: "kernels:\n  - a\n" + "\udc80")
    monkeypatch.setattr(tune, "metadata", lambda *a, **k: {})
    monkeypatch.setattr(tune, "build_tables", lambda *a, **k: [])
    library = SimpleNamespace(name="demo", arch="sm90a", kernel_set="0" * 16)
    options = tune.TuneOptions(shapes=[], m_grid=(), out=str(path))
    with pytest.raises(UnicodeEncodeError):
        tune.write_table(library, None, options)
    assert path.read_text() == "the previous table\n"
    assert os.listdir(tmp_path) == ["demo.tuned.yaml"]
    monkeypatch.setattr(tune, "render_table", lambda meta, tables, header: "the new table\n")
    assert tune.write_table(library, None, options) == path
    assert path.read_text() == "the new table\n" and os.listdir(tmp_path) == ["demo.tuned.yaml"]


def test_write_atomic_replaces_whole_file(tmp_path):
    from gemmgen.tuning.tune import write_atomic
    path = tmp_path / "x.yaml"
    write_atomic(path, "a\n" * 1000)
    inode = path.stat().st_ino
    write_atomic(path, "b\n")
    assert path.read_text() == "b\n" and path.stat().st_ino != inode  # a new file, renamed in


# ---------------------------------------------------------------------- ETA

def test_ninja_status_lines_get_an_eta():
    assert builder._with_eta("[2/10 10.0s] nvcc src/a.cu") == "[2/10 10.0s] nvcc src/a.cu  (~40 s left)"
    assert builder._with_eta("[1/10 60.0s] nvcc src/a.cu").endswith("(~9 min left)")
    assert builder._with_eta("[0/10 0.0s] nvcc src/a.cu") == "[0/10 0.0s] nvcc src/a.cu"
    assert builder._with_eta("[10/10 9.0s] link") == "[10/10 9.0s] link"
    assert builder._with_eta("other output") == "other output"


def test_libraries_reports_a_current_without_bindings_or_folder(stub_release, monkeypatch):
    from gemmgen import settings
    root = stub_release.folder.parent.parent.parent
    library_dir = root / "one"
    monkeypatch.setenv(settings.BUILD_DIR_VARIABLE, str(root))
    binding_library.reload()
    try:
        assert [lib.name for lib in binding_library.libraries()] == ["one"]
        binding_library.reload()
        (stub_release.folder / "bindings.py").unlink()  # was: silently no library at all
        with pytest.raises(LibraryNotBuiltError, match=r"bindings\.py is missing.*"
                                                       rf"`gemmgen build {stub_release.manifest.resolve()}`"):
            binding_library.libraries()
        binding_library.reload()
        shutil.move(str(stub_release.folder), str(library_dir / "lib" / "r0"))  # current dangles
        with pytest.raises(LibraryNotBuiltError, match=rf"which does not exist; the library in "
                                                       rf"{library_dir} .*`gemmgen build "
                                                       rf"{stub_release.manifest.resolve()}`"):
            binding_library.libraries()
    finally:
        binding_library.reload()
