"""Read and validate a manifest (YAML) into typed, frozen objects; every error names file:line:key.

Schema (one file declares one library):

    library: w8a8               # library and namespace name: [a-z][a-z0-9_]*
    arch: sm90a
    kernels_per_file: 4         # optional; kernels of one tile config share a translation unit
    families:
      - name: int8              # optional; defaults to "family<i>"
        op: scaled_mm
        dtypes: [{a: int8, b: int8, acc: int32, d: [bf16, fp16]}]
        epilogues: [ScaledEpilogue, ScaledEpilogueBias, ...]
        exclude: [{a: e4m3, epilogue: ScaledEpilogueAzp}]   # optional: drop invalid combinations
        configs:
          - {name: small, tile: [64, 16, 256], cluster: [1, 2, 1], schedule: warpspecialized,
             stages: auto, tile_scheduler: persistent, raster: heuristic, swizzle: 1, swap_ab: true}
        dispatch:               # optional; first match wins; `use` names a config by name or keys
          - {when: "m <= 16", use: small}
          - {when: "true", use: {tile: [128, 128, 128], cluster: [2, 1, 1]}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ManifestError
from . import sm80_rules, sm90_rules
from .dispatch_rules import ConditionError, RuleTableError, check_rule_table, parse_condition
from .dispatch_rules import Condition
from .kernel_config import (ACC_FOR, AZP_EPILOGUES, DTYPES_8BIT, EPILOGUE_SCHEDULES, EPILOGUES,
                            OUT_DTYPES, RASTER_ORDERS, SCHEDULES, SM80_SWIZZLES, SPLIT_K_MODES, SWIZZLES,
                            TILE_SCHEDULERS, RuntimeKnobs, Sm80TileConfig, TileConfig)
from .yaml_lines import LocatedDict, LocatedList, Reader, load_checked

ARCHES = ("sm90a", "sm80")
OPS = ("scaled_mm",)
_OUT_BYTES = {"bf16": 2, "fp16": 2}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_TOP_KEYS = {"library", "arch", "kernels_per_file", "families"}
_FAMILY_KEYS = {"name", "op", "dtypes", "epilogues", "exclude", "configs", "dispatch"}
_DTYPE_KEYS = {"a", "b", "acc", "d"}
_CONFIG_KEYS = {"name", "tile", "cluster", "schedule", "epilogue_schedule", "stages",
                "tile_scheduler", "raster", "swizzle", "swap_ab"}
_SM80_CONFIG_KEYS = {"name", "tile", "warp", "instruction", "stages", "swizzle", "split_k"}
_SPLIT_K_KEYS = {"mode", "slices"}
CONFIG_KEYS = {"sm90a": _CONFIG_KEYS, "sm80": _SM80_CONFIG_KEYS}
_EXCLUDE_KEYS = {"a", "d", "epilogue"}
_RULE_KEYS = {"when", "use"}


@dataclass(frozen=True)
class ConfigEntry:
    """One entry of a family's `configs` list."""

    name: str | None
    config: TileConfig | Sm80TileConfig
    knobs: RuntimeKnobs
    line: int


@dataclass(frozen=True)
class DispatchRule:
    """`when` → `use`: a parsed condition and the index of the config it picks."""

    condition: Condition
    config_index: int
    line: int


@dataclass(frozen=True)
class Family:
    name: str
    op: str
    combos: tuple[tuple[str, str, str], ...]  # (a, d, epilogue), exclusions applied, in order
    configs: tuple[ConfigEntry, ...]
    dispatch: tuple[DispatchRule, ...]
    line: int
    dtypes_line: int


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
    doc = load_checked(path_str, "manifest")
    reader = Reader(path_str)
    top = reader.mapping(doc, "manifest", _TOP_KEYS, {"library", "arch", "families"})
    library = top["library"]
    if not isinstance(library, str) or not _NAME_RE.match(library):
        raise reader.error(top, "library", f"expected a lowercase identifier, got {library!r}")
    arch = reader.choice(top, "arch", ARCHES)
    per_file = top.get("kernels_per_file", 4)
    if not isinstance(per_file, int) or isinstance(per_file, bool) or not 1 <= per_file <= 16:
        raise reader.error(top, "kernels_per_file", f"expected an integer in [1, 16], got {per_file!r}")
    families_node = reader.sequence(top, "families")
    families = tuple(_read_family(reader, node, i, arch) for i, node in enumerate(families_node))
    names = [f.name for f in families]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ManifestError(path_str, families[i].line, "name", f"duplicate family name {name!r}")
    return Manifest(str(Path(path).resolve()), library, arch, per_file, families)


def _read_family(reader: Reader, node: Any, index: int, arch: str) -> Family:
    fam = reader.mapping(node, f"families[{index}]", _FAMILY_KEYS,
                         {"op", "dtypes", "epilogues", "configs"})
    name = fam.get("name", f"family{index}")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise reader.error(fam, "name", f"expected a lowercase identifier, got {name!r}")
    op = reader.choice(fam, "op", OPS)
    combos = _read_combos(reader, fam)
    if arch == "sm80" and any(a != "int8" for a, _, _ in combos):
        raise reader.error(fam, "dtypes", "sm80 (CUTLASS 2.x) kernels take int8 operands; fp8 "
                                          "tensor cores need sm89 or sm90a")
    read = _read_sm80_config if arch == "sm80" else _read_config
    configs = tuple(read(reader, c, i, combos, fam["configs"])
                    for i, c in enumerate(reader.sequence(fam, "configs")))
    _check_duplicate_configs(reader, fam, configs)
    dispatch = _read_dispatch(reader, fam, configs, arch)
    return Family(name, op, combos, configs, dispatch, fam.line, fam.line_of("dtypes"))


def _read_combos(reader: Reader, fam: LocatedDict) -> tuple[tuple[str, str, str], ...]:
    pairs: list[tuple[str, str]] = []
    dtypes = reader.sequence(fam, "dtypes")
    for i, entry in enumerate(dtypes):
        d = reader.mapping(entry, f"dtypes[{i}]", _DTYPE_KEYS, {"a", "d"})
        a = reader.choice(d, "a", DTYPES_8BIT)
        if d.get("b", a) != a:
            raise reader.error(d, "b", f"W8A8 takes the same 8-bit type for a and b; got a={a!r}, "
                                       f"b={d['b']!r}")
        if d.get("acc", ACC_FOR[a]) != ACC_FOR[a]:
            raise reader.error(d, "acc", f"{a} accumulates in {ACC_FOR[a]}; got {d['acc']!r}")
        for out in reader.sequence(d, "d", allow_scalar=True):
            if out not in OUT_DTYPES:
                raise reader.error(d, "d", f"unknown output dtype {out!r}; expected one of "
                                           f"{', '.join(OUT_DTYPES)}")
            pairs.append((a, out))
    epilogues = reader.sequence(fam, "epilogues")
    for i, epi in enumerate(epilogues):
        if epi not in EPILOGUES:
            raise reader.error(epilogues, "epilogues", f"unknown epilogue {epi!r}; expected one "
                                                       f"of {', '.join(EPILOGUES)}", i)
    excludes = []
    for i, entry in enumerate(fam.get("exclude", []) or []):
        excludes.append(reader.mapping(entry, f"exclude[{i}]", _EXCLUDE_KEYS, set()))
    combos = []
    used = [False] * len(excludes)
    for a, out in pairs:
        for epi in epilogues:
            hit = [i for i, ex in enumerate(excludes)
                   if all(ex[key] == value for key, value in
                          (("a", a), ("d", out), ("epilogue", epi)) if key in ex)]
            for i in hit:
                used[i] = True
            if hit:
                continue
            if epi in AZP_EPILOGUES and a != "int8":
                raise reader.error(fam, "epilogues",
                                   f"{epi} needs int8 activations (asymmetric zero points), but "
                                   f"dtypes include a={a}; drop the pair with "
                                   f"`exclude: [{{a: {a}, epilogue: {epi}}}]`")
            combos.append((a, out, epi))
    for i, was_used in enumerate(used):
        if not was_used:
            raise reader.error(fam["exclude"], "exclude", "this exclusion matches no "
                                                          "dtype/epilogue combination", i)
    if len(set(combos)) != len(combos):
        raise reader.error(fam, "dtypes", "the same (a, d, epilogue) combination is listed twice")
    if not combos:
        raise reader.error(fam, "exclude", "the exclusions drop every dtype/epilogue combination")
    return tuple(combos)


def _read_config(reader: Reader, node: Any, index: int, combos, parent: LocatedList) -> ConfigEntry:
    c = reader.mapping(node, f"configs[{index}]", _CONFIG_KEYS, {"tile", "cluster", "schedule"})
    name = c.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME_RE.match(name)):
        raise reader.error(c, "name", f"expected a lowercase identifier, got {name!r}")
    schedule = reader.choice(c, "schedule", SCHEDULES)
    stages = c.get("stages", "auto")
    if stages == "auto":
        stages = 0
    elif not isinstance(stages, int) or isinstance(stages, bool) or not 2 <= stages <= 16:
        raise reader.error(c, "stages", f"expected 'auto' or an integer in [2, 16], got {stages!r}")
    swap_ab = c.get("swap_ab", False)
    if not isinstance(swap_ab, bool):
        raise reader.error(c, "swap_ab", f"expected true or false, got {swap_ab!r}")
    config = TileConfig(
        tile=reader.triple(c, "tile"), cluster=reader.triple(c, "cluster"), schedule=schedule,
        epilogue_schedule=reader.choice(c, "epilogue_schedule", EPILOGUE_SCHEDULES,
                                        sm90_rules.DEFAULT_EPILOGUE_SCHEDULE[schedule]),
        stages=stages, tile_scheduler=reader.choice(c, "tile_scheduler", TILE_SCHEDULERS, "persistent"),
        swap_ab=swap_ab)
    knobs = RuntimeKnobs(raster=reader.choice(c, "raster", RASTER_ORDERS, "heuristic"),
                         swizzle=reader.choice(c, "swizzle", SWIZZLES, 1))
    out_bytes = max(_OUT_BYTES[d] for _, d, _ in combos)
    for key, message in sm90_rules.check_config(config, out_bytes):
        raise reader.error(c, key, message)
    return ConfigEntry(name, config, knobs, parent.line_of(index))


def _read_sm80_config(reader: Reader, node: Any, index: int, combos, parent: LocatedList) -> ConfigEntry:
    c = reader.mapping(node, f"configs[{index}]", _SM80_CONFIG_KEYS, {"tile", "warp", "stages"})
    name = c.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME_RE.match(name)):
        raise reader.error(c, "name", f"expected a lowercase identifier, got {name!r}")
    stages = c["stages"]
    if not isinstance(stages, int) or isinstance(stages, bool) or not 2 <= stages <= 10:
        raise reader.error(c, "stages", f"expected an integer in [2, 10] (CUTLASS 2.x has no "
                                        f"automatic stage count), got {stages!r}")
    split_mode, slices = "none", 1
    if "split_k" in c:
        split = reader.mapping(c["split_k"], "split_k", _SPLIT_K_KEYS, {"mode", "slices"})
        split_mode = reader.choice(split, "mode", SPLIT_K_MODES[1:])
        slices = split["slices"]
        if not isinstance(slices, int) or isinstance(slices, bool) or not 2 <= slices <= 64:
            raise reader.error(split, "slices", f"expected an integer in [2, 64], got {slices!r}")
    config = Sm80TileConfig(
        tile=reader.triple(c, "tile"), warp=reader.triple(c, "warp"),
        instruction=reader.triple(c, "instruction", list(sm80_rules.INSTRUCTION_FOR["int8"])),
        stages=stages, swizzle=reader.choice(c, "swizzle", SM80_SWIZZLES, 1), split_k=split_mode)
    for key, message in sm80_rules.check_config(config, combos[0][0]):
        raise reader.error(c, key, message)
    return ConfigEntry(name, config, RuntimeKnobs(split_k_slices=slices), parent.line_of(index))


def config_fields(entry: ConfigEntry) -> dict[str, Any]:
    """A config as the manifest spells it, for matching dispatch `use` mappings."""
    cfg, knobs = entry.config, entry.knobs
    if isinstance(cfg, Sm80TileConfig):
        fields = {"tile": list(cfg.tile), "warp": list(cfg.warp), "instruction": list(cfg.instruction),
                  "stages": cfg.stages, "swizzle": cfg.swizzle}
        if cfg.split_k != "none":
            fields["split_k"] = {"mode": cfg.split_k, "slices": knobs.split_k_slices}
        return fields
    return {"tile": list(cfg.tile), "cluster": list(cfg.cluster), "schedule": cfg.schedule,
            "epilogue_schedule": cfg.epilogue_schedule,
            "stages": cfg.stages if cfg.stages else "auto", "tile_scheduler": cfg.tile_scheduler,
            "swap_ab": cfg.swap_ab, "raster": knobs.raster, "swizzle": knobs.swizzle}


def _check_duplicate_configs(reader: Reader, fam: LocatedDict, configs: tuple[ConfigEntry, ...]) -> None:
    seen: dict[TileConfig, ConfigEntry] = {}
    names: dict[str, ConfigEntry] = {}
    for entry in configs:
        if entry.config in seen:
            why = ("" if isinstance(entry.config, Sm80TileConfig) else
                   " (raster and swizzle are run-time knobs and do not make a new kernel)")
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


def _match_config(reader: Reader, rule: LocatedDict, configs: tuple[ConfigEntry, ...], arch: str) -> int:
    use = rule["use"]
    if isinstance(use, str):
        found = [i for i, e in enumerate(configs) if e.name == use]
        known = ", ".join(e.name for e in configs if e.name) or "none"
        if not found:
            raise reader.error(rule, "use", f"no config named {use!r} in this family; names: {known}")
        return found[0]
    if not isinstance(use, LocatedDict) or not use:
        raise reader.error(rule, "use", f"expected a config name or a mapping of config keys, got {use!r}")
    allowed = CONFIG_KEYS[arch] - {"name"}
    for key in use:
        if key not in allowed:
            raise reader.error(use, str(key), f"unknown config key in dispatch `use`; allowed: "
                                              f"{', '.join(sorted(allowed))}")

    def matches(entry: ConfigEntry) -> bool:
        actual = config_fields(entry)
        return all(actual[key] == value for key, value in use.items())

    found = [i for i, entry in enumerate(configs) if matches(entry)]
    if not found:
        raise reader.error(rule, "use", f"names a config that is not built in this family: {dict(use)}")
    if len(found) > 1:
        lines = ", ".join(str(configs[i].line) for i in found)
        raise reader.error(rule, "use", f"matches {len(found)} configs (lines {lines}); add keys "
                                        f"or use a config name")
    return found[0]


def _read_dispatch(reader: Reader, fam: LocatedDict, configs: tuple[ConfigEntry, ...],
                   arch: str) -> tuple[DispatchRule, ...]:
    """The family's rule table; a family without `dispatch` builds kernels that are called by
    name only (candidate sets for sweeps and tuning), so it never competes with a default table."""
    if "dispatch" not in fam:
        return ()
    rules_node = reader.sequence(fam, "dispatch")
    rules = []
    for i, node in enumerate(rules_node):
        rule = reader.mapping(node, f"dispatch[{i}]", _RULE_KEYS, {"when", "use"})
        when = rule["when"]
        if isinstance(when, bool):
            when = "true" if when else "false"
        if not isinstance(when, str):
            raise reader.error(rule, "when", f"expected a condition string such as 'm <= 16', got {when!r}")
        try:
            condition = parse_condition(when)
        except ConditionError as exc:
            raise reader.error(rule, "when", str(exc)) from None
        rules.append(DispatchRule(condition, _match_config(reader, rule, configs, arch),
                                  rules_node.line_of(i)))
    try:
        check_rule_table([r.condition for r in rules])
    except RuleTableError as exc:
        if exc.rule_index is not None:
            raise ManifestError(reader.path, rules[exc.rule_index].line, "when", str(exc)) from None
        raise reader.error(fam, "dispatch", str(exc)) from None
    return tuple(rules)
