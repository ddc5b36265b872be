"""Find the compiler and the CUTLASS headers, and the flags every kernel is compiled with."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .. import arch as arch_policy
from ..errors import BuildError
from ..generator.render import include_dirs

# Per-arch flags come from the arch policy (gemmgen/arch.py: why sm90a is SASS only).
ARCH_FLAGS = {name: list(a.nvcc_flags) for name, a in arch_policy.ARCHES.items()}
COMMON_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC",
                "-Xcompiler=-fvisibility=hidden", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
                # TMA descriptors go through the cached entry point defined in library.cu.
                "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1"]
LINK_FLAGS = ["-shared", "-cudart=static"]


@dataclass(frozen=True)
class Toolchain:
    nvcc: str
    nvcc_version: str
    cutlass_root: Path
    cutlass_version: str

    def include_flags(self, families: list[str] | None = None) -> list[str]:
        return [*(f"-I{d}" for d in include_dirs(families)), f"-I{self.cutlass_root / 'include'}",
                f"-I{self.cutlass_root / 'tools' / 'util' / 'include'}"]

    def compile_flags(self, arch: str, families: list[str] | None = None) -> list[str]:
        """nvcc flags of one library: arch flags from the arch policy, the include roots of its
        op families (default: every known family)."""
        return COMMON_FLAGS + ARCH_FLAGS[arch] + self.include_flags(families)


def cutlass_source_root() -> tuple[Path, str]:
    """CUTLASS's C++ tree inside the installed `nvidia-cutlass` wheel, found without importing it."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("the CUTLASS headers come from the `nvidia-cutlass` wheel, which is not "
                         "installed: run `pip install nvidia-cutlass==4.2.0.0`")
    root = Path(list(spec.submodule_search_locations)[0]) / "source"
    if not (root / "include" / "cutlass" / "cutlass.h").exists():
        raise BuildError(f"nvidia-cutlass is installed but {root}/include/cutlass/cutlass.h is "
                         "missing; reinstall it: pip install --force-reinstall nvidia-cutlass")
    version = "unknown"
    header = root / "include" / "cutlass" / "version.h"
    parts = {}
    for line in header.read_text().splitlines():
        for key in ("CUTLASS_MAJOR", "CUTLASS_MINOR", "CUTLASS_PATCH"):
            if line.startswith(f"#define {key} "):
                parts[key] = line.split()[2]
    if len(parts) == 3:
        version = ".".join(parts[k] for k in ("CUTLASS_MAJOR", "CUTLASS_MINOR", "CUTLASS_PATCH"))
    return root, version


# sm90a (wgmma, TMA) needs CUDA 12.0; the shipped manifests are tested with 12.8 and newer.
MIN_CUDA = (12, 0)
TESTED_CUDA = "12.8"
FALLBACK_NVCC = Path("/usr/local/cuda/bin/nvcc")  # where the CUDA installers put it
_INSTALL_HINT = (f"install CUDA {TESTED_CUDA}+ (https://developer.nvidia.com/cuda-downloads) and "
                 "put its bin/ on PATH or set CUDACXX to its nvcc")


def nvcc_release(version_text: str) -> tuple[int, int] | None:
    """(major, minor) from `nvcc --version` ("Cuda compilation tools, release 13.0, V13.0.88")."""
    match = re.search(r"release (\d+)\.(\d+)", version_text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _locate_nvcc(cudacxx: str, path: str) -> str:
    """The nvcc to use: $CUDACXX (a path, or a name looked up on PATH), else nvcc on PATH, else
    FALLBACK_NVCC. Each way of not finding a runnable one is a one-line BuildError."""
    if cudacxx:
        if os.sep not in cudacxx:  # a bare name, e.g. CUDACXX=nvcc
            found = shutil.which(cudacxx, path=path)
            if found is None:
                raise BuildError(f"CUDACXX={cudacxx} is not on PATH: set CUDACXX to the full path of "
                                 f"nvcc, or unset it to use nvcc from PATH ({_INSTALL_HINT})")
            return found
        candidate = Path(cudacxx)
        if not candidate.exists():
            raise BuildError(f"CUDACXX={cudacxx} does not exist: set CUDACXX to the nvcc of a CUDA "
                             f"{TESTED_CUDA}+ toolkit, e.g. /usr/local/cuda/bin/nvcc, or unset it")
        if candidate.is_dir() or not os.access(candidate, os.X_OK):
            raise BuildError(f"CUDACXX={cudacxx} is not an executable file: set CUDACXX to the nvcc "
                             f"of a CUDA {TESTED_CUDA}+ toolkit, e.g. /usr/local/cuda/bin/nvcc")
        return cudacxx
    found = shutil.which("nvcc", path=path)
    if found is not None:
        return found
    if FALLBACK_NVCC.is_file() and os.access(FALLBACK_NVCC, os.X_OK):
        return str(FALLBACK_NVCC)
    raise BuildError(f"nvcc not found: {_INSTALL_HINT}")


@functools.cache
def _find_toolchain(cudacxx: str, path: str) -> Toolchain:
    nvcc = _locate_nvcc(cudacxx, path)
    try:
        proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, errors="replace",
                              check=False, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BuildError(f"cannot run `{nvcc} --version` ({exc.__class__.__name__}: "
                         f"{exc}): {_INSTALL_HINT}") from None
    out = proc.stdout.strip()
    if proc.returncode != 0:
        said = (proc.stderr.strip() or out).splitlines()
        raise BuildError(f"`{nvcc} --version` failed (exit status {proc.returncode}"
                         + (f": {said[-1]}" if said else "") + f"): {_INSTALL_HINT}")
    release = nvcc_release(out)
    if release is None:
        last = out.splitlines()[-1] if out else "nothing"
        raise BuildError(f"`{nvcc} --version` printed no CUDA release (got {last!r}); is it "
                         f"nvcc? {_INSTALL_HINT}")
    if release < MIN_CUDA:
        raise BuildError(f"{nvcc} is CUDA {release[0]}.{release[1]}; gemmgen needs CUDA "
                         f"{MIN_CUDA[0]}.{MIN_CUDA[1]} or newer for sm90a ({TESTED_CUDA}+ tested): "
                         f"{_INSTALL_HINT}")
    version = out.splitlines()[-1]
    root, cutlass_version = cutlass_source_root()
    return Toolchain(nvcc, version, root, cutlass_version)


def find_toolchain() -> Toolchain:
    """nvcc (checked to run and to be new enough) and the CUTLASS headers; memoized per
    ($CUDACXX, $PATH). Every problem is a BuildError of one line saying what to install or set."""
    return _find_toolchain(os.environ.get("CUDACXX", ""), os.environ.get("PATH", os.defpath))


find_toolchain.cache_clear = _find_toolchain.cache_clear  # type: ignore[attr-defined]


def max_parallel_jobs(gib_per_job: float = 4.0) -> int:
    """Parallel nvcc jobs the machine can hold: min(cores, available memory / ~4 GiB per job)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    available_kib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available_kib = int(line.split()[1])
    except OSError:
        pass
    if available_kib is None:
        return max(1, cores)
    by_memory = int(available_kib / (gib_per_job * 1024 * 1024))
    return max(1, min(cores, by_memory))
