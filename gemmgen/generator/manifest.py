"""Read and validate a manifest (YAML) into typed, frozen objects; every error names file:line:key.

Generic over op families: this module reads the keys every manifest has and hands the rest of
each family entry to the op family that builds its `op` (gemmgen/families/), which reads its
variants (e.g. dtypes × epilogues) and its config entries. Dispatch rules are read here, their
conditions over the variables the family declares.

    library: w8a8               # library and namespace name: [a-z][a-z0-9_]*
    arch: sm90a
    kernels_per_file: 4         # optional; kernels of one tile config share a translation unit
    families:
      - name: int8              # optional; defaults to "family<i>"
        op: scaled_mm           # picks the op family; its own keys follow (see its schema)
        ...
        configs: [...]          # the family's config entries
        dispatch:               # optional; first match wins; `use` names a config by name or keys
          - {when: "m <= 16", use: small}
          - {when: "true", use: {tile: [128, 128, 128], cluster: [2, 1, 1]}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import arch as arch_policy
from .. import families as registry
from ..errors import ManifestError
from ..family import OpFamily, Variant
from .dispatch_rules import Condition, ConditionError, RuleTableError, check_rule_table, parse_condition
from .kernel_config import ConfigEntry
from .yaml_lines import LocatedDict, Reader, key_name, show

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_TOP_KEYS = {"library", "arch", "kernels_per_file", "families"}
_GENERIC_FAMILY_KEYS = {"name", "op", "configs", "dispatch"}
_RULE_KEYS = {"when", "use"}


@dataclass(frozen=True)
class DispatchRule:
    """`when` → `use`: a parsed condition and the index of the config it picks."""

    condition: Condition
    config_index: int
    line: int


@dataclass(frozen=True)
class Family:
    """One `families` entry: its op family plug-in, variants, configs and dispatch rules."""

    name: str
    op: str
    plugin: OpFamily
    variants: tuple[Variant, ...]   # e.g. (("a", "int8"), ("d", "bf16"), ("epilogue", ...))
    configs: tuple[ConfigEntry, ...]
    dispatch: tuple[DispatchRule, ...]
    line: int
    variants_line: int

    @property
    def combos(self) -> tuple[tuple[str, ...], ...]:
        """The variants' values alone (W8A8: (a, d, epilogue) triples)."""
        return tuple(tuple(value for _, value in variant) for variant in self.variants)


@dataclass(frozen=True)
class Manifest:
    path: str
    library: str
    arch: str
    kernels_per_file: int
    families: tuple[Family, ...]


def load_manifest(path: str | Path) -> Manifest:
    """Parse and validate `path`. Raises ManifestError (file:line: key: message) on any problem."""
    path_str = str(path)
    reader = Reader(path_str)
    doc = reader.load("manifest")
    top = reader.top(doc, "manifest", _TOP_KEYS, ("library", "arch", "families"))
    library = top["library"]
    if not isinstance(library, str) or not _NAME_RE.match(library):
        raise reader.error(top, "library", f"expected a lowercase identifier, got {show(library)}")
    arch = reader.choice(top, "arch", arch_policy.PREFERENCE)
    per_file = top.get("kernels_per_file", 4)
    if not isinstance(per_file, int) or isinstance(per_file, bool) or not 1 <= per_file <= 16:
        raise reader.error(top, "kernels_per_file", f"expected an integer in [1, 16], got {show(per_file)}")
    families_node = reader.sequence(top, "families")
    families = tuple(_read_family(reader, node, i, arch, families_node.line_of(i))
                     for i, node in enumerate(families_node))
    names = [f.name for f in families]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ManifestError(path_str, families[i].line, "name", f"duplicate family name {name!r}")
    return Manifest(str(Path(path).resolve()), library, arch, per_file, families)


def _read_family(reader: Reader, node: Any, index: int, arch: str, line: int) -> Family:
    where = f"families[{index}]"
    if not isinstance(node, LocatedDict) or "op" not in node:
        every = set().union(*(f.family_keys for f in registry.all_families()))
        reader.mapping(node, where, _GENERIC_FAMILY_KEYS | every, {"op"}, line=line)  # raises
    op = reader.choice(node, "op", registry.known_ops())
    plugin = registry.for_op(op)
    assert plugin is not None
    fam = reader.mapping(node, where, _GENERIC_FAMILY_KEYS | plugin.family_keys,
                         {"op", "configs"} | plugin.required_family_keys)
    name = fam.get("name", f"family{index}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise reader.error(fam, "name", f"expected a lowercase identifier, got {show(name)}")
    if arch not in plugin.arches:
        raise reader.error(fam, "op", f"op {op!r} ({plugin.name} family) builds kernels for "
                                      f"{', '.join(plugin.arches)}; this manifest's arch is {arch}")
    variants = plugin.read_variants(reader, fam, arch)
    configs_node = reader.sequence(fam, "configs")
    configs = tuple(plugin.read_config(reader, c, i, arch, variants, configs_node.line_of(i))
                    for i, c in enumerate(configs_node))
    _check_duplicate_configs(reader, plugin, arch, configs)
    dispatch = _read_dispatch(reader, fam, plugin, arch, configs)
    return Family(name, op, plugin, variants, configs, dispatch, fam.line,
                  fam.line_of(plugin.variants_key))


def _check_duplicate_configs(reader: Reader, plugin: OpFamily, arch: str,
                             configs: tuple[ConfigEntry, ...]) -> None:
    seen: dict[Any, ConfigEntry] = {}
    names: dict[str, ConfigEntry] = {}
    for entry in configs:
        if entry.config in seen:
            why = plugin.duplicate_config_note(arch)
            raise ManifestError(reader.path, entry.line, "configs",
                                f"duplicate kernel: same compile-time config as line "
                                f"{seen[entry.config].line}{why}")
        seen[entry.config] = entry
        if entry.name is not None:
            if entry.name in names:
                raise ManifestError(reader.path, entry.line, "name",
                                    f"config name {entry.name!r} already used at line "
                                    f"{names[entry.name].line}")
            names[entry.name] = entry


def _match_config(reader: Reader, rule: LocatedDict, plugin: OpFamily, arch: str,
                  configs: tuple[ConfigEntry, ...]) -> int:
    use = rule["use"]
    if isinstance(use, str):
        found = [i for i, e in enumerate(configs) if e.name == use]
        known = ", ".join(e.name for e in configs if e.name) or "none"
        if not found:
            raise reader.error(rule, "use", f"no config named {show(use)} in this family; names: {known}")
        return found[0]
    if not isinstance(use, LocatedDict) or not use:
        raise reader.error(rule, "use", f"expected a config name or a mapping of config keys, got {show(use)}")
    allowed = plugin.config_keys(arch) - {"name"}
    for key in use:
        if key not in allowed:
            raise ManifestError(reader.path, use.line_of(key), key_name(key),
                                f"unknown config key in dispatch `use`; allowed: "
                                f"{', '.join(sorted(allowed))}")

    def matches(entry: ConfigEntry) -> bool:
        actual = plugin.config_fields(entry)
        return all(key in actual and actual[key] == value for key, value in use.items())

    found = [i for i, entry in enumerate(configs) if matches(entry)]
    if not found:
        raise reader.error(rule, "use", f"names a config that is not built in this family: {dict(use)}")
    if len(found) > 1:
        lines = ", ".join(str(configs[i].line) for i in found)
        raise reader.error(rule, "use", f"matches {len(found)} configs (lines {lines}); add keys "
                                        f"or use a config name")
    return found[0]


def _read_dispatch(reader: Reader, fam: LocatedDict, plugin: OpFamily, arch: str,
                   configs: tuple[ConfigEntry, ...]) -> tuple[DispatchRule, ...]:
    """The family's rule table; a family without `dispatch` builds kernels that are called by
    name only (candidate sets for sweeps and tuning), so it never competes with a default table."""
    if "dispatch" not in fam:
        return ()
    rules_node = reader.sequence(fam, "dispatch")
    rules = []
    for i, node in enumerate(rules_node):
        rule = reader.mapping(node, f"dispatch[{i}]", _RULE_KEYS, ("when", "use"),
                              line=rules_node.line_of(i))
        when = rule["when"]
        if isinstance(when, bool):
            when = "true" if when else "false"
        if not isinstance(when, str):
            raise reader.error(rule, "when", f"expected a condition string such as 'm <= 16', got {show(when)}")
        try:
            condition = parse_condition(when, plugin.variables)
        except ConditionError as exc:
            raise reader.error(rule, "when", str(exc)) from None
        rules.append(DispatchRule(condition, _match_config(reader, rule, plugin, arch, configs),
                                  rules_node.line_of(i)))
    try:
        check_rule_table([r.condition for r in rules])
    except RuleTableError as exc:
        if exc.rule_index is not None:
            raise ManifestError(reader.path, rules[exc.rule_index].line, "when", str(exc)) from None
        raise reader.error(fam, "dispatch", str(exc)) from None
    return tuple(rules)
