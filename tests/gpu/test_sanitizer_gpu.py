"""Kernels under NVIDIA's compute-sanitizer: a sample of the built kernels of every op family and
arch runs at tile-boundary shapes (tests/gpu/sanitizer_launches.py) in a subprocess under
`compute-sanitizer --tool memcheck` (out-of-bounds and misaligned global / shared memory
accesses, invalid frees, CUDA API errors), and under `--tool racecheck` (shared-memory hazards)
the CUTLASS 2.x (sm80) sample and the MoE sample (its own setup / SwiGLU / quant kernels use
shared memory and barriers; its direct kernels share cp.async rings between warps), and the
mixed family's direct kernels of one feature warp a CTA (per-warp cp.async rings and a
shared-memory reduction; see test_racecheck_mixed_direct for the others). Each run must report zero errors (racecheck: zero warnings too).

The sample: per (family, arch, dispatch class), the first kernel of every config kind (swap-AB,
split-K / stream-K, fused, direct: each kind that is built is in it), then more up to
SAMPLE_PER_GROUP; set
GEMMGEN_SANITIZER_ALL=1 to run every built kernel. Skipped (with the reason) when the
`compute-sanitizer` binary is not found (PATH, next to nvcc, $CUDA_HOME/bin).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gemmgen

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).with_name("sanitizer_launches.py")
SAMPLE_PER_GROUP = 2
TIMEOUT_S = 900


def sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    candidates = []
    nvcc = shutil.which(os.environ.get("CUDACXX", "nvcc"))
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent / "compute-sanitizer")
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates += [Path(home) / "bin" / "compute-sanitizer",
                           Path(home) / "compute-sanitizer" / "compute-sanitizer"]
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def kind(spec) -> tuple:
    """What makes a kernel's code path different: swap-AB, split-K / stream-K, fused, direct."""
    config = spec.config
    return (getattr(config, "swap_ab", False), bool(spec.split_k), getattr(config, "fused", False),
            getattr(config, "is_direct", False))


def sample(arch: str | None = None, families=("w8a8", "mixed", "moe"), direct_only=False
           ) -> list[str]:
    kernels = [k for k in gemmgen.list_kernels() if k.spec.family in families
               and (arch is None or k.spec.arch == arch)
               and (not direct_only or getattr(k.spec.config, "is_direct", False))]
    if os.environ.get("GEMMGEN_SANITIZER_ALL") == "1":
        return [k.name for k in kernels]
    chosen: dict[tuple, list[str]] = {}
    seen_kinds: set[tuple] = set()
    for k in kernels:  # the first kernel of every kind, whatever the group holds already
        group = (k.spec.family, k.spec.arch, k.spec.dispatch_class)
        if (group, kind(k.spec)) not in seen_kinds:
            seen_kinds.add((group, kind(k.spec)))
            chosen.setdefault(group, []).append(k.name)
    for k in kernels:  # then fill each group up
        group = (k.spec.family, k.spec.arch, k.spec.dispatch_class)
        if len(chosen[group]) < SAMPLE_PER_GROUP and k.name not in chosen[group]:
            chosen[group].append(k.name)
    return [name for names in chosen.values() for name in names]


def run_under(tool: str, names: list[str]) -> str:
    binary = sanitizer()
    if binary is None:
        pytest.skip("compute-sanitizer not found (PATH, next to nvcc, $CUDA_HOME/bin)")
    if not names:
        pytest.skip("no built kernel in this sample")
    command = [binary, "--tool", tool, "--error-exitcode", "86", "--print-limit", "20",
               sys.executable, str(SCRIPT), *names]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=os.environ | {"PYTHONUNBUFFERED": "1"})
    output = done.stdout + done.stderr
    # memcheck: "ERROR SUMMARY: 0 errors"; racecheck: "RACECHECK SUMMARY: 0 hazards displayed
    # (0 errors, 0 warnings)": every count must be 0
    summary = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", output)]
    for errors, warnings in re.findall(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, "
                                       r"(\d+) warnings?\)", output):
        summary += [int(errors), int(warnings)]
    launched = re.search(r"launched (\d+) calls of (\d+) kernels", output)
    tail = "\n".join(output.splitlines()[-60:])
    assert done.returncode == 0, f"{tool}: exit {done.returncode}\n{tail}"
    assert launched, f"{tool}: the launcher did not finish\n{tail}"
    assert summary and not any(summary), f"{tool}: errors reported\n{tail}"
    print(f"{tool}: {launched.group(1)} calls of {launched.group(2)} kernels, 0 errors: "
          + ", ".join(names))
    return output


def test_memcheck_every_family():
    run_under("memcheck", sample())


def test_racecheck_sm80():
    run_under("racecheck", sample(arch="sm80", families=("w8a8",)))


def test_racecheck_mixed_direct():
    """The direct kernel's per-warp rings (cp.async, __syncwarp) and its K-split reduction
    through shared memory, sm90a and sm80 libraries: the kernels of one feature warp a CTA.
    Several feature warps share a ring of the tokens and wait for each other at a named barrier
    of their K group (`bar.sync id, count`), which racecheck does not follow: on an H100 it
    reported the ring's cp.async writes against the other warps' reads across it, and nothing
    when the same kernels waited at the CTA's barrier instead (same rings, same indices; the
    rings of two K groups are disjoint), the version the MoE family ships and
    test_racecheck_moe checks."""
    names = [name for name in sample(families=("mixed",), direct_only=True)
             if _feature_warps(name) == 1]
    run_under("racecheck", names)


def _feature_warps(name: str) -> int:
    kernel = next(k for k in gemmgen.list_kernels() if k.name == name)
    return kernel.spec.config.tile[0] // 16


def test_racecheck_moe():
    """The MoE op's own kernels (group setup's shared-memory scan, the SwiGLU + quant block
    reduction, the fused quant pass) beside its grouped GEMMs."""
    run_under("racecheck", sample(families=("moe",)))
