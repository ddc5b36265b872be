"""Render kernels through the Jinja2 templates into CUTLASS sources and generated bindings.

One strict Jinja environment (undefined variables are errors); output is deterministic (sorted
kernels, no timestamps); files are written only when their content changes and stale generated
files are removed, so the build stays incremental.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2

from .expand import group_into_files
from .kernel_config import KernelSpec
from .manifest import Manifest

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
INCLUDE_DIR = TEMPLATE_DIR / "include"
LIBRARY_SOURCE = "library.cu"
BINDINGS_FILE = "bindings.py"


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["pyrepr"] = repr
    return env


class _Cpp:
    """C++ spellings of the config vocabulary, used by the kernel template."""

    _ELEMENT = {"int8": "int8_t", "e4m3": "cutlass::float_e4m3_t", "bf16": "cutlass::bfloat16_t",
                "fp16": "cutlass::half_t"}
    _KERNEL = {"warpspecialized": "KernelTmaWarpSpecialized",
               "pingpong": "KernelTmaWarpSpecializedPingpong",
               "cooperative": "KernelTmaWarpSpecializedCooperative"}
    _EPILOGUE = {"tma_warpspecialized": "TmaWarpSpecialized",
                 "tma_warpspecialized_cooperative": "TmaWarpSpecializedCooperative"}
    _SCHEDULER = {"persistent": "PersistentScheduler", "streamk": "StreamKScheduler"}

    def element(self, dtype: str) -> str:
        return self._ELEMENT[dtype]

    def shape(self, dims: Sequence[int]) -> str:
        return ", ".join(f"_{d}" for d in dims)

    def kernel_schedule(self, k: KernelSpec) -> str:
        # NOTES: fp8 uses the FastAccum mainloop (no periodic promotion to fp32), as cuBLAS and
        # vLLM do for scaled fp8 GEMMs; int8 accumulates exactly in int32 either way.
        suffix = "FP8FastAccum" if k.a == "e4m3" else ""
        return f"cutlass::gemm::{self._KERNEL[k.config.schedule]}{suffix}"

    def epilogue_schedule(self, k: KernelSpec) -> str:
        return f"cutlass::epilogue::{self._EPILOGUE[k.config.epilogue_schedule]}"

    def tile_scheduler(self, k: KernelSpec) -> str:
        return f"cutlass::gemm::{self._SCHEDULER[k.config.tile_scheduler]}"

    def gemm_shape(self, dims: Sequence[int]) -> str:
        return f"cutlass::gemm::GemmShape<{', '.join(map(str, dims))}>"

    def split_k(self, k: KernelSpec) -> str:
        return {"none": "kNone", "serial": "kSerial", "parallel": "kParallel"}[k.config.split_k]

    def threadblock_swizzle(self, k: KernelSpec) -> str:
        if k.config.swizzle == "streamk":
            return "cutlass::gemm::threadblock::ThreadblockSwizzleStreamK"
        return f"cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{k.config.swizzle}>"


KERNEL_TEMPLATES = {"sm90a": "sm90_scaled_mm.cu.j2", "sm80": "sm80_scaled_mm.cu.j2"}


@dataclass(frozen=True)
class TranslationUnit:
    """One generated .cu file and the kernels it defines."""

    name: str
    source: str
    kernels: tuple[KernelSpec, ...]


def render_kernel_sources(manifest: Manifest, kernels: Sequence[KernelSpec]) -> list[TranslationUnit]:
    """Every kernel translation unit, named after its (arch, op, dtypes, tile config)."""
    template = environment().get_template(KERNEL_TEMPLATES[manifest.arch])
    groups = group_into_files(kernels, manifest.kernels_per_file)
    stems = [f"{g[0].arch}_{g[0].op}_{g[0].a}_{g[0].config.terse}" for g in groups]
    units = []
    for stem, group in zip(stems, groups):
        part = sum(1 for s in stems[:len(units)] if s == stem)
        name = f"{stem}.cu" if stems.count(stem) == 1 else f"{stem}_part{part}.cu"
        source = template.render(manifest_path=manifest.path, library=manifest.library,
                                 arch=manifest.arch, kernels=group, cpp=_Cpp())
        units.append(TranslationUnit(name, source, tuple(group)))
    return units


def render_library_source(manifest: Manifest, kernel_count: int, fingerprint: str) -> str:
    return environment().get_template("library.cu.j2").render(
        manifest_path=manifest.path, library=manifest.library, kernel_count=kernel_count,
        fingerprint=fingerprint)


def render_bindings(manifest: Manifest, kernels: Sequence[KernelSpec], fingerprint: str,
                    shared_object: str) -> str:
    """The generated Python module: kernel table + expanded dispatch rules."""
    names = {(k.op, k.a, k.d, k.epilogue, k.config): k.name for k in kernels}
    dispatch = []
    for family in manifest.families:
        if not family.dispatch:
            continue
        for a, d, epilogue in family.combos:
            rules = [(rule.condition.source,
                      names[(family.op, a, d, epilogue, family.configs[rule.config_index].config)],
                      rule.line) for rule in family.dispatch]
            dispatch.append(((family.op, a, d, epilogue), rules))
    return environment().get_template("bindings.py.j2").render(
        manifest_path=manifest.path, library=manifest.library, arch=manifest.arch,
        fingerprint=fingerprint, shared_object=shared_object, kernels=kernels,
        dispatch=sorted(dispatch))


def write_tree(directory: Path, files: Mapping[str, str], owned_suffixes: Sequence[str]) -> tuple[list[str], list[str]]:
    """Write `files` into `directory` only where content differs; delete stale owned files.

    Returns (written, removed) file names. Files with other suffixes are left alone.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in sorted(files.items()):
        path = directory / name
        if path.exists() and path.read_text() == text:
            continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
        written.append(name)
    removed = []
    for path in sorted(directory.iterdir()):
        if path.suffix in owned_suffixes and path.name not in files:
            path.unlink()
            removed.append(path.name)
    return written, removed
