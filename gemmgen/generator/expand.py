"""Expand validated manifests into the sorted list of concrete kernels to generate.

Each family's variants × its configs give one kernel spec each (built by the family's plug-in).
The result is sorted by kernel name, so generated files never depend on dict or set order.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ManifestError
from .kernel_config import KernelSpec, Origin
from .manifest import Manifest


def expand(manifest: Manifest) -> list[KernelSpec]:
    """All kernels of one manifest, sorted by name; a kernel declared twice is an error, and so
    are two families whose dispatch tables would both claim one dispatch class."""
    by_name: dict[str, KernelSpec] = {}
    owner: dict[tuple, str] = {}
    for family in manifest.families:
        for variant in family.variants:
            specs = [family.plugin.make_spec(
                library=manifest.library, arch=manifest.arch, op=family.op, variant=variant,
                entry=entry, origin=Origin(manifest.path, entry.line, family.name,
                                           entry.name or entry.config.terse))
                     for entry in family.configs]
            key = specs[0].dispatch_class
            if key in owner and family.dispatch:
                raise ManifestError(manifest.path, family.variants_line, family.plugin.variants_key,
                                    f"families {owner[key]!r} and {family.name!r} both provide "
                                    f"{family.plugin.describe_class(key)}: dispatch would be "
                                    "ambiguous; merge their configs into one family")
            if family.dispatch:
                owner[key] = family.name
            for entry, spec in zip(family.configs, specs):
                if spec.name in by_name:
                    raise ManifestError(manifest.path, entry.line, "configs",
                                        f"duplicate kernel {spec.name}, also declared at "
                                        f"{by_name[spec.name].origin}")
                by_name[spec.name] = spec
    return [by_name[name] for name in sorted(by_name)]


def group_into_files(kernels: Iterable[KernelSpec], per_file: int) -> list[list[KernelSpec]]:
    """Translation units: kernels that share a `unit_key` (see KernelSpec), at most `per_file`
    each, in a deterministic order."""
    groups: dict[tuple, list[KernelSpec]] = {}
    for spec in kernels:
        groups.setdefault((spec.unit_stem, spec.unit_key), []).append(spec)
    files = []
    for key in sorted(groups):
        members = groups[key]
        files.extend(members[i:i + per_file] for i in range(0, len(members), per_file))
    return files
