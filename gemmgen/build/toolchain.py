"""Find the compiler and the CUTLASS headers, and the flags every kernel is compiled with."""

from __future__ import annotations

import functools
import importlib.util
import os
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


@functools.cache
def find_toolchain() -> Toolchain:
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if nvcc is None:
        for candidate in ("/usr/local/cuda/bin/nvcc",):
            if Path(candidate).exists():
                nvcc = candidate
    if nvcc is None:
        raise BuildError("nvcc not found: put the CUDA toolkit's bin/ on PATH or set CUDACXX")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    version = out.strip().splitlines()[-1] if out.strip() else "unknown"
    root, cutlass_version = cutlass_source_root()
    return Toolchain(nvcc, version, root, cutlass_version)


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
