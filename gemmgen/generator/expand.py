"""Expand validated manifests into the sorted list of concrete kernels to generate.

Each family's (a, d, epilogue) combinations × its configs give one `KernelSpec` each. The result
is sorted by kernel name, so generated files never depend on dict or set order.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ManifestError
from .kernel_config import KernelSpec, Origin
from .manifest import Manifest


def expand(manifest: Manifest) -> list[KernelSpec]:
    """All kernels of one manifest, sorted by name; a kernel declared twice is an error, and so
    are two families whose dispatch tables would both claim one (op, a, d, epilogue)."""
    by_name: dict[str, KernelSpec] = {}
    owner: dict[tuple[str, str, str, str], str] = {}
    for family in manifest.families:
        for a, d, epilogue in family.combos:
            key = (family.op, a, d, epilogue)
            if key in owner and family.dispatch:
                raise ManifestError(manifest.path, family.dtypes_line, "dtypes",
                                    f"families {owner[key]!r} and {family.name!r} both provide "
                                    f"{family.op} {a}->{d} with {epilogue}: dispatch would be "
                                    "ambiguous; merge their configs into one family")
            if family.dispatch:
                owner[key] = family.name
            for entry in family.configs:
                spec = KernelSpec(library=manifest.library, arch=manifest.arch, op=family.op,
                                  a=a, d=d, epilogue=epilogue, config=entry.config,
                                  knobs=entry.knobs,
                                  origin=Origin(manifest.path, entry.line, family.name,
                                                entry.name or entry.config.terse))
                if spec.name in by_name:
                    raise ManifestError(manifest.path, entry.line, "configs",
                                        f"duplicate kernel {spec.name}, also declared at "
                                        f"{by_name[spec.name].origin}")
                by_name[spec.name] = spec
    return [by_name[name] for name in sorted(by_name)]


def group_into_files(kernels: Iterable[KernelSpec], per_file: int) -> list[list[KernelSpec]]:
    """Translation units: kernels that share (a, tile config), at most `per_file` each.

    NOTES: grouping by tile config (not by position in the sorted list) keeps incremental
    builds incremental: adding a config adds files without reshuffling the existing ones.
    """
    groups: dict[tuple, list[KernelSpec]] = {}
    for spec in kernels:
        groups.setdefault((spec.a, spec.config.terse), []).append(spec)
    files = []
    for key in sorted(groups):
        members = groups[key]
        files.extend(members[i:i + per_file] for i in range(0, len(members), per_file))
    return files
