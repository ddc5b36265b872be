"""Render kernels through the Jinja2 templates into CUTLASS sources and generated bindings.

One strict Jinja environment (undefined variables are errors) over the generic templates and
every op family's (`<family>/<template>`); output is deterministic (sorted kernels, no
timestamps); files are written only when their content changes and stale generated files are
removed, so the build stays incremental.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import jinja2

from .. import arch as arch_policy
from .. import families as registry
from ..family import OpFamily
from .expand import group_into_files
from .kernel_config import KernelSpec
from .manifest import Manifest

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
INCLUDE_DIR = TEMPLATE_DIR / "include"
LIBRARY_SOURCE = "library.cu"
BINDINGS_FILE = "bindings.py"


def include_dirs(families: Sequence[str] | None = None) -> list[Path]:
    """C++ include roots: the generic headers, then those of the named families (default: every
    known family). NOTES: a library compiles with its own families' roots only, so adding a
    family never changes another library's nvcc command line (ninja would recompile it all)."""
    chosen = [f for f in registry.all_families() if families is None or f.name in families]
    return [INCLUDE_DIR, *(family.include_dir for family in chosen)]


@functools.cache
def _environment(template_dirs: tuple[tuple[str, str], ...]) -> jinja2.Environment:
    loader = jinja2.ChoiceLoader([
        jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        jinja2.PrefixLoader({name: jinja2.FileSystemLoader(path) for name, path in template_dirs}),
    ])
    env = jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             autoescape=False)
    env.filters["pyrepr"] = repr
    return env


def environment() -> jinja2.Environment:
    """The one strict environment: generic templates by name, a family's as `<family>/<name>`."""
    return _environment(tuple((f.name, str(f.template_dir)) for f in registry.all_families()))


@dataclass(frozen=True)
class TranslationUnit:
    """One generated .cu file and the kernels it defines."""

    name: str
    source: str
    kernels: tuple[KernelSpec, ...]


def _arch_guard(arch: str) -> dict:
    """The arch policy as the generated entry points check it (see gemmgen/arch.py)."""
    policy = arch_policy.get(arch)
    return {"min": policy.min_capability, "max": policy.max_capability, "gpus": policy.gpus}


def _plugin(spec: KernelSpec) -> OpFamily:
    return registry.get(spec.family)


def render_kernel_sources(manifest: Manifest, kernels: Sequence[KernelSpec]) -> list[TranslationUnit]:
    """Every kernel translation unit, named after its (arch, op, unit key): one family each."""
    groups = group_into_files(kernels, manifest.kernels_per_file)
    stems = [g[0].unit_stem for g in groups]
    units = []
    for stem, group in zip(stems, groups):
        plugin = _plugin(group[0])
        template = environment().get_template(f"{plugin.name}/{plugin.kernel_template(manifest.arch)}")
        part = sum(1 for s in stems[:len(units)] if s == stem)
        name = f"{stem}.cu" if stems.count(stem) == 1 else f"{stem}_part{part}.cu"
        source = template.render(manifest_path=manifest.path, library=manifest.library,
                                 arch=manifest.arch, kernels=group, arch_guard=_arch_guard(manifest.arch),
                                 **plugin.template_context(manifest.arch))
        units.append(TranslationUnit(name, source, tuple(group)))
    return units


def _families_of(kernels: Sequence[KernelSpec]) -> list[OpFamily]:
    names = sorted({k.family for k in kernels})
    return [registry.get(name) for name in names]


def render_library_source(manifest: Manifest, kernel_count: int, fingerprint: str,
                          kernels: Sequence[KernelSpec] = ()) -> str:
    families = _families_of(kernels) or [f.plugin for f in manifest.families]
    unique = {f.name: f for f in families}
    return environment().get_template("library.cu.j2").render(
        manifest_path=manifest.path, library=manifest.library, kernel_count=kernel_count,
        fingerprint=fingerprint, abis=[f.args for _, f in sorted(unique.items())])


def _classes_in(value, found: dict[str, set[str]]) -> None:
    """The dataclass types a repr of `value` names (so the bindings can import them)."""
    if is_dataclass(value) and not isinstance(value, type):
        found.setdefault(type(value).__module__, set()).add(type(value).__name__)
        for f in fields(value):
            _classes_in(getattr(value, f.name), found)


def render_bindings(manifest: Manifest, kernels: Sequence[KernelSpec], fingerprint: str,
                    shared_object: str) -> str:
    """The generated Python module: kernel table (each spec's repr) + expanded dispatch rules."""
    names = {(k.dispatch_class, k.config): k.name for k in kernels}
    dispatch = []
    for family in manifest.families:
        if not family.dispatch:
            continue
        for variant in family.variants:
            key = (family.op, *(value for _, value in variant))
            rules = [(rule.condition.source,
                      names[(key, family.configs[rule.config_index].config)], rule.line)
                     for rule in family.dispatch]
            dispatch.append((key, rules))
    imports: dict[str, set[str]] = {}
    for k in kernels:
        _classes_in(k, imports)
    return environment().get_template("bindings.py.j2").render(
        manifest_path=manifest.path, library=manifest.library, arch=manifest.arch,
        fingerprint=fingerprint, shared_object=shared_object, kernels=kernels,
        imports=sorted((module, sorted(names_)) for module, names_ in imports.items()),
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
        try:
            tmp.write_text(text)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)  # a failed write leaves no temporary (a build also
            # removes those of a killed one)
        written.append(name)
    removed = []
    for path in sorted(directory.iterdir()):
        if path.suffix in owned_suffixes and path.name not in files:
            path.unlink()
            removed.append(path.name)
    return written, removed
