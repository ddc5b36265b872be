"""One real nvcc build of a one-kernel library (no GPU needed), reused by every test here.

The library is a plain C ABI shared object, so it loads and answers without a GPU: a kernel run
returns GEMMGEN_WRONG_ARCH. Order matters: the tests below run top to bottom on one build dir.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gemmgen.bindings.library import load_library
from gemmgen.families.w8a8.abi import ScaledMmArgs
from gemmgen.build import builder, toolchain
from gemmgen.errors import BuildError
from gemmgen.generator.kernel_config import RuntimeKnobs
from gemmgen.tuning.table import (Bucket, ClassTable, ShapeEntry, kernel_set_hash, render_table,
                                  table_path_for)

pytestmark = pytest.mark.compile

KERNEL = "sm90a_scaled_mm_i8_bf16_scaled_bias_t128x128x128_c2x1x1_pp_sauto"
UNIT = "sm90a_scaled_mm_int8_t128x128x128_c2x1x1_pp_sauto.cu"
KEY = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")
GEMMGEN_WRONG_ARCH = 5


@dataclass
class Build:
    manifest: Path
    root: Path
    report: builder.BuildReport
    log: list[str] = field(default_factory=list)

    @property
    def library_dir(self) -> Path:
        return self.root / "one"

    @property
    def current(self) -> Path:
        return self.library_dir / "current"

    def again(self) -> tuple[builder.BuildReport, list[str]]:
        log: list[str] = []
        return builder.build_manifest(self.manifest, self.root, jobs=2, log=log.append), log


@pytest.fixture(scope="module")
def built(tmp_path_factory, minimal_manifest) -> Build:
    if not (os.environ.get("CUDACXX") or shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        pytest.skip("nvcc not found")
    manifest = tmp_path_factory.mktemp("manifest") / "one.yaml"
    manifest.write_text(minimal_manifest("one", a="int8", d="bf16", epilogue="ScaledEpilogueBias",
                                         tile=(128, 128, 128), cluster=(2, 1, 1), schedule="pingpong"))
    root = tmp_path_factory.mktemp("build")
    toolchain.find_toolchain.cache_clear()
    log: list[str] = []
    report = builder.build_manifest(manifest, root, jobs=2, log=log.append)
    return Build(manifest, root, report, log)


def _run_zeroed(kernel) -> int:
    args = ScaledMmArgs()
    return kernel.run(ctypes.byref(args), None, 0, None)


def test_first_build_publishes(built):
    report = built.report
    assert (report.library, report.kernel_count, report.rebuilt) == ("one", 1, True)
    assert set(report.compile_seconds) == {UNIT, "library.cu"}
    assert all(seconds > 0 for seconds in report.compile_seconds.values())
    assert built.current.is_symlink()
    assert built.current.resolve() == report.published.resolve()
    assert report.published.parent == built.library_dir / "lib"
    assert (built.current / "libgemmgen_one.so").is_file()
    assert (built.current / "bindings.py").is_file()
    assert (built.library_dir / "src" / UNIT).is_file()
    assert (built.library_dir / "obj" / UNIT.replace(".cu", ".o")).is_file()
    assert (built.library_dir / "build.ninja").is_file()
    assert any(line.startswith("gemmgen: published ") for line in built.log)
    assert any("1 kernels in 1 translation units; 2 source(s) changed" in line for line in built.log)


def test_library_loads_and_answers_without_gpu(built):
    library = load_library(built.current)
    assert library.name == "one" and library.arch == "sm90a"
    assert library.fingerprint == library.bindings.FINGERPRINT
    assert library.cdll.gemmgen_library_fingerprint().decode() == library.fingerprint
    assert library.cdll.gemmgen_scaled_mm_args_size() == ctypes.sizeof(ScaledMmArgs)
    assert set(library.kernels) == {KERNEL}
    kernel = library.kernels[KERNEL]
    assert kernel.spec.config.tile == (128, 128, 128) and kernel.spec.origin.config == "only"
    ((condition, name, line),) = library.dispatch[KEY]
    assert (condition.source, name) == ("true", KERNEL) and line > 0
    assert _run_zeroed(kernel) == GEMMGEN_WRONG_ARCH
    message = library.last_error()
    assert message.startswith(f"{KERNEL}: ") and "sm90" in message


def test_only_the_c_api_is_exported(built):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found")
    out = subprocess.run([nm, "-D", "--defined-only", str(built.current / "libgemmgen_one.so")],
                         capture_output=True, text=True, check=True).stdout
    text_symbols = {line.split()[-1] for line in out.splitlines() if line.split()[1:2] == ["T"]}
    assert text_symbols == {"gemmgen_last_error", "gemmgen_library_fingerprint",
                            "gemmgen_scaled_mm_args_size", f"gemmgen_run_{KERNEL}",
                            f"gemmgen_workspace_{KERNEL}"}


def test_rebuild_without_changes_compiles_nothing(built):
    report, log = built.again()
    assert report.compile_seconds == {} and report.rebuilt is False
    assert report.published == built.report.published
    assert built.current.resolve() == built.report.published.resolve()
    assert any("0 source(s) changed, 0 removed" in line for line in log)


def test_line_only_edit_publishes_new_bindings_without_compiling(built):
    text = built.manifest.read_text()
    built.manifest.write_text("# moved down by one line\n" + text)
    try:
        report, _ = built.again()
    finally:
        built.manifest.write_text(text)
    assert report.compile_seconds == {}
    assert report.published != built.report.published  # new bindings, same shared object
    assert built.current.resolve() == report.published.resolve()
    assert built.report.published.exists()  # the previous release is kept
    old = load_library(built.report.published)
    new = load_library(built.current)
    assert new.fingerprint == old.fingerprint
    assert new.dispatch[KEY][0][2] == old.dispatch[KEY][0][2] + 1
    assert new.kernels[KERNEL].spec.origin.line == old.kernels[KERNEL].spec.origin.line + 1
    built.report = report  # what later tests expect to find published


def test_failed_build_keeps_the_published_library(built, tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, "
                    "release 13.0, V13.0.88'; exit 0; fi\necho 'fake nvcc: failing on purpose' >&2\nexit 1\n")
    fake.chmod(0o755)
    published = os.readlink(built.current)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("CUDACXX", str(fake))
            toolchain.find_toolchain.cache_clear()
            assert toolchain.find_toolchain().nvcc == str(fake)
            with pytest.raises(BuildError, match=r"build failed; the previously published library "
                                                 r"is unchanged") as info:
                built.again()
    finally:
        toolchain.find_toolchain.cache_clear()
    assert f"{KERNEL}  (declared at {built.manifest.resolve()}:" in str(info.value)
    assert os.readlink(built.current) == published
    assert built.current.resolve() == built.report.published.resolve()
    library = load_library(built.current)
    assert set(library.kernels) == {KERNEL}
    assert _run_zeroed(library.kernels[KERNEL]) == GEMMGEN_WRONG_ARCH


def test_tuned_table_is_published_with_the_library(built):
    """`<manifest>.tuned.yaml` beside the manifest ships in the published folder (no compile);
    a table tuned for another kernel set ships where it still fits (a note says it is partial),
    and one of which nothing fits is warned about and left out."""
    path = table_path_for(built.manifest)
    shape = ShapeEntry(4096, 4096, (Bucket(4096, KERNEL, RuntimeKnobs("along_n", 2)),))
    meta = {"library": "one", "arch": "sm90a", "kernel_set": kernel_set_hash([KERNEL]),
            "gpu": "NVIDIA H200", "sm_count": 132}
    path.write_text(render_table(meta, [ClassTable(KEY, (shape,))]))
    try:
        report, _ = built.again()
        assert UNIT not in report.compile_seconds  # (library.cu may: the failed build above dirtied it)
        library = load_library(built.current)
        (table,) = library.tables
        assert table.kernel_names() == {KERNEL}
        assert table.mismatch(gpu=("NVIDIA H200", 132), kernel_set=library.kernel_set) is None
        path.write_text(render_table({**meta, "kernel_set": "0" * 16}, [ClassTable(KEY, (shape,))]))
        report, log = built.again()
        assert any("tuned table partial" in line for line in log)  # an edited manifest keeps it
        assert load_library(built.current).tables[0].kernel_names() == {KERNEL}
        gone = ShapeEntry(4096, 4096, (Bucket(4096, KERNEL + "_gone", RuntimeKnobs()),))
        path.write_text(render_table({**meta, "kernel_set": "0" * 16}, [ClassTable(KEY, (gone,))]))
        report, log = built.again()
        assert any("tuned for another kernel set" in line for line in log)
        assert load_library(built.current).tables == ()
    finally:
        path.unlink()


SM80_MANIFEST = """\
library: one_sm80
arch: sm80
families:
  - name: int8
    op: scaled_mm
    dtypes: [{a: int8, d: fp16}]
    epilogues: [ScaledEpilogueAzpPerToken]
    configs:
      - {name: only, tile: [64, 128, 128], warp: [64, 64, 64], stages: 4, swizzle: streamk}
    dispatch:
      - {when: "true", use: only}
"""


def test_sm80_kernel_compiles_and_loads(tmp_path):
    """One real CUTLASS 2.x kernel (SASS + PTX for sm80): builds, loads, refuses to run here."""
    if not (os.environ.get("CUDACXX") or shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").exists()):
        pytest.skip("nvcc not found")
    manifest = tmp_path / "sm80.yaml"
    manifest.write_text(SM80_MANIFEST)
    toolchain.find_toolchain.cache_clear()
    report = builder.build_manifest(manifest, tmp_path / "build", jobs=2, log=lambda line: None)
    name = "sm80_scaled_mm_i8_f16_azp_pertoken_t64x128x128_w64x64x64_s4_streamk"
    assert report.kernel_count == 1
    library = load_library(tmp_path / "build" / "one_sm80" / "current")
    assert library.arch == "sm80" and list(library.kernels) == [name]
    # The object carries sm_80 SASS and compute_80 PTX (what lets it run on Hopper through the JIT).
    objdump = shutil.which("cuobjdump")
    if objdump:
        listing = subprocess.run([objdump, "--list-elf", "--list-ptx",
                                  str(tmp_path / "build" / "one_sm80" / "current" / "libgemmgen_one_sm80.so")],
                                 capture_output=True, text=True).stdout
        assert "sm_80" in listing and ".ptx" in listing
    assert _run_zeroed(library.kernels[name]) == GEMMGEN_WRONG_ARCH
    assert name in library.last_error()
