"""The W8A8 family's manifest schema: its keys of a family entry (dtypes, epilogues, exclude), the
(a, d, epilogue) variants they declare, and the sm90a / sm80 config entries, each checked
against the arch's legality rules with file:line errors.

    - op: scaled_mm
      dtypes: [{a: int8, b: int8, acc: int32, d: [bf16, fp16]}]
      epilogues: [ScaledEpilogue, ScaledEpilogueBias, ...]
      exclude: [{a: e4m3, epilogue: ScaledEpilogueAzp}]   # optional: drop invalid combinations
      configs:
        - {name: small, tile: [64, 16, 256], cluster: [1, 2, 1], schedule: warpspecialized,
           stages: auto, tile_scheduler: persistent, raster: heuristic, swizzle: 1, swap_ab: true}
"""

from __future__ import annotations

import re
from typing import Any

from ...generator.kernel_config import ConfigEntry
from ...generator.yaml_lines import FAILED, Collector, LocatedDict, show
from . import sm80_rules, sm90_rules
from .configs import (ACC_FOR, DTYPES_8BIT, EPILOGUE_SCHEDULES, EPILOGUES, OUT_DTYPES,
                      RASTER_ORDERS, SCHEDULES, SM80_SWIZZLES, SPLIT_K_MODES, SWIZZLES,
                      TILE_SCHEDULERS, RuntimeKnobs, Sm80TileConfig, TileConfig, is_azp)

FAMILY_KEYS = frozenset({"dtypes", "epilogues", "exclude"})
REQUIRED_FAMILY_KEYS = frozenset({"dtypes", "epilogues"})
_OUT_BYTES = {"bf16": 2, "fp16": 2}
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_DTYPE_KEYS = {"a", "b", "acc", "d"}
_CONFIG_KEYS = frozenset({"name", "tile", "cluster", "schedule", "epilogue_schedule", "stages",
                          "tile_scheduler", "raster", "swizzle", "swap_ab"})
_SM80_CONFIG_KEYS = frozenset({"name", "tile", "warp", "instruction", "stages", "swizzle", "split_k"})
_SPLIT_K_KEYS = {"mode", "slices"}
CONFIG_KEYS = {"sm90a": _CONFIG_KEYS, "sm80": _SM80_CONFIG_KEYS}
_EXCLUDE_KEYS = {"a", "d", "epilogue"}

Combo = tuple[str, str, str]  # (a, d, epilogue)


def read_combos(reader, fam: LocatedDict, arch: str) -> tuple[Combo, ...]:
    """The family's (a, d, epilogue) combinations, exclusions applied, in manifest order. Each
    `dtypes` entry, `epilogues` item and `exclude` entry is checked on its own (all their errors
    are reported together); how they combine only once they are all valid."""
    problems = Collector()
    pairs: list[tuple[str, str]] = []
    dtypes = problems.attempt(reader.sequence, fam, "dtypes")
    for i, entry in enumerate(dtypes if dtypes is not FAILED else ()):
        with problems.unit():
            pairs.extend(_read_dtypes(reader, entry, i, dtypes.line_of(i)))
    epilogues = problems.attempt(reader.sequence, fam, "epilogues")
    for i, epi in enumerate(epilogues if epilogues is not FAILED else ()):
        if epi not in EPILOGUES:
            problems.add(reader.error(epilogues, "epilogues", f"unknown epilogue {show(epi)}; "
                                      f"expected one of {', '.join(EPILOGUES)}", i))
    excludes = []
    exclude = []
    if fam.get("exclude"):  # none: no exclusions
        exclude = problems.attempt(reader.sequence, fam, "exclude")
    for i, entry in enumerate(exclude if exclude is not FAILED else ()):
        excludes.append(problems.attempt(reader.mapping, entry, f"exclude[{i}]", _EXCLUDE_KEYS,
                                         set(), line=exclude.line_of(i)))
    problems.raise_if_any()
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
            if is_azp(epi) and a != "int8":
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
    if arch == "sm80" and any(a != "int8" for a, _, _ in combos):
        raise reader.error(fam, "dtypes", "sm80 (CUTLASS 2.x) kernels take int8 operands; fp8 "
                                          "tensor cores need sm89 or sm90a")
    return tuple(combos)


def _read_dtypes(reader, entry: Any, i: int, line: int) -> list[tuple[str, str]]:
    """The (a, d) pairs of `dtypes` entry `i`."""
    d = reader.mapping(entry, f"dtypes[{i}]", _DTYPE_KEYS, ("a", "d"), line=line)
    a = reader.choice(d, "a", DTYPES_8BIT)
    if d.get("b", a) != a:
        raise reader.error(d, "b", f"W8A8 takes the same 8-bit type for a and b; got a={a!r}, "
                                   f"b={show(d['b'])}")
    if d.get("acc", ACC_FOR[a]) != ACC_FOR[a]:
        raise reader.error(d, "acc", f"{a} accumulates in {ACC_FOR[a]}; got {show(d['acc'])}")
    pairs = []
    for out in reader.sequence(d, "d", allow_scalar=True):
        if out not in OUT_DTYPES:
            raise reader.error(d, "d", f"unknown output dtype {show(out)}; expected one of "
                                       f"{', '.join(OUT_DTYPES)}")
        pairs.append((a, out))
    return pairs


def _config_name(reader, c: LocatedDict) -> str | None:
    name = c.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME_RE.match(name)):
        raise reader.error(c, "name", f"expected a lowercase identifier, got {show(name)}")
    return name


def read_sm90_config(reader, node: Any, index: int, combos, line: int) -> ConfigEntry:
    """One sm90a `configs` entry; `combos` None when the family's variants have errors."""
    c = reader.mapping(node, f"configs[{index}]", _CONFIG_KEYS, ("tile", "cluster", "schedule"),
                       line=line)
    name = _config_name(reader, c)
    schedule = reader.choice(c, "schedule", SCHEDULES)
    stages = c.get("stages", "auto")
    if stages == "auto":
        stages = 0
    elif not isinstance(stages, int) or isinstance(stages, bool) or not 2 <= stages <= 16:
        raise reader.error(c, "stages", f"expected 'auto' or an integer in [2, 16], got {show(stages)}")
    swap_ab = c.get("swap_ab", False)
    if not isinstance(swap_ab, bool):
        raise reader.error(c, "swap_ab", f"expected true or false, got {show(swap_ab)}")
    config = TileConfig(
        tile=reader.triple(c, "tile"), cluster=reader.triple(c, "cluster"), schedule=schedule,
        epilogue_schedule=reader.choice(c, "epilogue_schedule", EPILOGUE_SCHEDULES,
                                        sm90_rules.DEFAULT_EPILOGUE_SCHEDULE[schedule]),
        stages=stages, tile_scheduler=reader.choice(c, "tile_scheduler", TILE_SCHEDULERS, "persistent"),
        swap_ab=swap_ab)
    knobs = RuntimeKnobs(raster=reader.choice(c, "raster", RASTER_ORDERS, "heuristic"),
                         swizzle=reader.choice(c, "swizzle", SWIZZLES, 1))
    # combos None (the family's dtypes have errors): the smallest output, so that an error here
    # holds whatever they were meant to be (today every output type has 2 bytes)
    out_bytes = (max(_OUT_BYTES[d] for _, d, _ in combos) if combos is not None
                 else min(_OUT_BYTES.values()))
    for key, message in sm90_rules.check_config(config, out_bytes):
        raise reader.error(c, key, message)
    return ConfigEntry(name, config, knobs, line)


def read_sm80_config(reader, node: Any, index: int, combos, line: int) -> ConfigEntry:
    """One sm80 `configs` entry; `combos` None when the family's variants have errors."""
    c = reader.mapping(node, f"configs[{index}]", _SM80_CONFIG_KEYS, ("tile", "warp", "stages"),
                       line=line)
    name = _config_name(reader, c)
    stages = c["stages"]
    if not isinstance(stages, int) or isinstance(stages, bool) or not 2 <= stages <= 10:
        raise reader.error(c, "stages", f"expected an integer in [2, 10] (CUTLASS 2.x has no "
                                        f"automatic stage count), got {show(stages)}")
    split_mode, slices = "none", 1
    if "split_k" in c:
        split = reader.mapping(c["split_k"], "split_k", _SPLIT_K_KEYS, ("mode", "slices"),
                               line=c.line_of("split_k"))
        split_mode = reader.choice(split, "mode", SPLIT_K_MODES[1:])
        slices = split["slices"]
        if not isinstance(slices, int) or isinstance(slices, bool) or not 2 <= slices <= 64:
            raise reader.error(split, "slices", f"expected an integer in [2, 64], got {show(slices)}")
    config = Sm80TileConfig(
        tile=reader.triple(c, "tile"), warp=reader.triple(c, "warp"),
        instruction=reader.triple(c, "instruction", list(sm80_rules.INSTRUCTION_FOR["int8"])),
        stages=stages, swizzle=reader.choice(c, "swizzle", SM80_SWIZZLES, 1), split_k=split_mode)
    # combos None (the family's dtypes have errors): sm80 kernels take int8 operands only
    a = combos[0][0] if combos is not None else "int8"
    for key, message in sm80_rules.check_config(config, a):
        raise reader.error(c, key, message)
    return ConfigEntry(name, config, RuntimeKnobs(split_k_slices=slices), line)


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
