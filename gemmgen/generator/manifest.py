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
from ..errors import ManifestError, ManifestErrors
from ..family import OpFamily, Variant
from .dispatch_rules import Condition, ConditionError, RuleTableError, check_rule_table, parse_condition
from .kernel_config import ConfigEntry
from .yaml_lines import FAILED, Collector, LocatedDict, Reader, key_name, show

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
    library_line: int | None = None  # the line of the `library` key (errors across manifests)


def load_manifest(path: str | Path) -> Manifest:
    """Parse and validate `path`. Raises ManifestErrors (a ManifestError: file:line: key: message,
    the first error's, with `.errors` listing every independent error, sorted by line) on any
    problem; see `_load` for what counts as independent."""
    try:
        return _load(str(path))
    except ManifestErrors:
        raise
    except ManifestError as exc:  # a fatal one: the file, YAML, a document that is no mapping
        raise ManifestErrors([exc]) from None


def _load(path_str: str) -> Manifest:
    """Units, each ended by its first error but none ending the others: the top-level keys (an
    unknown or a missing key: what is there is still read), `library`, `arch`, `kernels_per_file`,
    then each family (see `_read_family`). What depends on a failed unit is skipped, so that no
    error only follows from another: no family is read without a valid `arch`. A document that
    cannot be read, is not YAML or is not a mapping is a single error."""
    reader = Reader(path_str)
    errors = Collector()
    doc = reader.load("manifest")
    if doc is None or not isinstance(doc, LocatedDict):
        reader.top(doc, "manifest", _TOP_KEYS, ("library", "arch", "families"))  # raises
    required = ("library", "arch", "families")
    top = errors.attempt(reader.top, doc, "manifest", _TOP_KEYS, required)
    if top is FAILED:  # an unknown or a missing key: read what is there
        top = doc
    library = arch = None
    if "library" in top:
        library = top["library"]
        if not isinstance(library, str) or not _NAME_RE.match(library):
            errors.add(reader.error(top, "library", f"expected a lowercase identifier, got "
                                                    f"{show(library)}"))
    if "arch" in top:
        arch = errors.attempt(reader.choice, top, "arch", arch_policy.PREFERENCE)
    per_file = top.get("kernels_per_file", 4)
    if not isinstance(per_file, int) or isinstance(per_file, bool) or not 1 <= per_file <= 16:
        errors.add(reader.error(top, "kernels_per_file", f"expected an integer in [1, 16], got "
                                                         f"{show(per_file)}"))
    families: list[Family] = []
    if "families" in top and arch is not None and arch is not FAILED:
        families_node = errors.attempt(reader.sequence, top, "families")
        named: set[str] = set()  # the valid family names so far
        for i, node in enumerate(families_node if families_node is not FAILED else ()):
            family = _read_family(reader, node, i, arch, families_node.line_of(i), errors, named)
            if family is not None:
                families.append(family)
    errors.raise_if_any()
    return Manifest(str(Path(path_str).resolve()), library, arch, per_file, tuple(families),
                    top.line_of("library"))


def _read_family(reader: Reader, node: Any, index: int, arch: str, line: int, errors: Collector,
                 named: set[str]) -> Family | None:
    """One family entry, its errors recorded in `errors`; None if it had any. Units: the header
    (op, built for this arch: a failure skips the rest), the keys (an unknown key: the rest is
    read; a missing one: the rest is skipped), the name (also checked against `named`,
    the names before it), the variants, each config entry, each dispatch rule. Config entries are
    skipped when the variants failed unless the family reads them without (`OpFamily`'s optional
    `configs_need_variants = False`); a rule's `use` is only looked up when every config entry
    was read, and the rule table only checked when every condition was."""
    where = f"families[{index}]"
    start = len(errors.errors)
    with errors.unit():
        if not isinstance(node, LocatedDict) or "op" not in node:
            every = set().union(*(f.family_keys for f in registry.all_families()))
            reader.mapping(node, where, _GENERIC_FAMILY_KEYS | every, {"op"}, line=line)  # raises
        op = reader.choice(node, "op", registry.known_ops())
        plugin = registry.for_op(op)
        assert plugin is not None
        if arch not in plugin.arches:  # the op is wrong, so are its keys: read nothing more
            raise reader.error(node, "op", f"op {op!r} ({plugin.name} family) builds kernels for "
                                           f"{', '.join(plugin.arches)}; this manifest's arch is "
                                           f"{arch}")
        required = {"op", "configs"} | plugin.required_family_keys
        fam = errors.attempt(reader.mapping, node, where, _GENERIC_FAMILY_KEYS | plugin.family_keys,
                             required)
        complete = fam is not FAILED or required <= set(node)  # an unknown key only: read on
        fam = node
        name = fam.get("name", f"family{index}")
        if not isinstance(name, str) or not _NAME_RE.match(name):
            errors.add(reader.error(fam, "name", f"expected a lowercase identifier, got {show(name)}"))
        elif name in named:
            errors.add(ManifestError(reader.path, fam.line, "name",
                                     f"duplicate family name {name!r}"))
        else:
            named.add(name)
        if not complete:
            return None
        variants = errors.attempt(plugin.read_variants, reader, fam, arch)
        configs = _read_configs(reader, fam, plugin, arch, variants, errors)
        dispatch = _read_dispatch(reader, fam, plugin, arch, configs, errors)
    if len(errors.errors) > start:
        return None
    return Family(name, op, plugin, variants, configs, dispatch, fam.line,
                  fam.line_of(plugin.variants_key))


def _read_configs(reader: Reader, fam: LocatedDict, plugin: OpFamily, arch: str, variants: Any,
                  errors: Collector) -> tuple[ConfigEntry, ...] | None:
    """The family's config entries, each one a unit; None if any failed or they were skipped
    (variants failed and the family's configs need them). Duplicates among the entries read are
    errors of their own."""
    if variants is FAILED:
        if plugin.configs_need_variants:
            return None
        variants = None  # the family checks what does not depend on them
    configs_node = errors.attempt(reader.sequence, fam, "configs")
    if configs_node is FAILED:
        return None
    entries = [errors.attempt(plugin.read_config, reader, c, i, arch, variants,
                              configs_node.line_of(i))
               for i, c in enumerate(configs_node)]
    read = tuple(e for e in entries if e is not FAILED)
    _check_duplicate_configs(reader, plugin, arch, read, errors)
    return read if len(read) == len(entries) else None


def _check_duplicate_configs(reader: Reader, plugin: OpFamily, arch: str,
                             configs: tuple[ConfigEntry, ...], errors: Collector) -> None:
    seen: dict[Any, ConfigEntry] = {}
    names: dict[str, ConfigEntry] = {}
    for entry in configs:
        if entry.config in seen:
            why = plugin.duplicate_config_note(arch)
            errors.add(ManifestError(reader.path, entry.line, "configs",
                                     f"duplicate kernel: same compile-time config as line "
                                     f"{seen[entry.config].line}{why}"))
        else:
            seen[entry.config] = entry
        if entry.name is not None:
            if entry.name in names:
                errors.add(ManifestError(reader.path, entry.line, "name",
                                         f"config name {entry.name!r} already used at line "
                                         f"{names[entry.name].line}"))
            else:
                names[entry.name] = entry


def _check_use(reader: Reader, rule: LocatedDict, plugin: OpFamily, arch: str) -> None:
    """A rule's `use` is a config name or a non-empty mapping of config keys (whatever the
    family's configs are)."""
    use = rule["use"]
    if isinstance(use, str):
        return
    if not isinstance(use, LocatedDict) or not use:
        raise reader.error(rule, "use", f"expected a config name or a mapping of config keys, got {show(use)}")
    allowed = plugin.config_keys(arch) - {"name"}
    for key in use:
        if key not in allowed:
            raise ManifestError(reader.path, use.line_of(key), key_name(key),
                                f"unknown config key in dispatch `use`; allowed: "
                                f"{', '.join(sorted(allowed))}")


def _match_config(reader: Reader, rule: LocatedDict, plugin: OpFamily,
                  configs: tuple[ConfigEntry, ...]) -> int:
    """The index of the config a (checked) `use` picks."""
    use = rule["use"]
    if isinstance(use, str):
        found = [i for i, e in enumerate(configs) if e.name == use]
        known = ", ".join(e.name for e in configs if e.name) or "none"
        if not found:
            raise reader.error(rule, "use", f"no config named {show(use)} in this family; names: {known}")
        return found[0]

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


def _read_condition(reader: Reader, rule: LocatedDict, plugin: OpFamily) -> Condition:
    when = rule["when"]
    if isinstance(when, bool):
        when = "true" if when else "false"
    if not isinstance(when, str):
        raise reader.error(rule, "when", f"expected a condition string such as 'm <= 16', got {show(when)}")
    try:
        return parse_condition(when, plugin.variables)
    except ConditionError as exc:
        raise reader.error(rule, "when", str(exc)) from None


def _read_dispatch(reader: Reader, fam: LocatedDict, plugin: OpFamily, arch: str,
                   configs: tuple[ConfigEntry, ...] | None,
                   errors: Collector) -> tuple[DispatchRule, ...]:
    """The family's rule table; a family without `dispatch` builds kernels that are called by
    name only (candidate sets for sweeps and tuning), so it never competes with a default table.
    Each rule is a unit; `configs` None (some entry failed): `use` is checked but not looked up,
    as the config it names may be the one that failed."""
    if "dispatch" not in fam:
        return ()
    rules_node = errors.attempt(reader.sequence, fam, "dispatch")
    if rules_node is FAILED:
        return ()
    rules = []
    conditions: list[tuple[Condition, int]] = []
    conditions_read = True
    for i, node in enumerate(rules_node):
        line = rules_node.line_of(i)
        try:
            rule = reader.mapping(node, f"dispatch[{i}]", _RULE_KEYS, ("when", "use"), line=line)
            condition = _read_condition(reader, rule, plugin)
        except ManifestError as exc:
            errors.add(exc)
            conditions_read = False
            continue
        conditions.append((condition, line))
        with errors.unit():
            _check_use(reader, rule, plugin, arch)
            if configs is not None:
                rules.append(DispatchRule(condition, _match_config(reader, rule, plugin, configs),
                                          line))
    if conditions_read:
        try:
            check_rule_table([condition for condition, _ in conditions])
        except RuleTableError as exc:
            if exc.rule_index is not None:
                errors.add(ManifestError(reader.path, conditions[exc.rule_index][1], "when", str(exc)))
            else:
                errors.add(reader.error(fam, "dispatch", str(exc)))
    return tuple(rules)
