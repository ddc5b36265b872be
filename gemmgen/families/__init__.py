"""The registry of op families: every folder here with a `FAMILY` in its `__init__.py`, found
on first use (importing one imports no torch), plus any registered at run time (`register`).

Adding a family is adding its folder; nothing here or in another family changes. A family may not
take another's name, manifest op or user op: discovery and `register` refuse it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from ..family import OpFamily

_registered: dict[str, OpFamily] = {}


@functools.cache
def _discovered() -> tuple[OpFamily, ...]:
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.ispkg:
            module = importlib.import_module(f"{__name__}.{info.name}")
            family = getattr(module, "FAMILY", None)
            if isinstance(family, OpFamily):
                for other in found:  # two folders may not claim one name or op
                    _refuse_clash(other, family, f"gemmgen/families/{info.name}")
                found.append(family)
    return tuple(found)


def _refuse_clash(known: OpFamily, family: OpFamily, where: str = "") -> None:
    """ValueError when `family` takes `known`'s name, a manifest op or user op of it, or a name
    it exports as gemmgen.<name> (`public_api`)."""
    source = f" ({where})" if where else ""
    if known.name == family.name and known is not family:
        raise ValueError(f"an op family named {family.name!r} is already known{source}")
    if known.name == family.name:
        return
    clash = (set(known.ops) | set(known.api_ops)) & (set(family.ops) | set(family.api_ops))
    if clash:
        raise ValueError(f"op family {family.name!r}{source} claims op(s) {sorted(clash)} of "
                         f"family {known.name!r}")
    exported = set(known.public_api) & set(family.public_api)
    if exported:
        raise ValueError(f"op family {family.name!r}{source} exports {sorted(exported)} as "
                         f"gemmgen.<name>, as family {known.name!r} does")


def all_families() -> tuple[OpFamily, ...]:
    """Every known family, the shipped ones first (sorted by folder), then registered ones."""
    shipped = _discovered()
    return shipped + tuple(f for name, f in sorted(_registered.items())
                           if all(s.name != name for s in shipped))


def register(family: OpFamily) -> OpFamily:
    """Make a family defined outside this package known (tests, out-of-tree families).
    Its ops and api ops must not collide with another family's."""
    for other in all_families():
        _refuse_clash(other, family)
    _registered[family.name] = family
    return family


def unregister(name: str) -> None:
    _registered.pop(name, None)


def get(name: str) -> OpFamily:
    """The family called `name` (a KernelSpec's `family`)."""
    for family in all_families():
        if family.name == name:
            return family
    raise KeyError(f"unknown op family {name!r}; known: {', '.join(f.name for f in all_families())}")


def known_ops() -> tuple[str, ...]:
    """Every manifest `op` some family builds."""
    return tuple(op for family in all_families() for op in family.ops)


def for_op(op: str) -> OpFamily | None:
    """The family that builds manifest op `op`, or None."""
    return next((f for f in all_families() if op in f.ops), None)


def known_api_ops() -> tuple[str, ...]:
    return tuple(op for family in all_families() for op in family.api_ops)


def for_api_op(op: str) -> OpFamily:
    """The family whose dispatch answers for user op `op`; ValueError listing them otherwise."""
    family = next((f for f in all_families() if op in f.api_ops), None)
    if family is None:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(known_api_ops())}")
    return family
