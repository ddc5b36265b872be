"""Weight shapes to tune for: the per-model (N, K) files of manifests/shapes/, and the M grid.

A shape of an MoE expert layer also names its `experts` and `top_k` (both or neither): the MoE
family's tuner builds each point's routing from them (gemmgen/families/moe/tuning.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ManifestError
from ..generator.yaml_lines import LocatedDict, LocatedList, load_yaml

SHAPES_DIR = Path(__file__).resolve().parent.parent / "manifests" / "shapes"

# Powers of two 1..16384 plus points between them, so that dispatch bucket edges are measured.
DEFAULT_M_GRID: tuple[int, ...] = (
    1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
    640, 768, 896, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)

# The MoE family's rows grid (an m of rows: tokens x top-k), which its dispatch rounds rows up to
# and a MoE tune measures without --m: the decode steps of top-2, top-6 and top-8 models, the
# powers of two and their midpoints to 256, then points at 1.25x, 1.5x and 1.75x the powers of
# two up to 8192 rows. Routed batches are ragged (each expert gets its own row count), so the
# fastest kernel changes between the powers of two: Mixtral-8x7B at 640 rows ran 1.28-1.33x
# faster from a table tuned at 640 than from one that only knew 512 and 768 (H200,
# benchmarks/RESULTS.md, session 43). Tables tuned on fewer of these points still work: rows
# between them take the bucket that covers them.
MOE_M_GRID: tuple[int, ...] = (2, 6, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448,
                               512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072,
                               3584, 4096, 5120, 6144, 7168, 8192)

_TOP_KEYS = ("model", "shapes")
_SHAPE_KEYS = ("name", "n", "k")
_MOE_KEYS = ("experts", "top_k")  # optional, together: an MoE expert layer
_MAX_EXPERTS = 65535  # the MoE kernels' launch grid
# int8/fp8 rows of N or K elements must be 16-byte aligned for CUTLASS's vectorized loads.
_ALIGNMENT = 16


@dataclass(frozen=True)
class WeightShape:
    """One linear layer's weight [N, K] (y = x·Wᵀ) of `model`, read at `origin` ("file:line")."""

    name: str
    n: int
    k: int
    model: str
    origin: str
    experts: int = 0  # an MoE expert layer: its number of experts and of experts a token picks
    top_k: int = 0


def _check_keys(path: str, node: Any, key: str, where: str, allowed: tuple[str, ...],
                line: int, optional: tuple[str, ...] = ()) -> LocatedDict:
    """`node` (the value of `key`, at `line`) as a mapping with every `allowed` key and perhaps
    the `optional` ones."""
    if not isinstance(node, LocatedDict):
        raise ManifestError(path, line, key,
                            f"expected a mapping, got {type(node).__name__} {node!r}")
    for given in node:
        if given not in allowed and given not in optional:
            raise ManifestError(path, node.line_of(given), str(given),
                                f"expected one of {', '.join(allowed + optional)}, got unknown "
                                f"key {given!r}")
    for wanted in allowed:
        if wanted not in node:
            raise ManifestError(path, node.line, wanted,
                                f"expected key {wanted!r} in {where}, got none")
    return node


def _name(path: str, node: LocatedDict, key: str) -> str:
    value = node[key]
    if not isinstance(value, str) or not value.strip():
        raise ManifestError(path, node.line_of(key), key,
                            f"expected a non-empty string, got {value!r}")
    return value


def _dim(path: str, node: LocatedDict, key: str) -> int:
    value = node[key]
    if type(value) is not int or value <= 0:  # type() rejects bools (`true` is an int in Python)
        raise ManifestError(path, node.line_of(key), key,
                            f"expected a positive integer, got {value!r}")
    if value % _ALIGNMENT:
        raise ManifestError(path, node.line_of(key), key,
                            f"expected a multiple of {_ALIGNMENT} (16-byte rows of int8/fp8), "
                            f"got {value}")
    return value


def load_shapes(path: str | Path) -> list[WeightShape]:
    """Parse and validate one shape file; raises ManifestError (file:line: key: message)."""
    path = str(path)
    try:
        doc, _ = load_yaml(Path(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ManifestError(path, mark.line + 1 if mark else None, "yaml",
                            f"expected valid YAML, got {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise ManifestError(path, None, "file", f"expected a readable file, got {exc}") from None
    top = _check_keys(path, doc, "file", "shape file", _TOP_KEYS, 1)
    model = _name(path, top, "model")
    items = top["shapes"]
    if not isinstance(items, LocatedList) or not items:
        raise ManifestError(path, top.line_of("shapes"), "shapes",
                            f"expected a non-empty list of {{name, n, k}}, got {items!r}")
    shapes: list[WeightShape] = []
    first_line: dict[tuple[int, int], tuple[int, str]] = {}
    for i, item in enumerate(items):
        line = items.line_of(i)
        node = _check_keys(path, item, "shapes", "shape", _SHAPE_KEYS, line, _MOE_KEYS)
        name, n, k = _name(path, node, "name"), _dim(path, node, "n"), _dim(path, node, "k")
        experts, top_k = _moe_facts(path, node)
        if (n, k) in first_line:
            earlier, earlier_name = first_line[(n, k)]
            raise ManifestError(path, line, "shapes",
                                f"expected each (n, k) once, got {n}x{k} ({name}) again after "
                                f"line {earlier} ({earlier_name})")
        first_line[(n, k)] = (line, name)
        shapes.append(WeightShape(name, n, k, model, f"{path}:{line}", experts, top_k))
    return shapes


def _moe_facts(path: str, node: LocatedDict) -> tuple[int, int]:
    """(experts, top_k) of an MoE expert layer's shape, (0, 0) for a plain linear layer."""
    given = [key for key in _MOE_KEYS if key in node]
    if not given:
        return 0, 0
    if len(given) == 1:
        missing = next(key for key in _MOE_KEYS if key not in node)
        raise ManifestError(path, node.line, missing,
                            f"expected {missing!r} beside {given[0]!r} (an MoE layer names both)")
    values = []
    for key in _MOE_KEYS:
        value = node[key]
        if type(value) is not int or not 1 <= value <= _MAX_EXPERTS:
            raise ManifestError(path, node.line_of(key), key,
                                f"expected an integer in [1, {_MAX_EXPERTS}], got {value!r}")
        values.append(value)
    experts, top_k = values
    if top_k > experts:
        raise ManifestError(path, node.line_of("top_k"), "top_k",
                            f"expected at most experts ({experts}), got {top_k}")
    return experts, top_k


def available_stems() -> list[str]:
    """Stems of the shape files shipped in SHAPES_DIR, sorted (e.g. "llama3_8b")."""
    return sorted(p.stem for p in SHAPES_DIR.glob("*.yaml"))


def resolve_shapes_arg(value: str) -> Path:
    """A `--shapes` argument as a path: an existing file, else a shipped stem like "llama3_8b"."""
    if Path(value).is_file():
        return Path(value)
    stems = available_stems()
    if value in stems:
        return SHAPES_DIR / f"{value}.yaml"
    raise ManifestError(value, None, "shapes",
                        f"expected a shape file or one of {', '.join(stems)}, got {value!r}")


def load_many(values: list[str]) -> list[WeightShape]:
    """Load every file or stem in `values`, in order, keeping the first shape of each (n, k) of
    a linear layer and of an MoE expert layer (the two are measured by different families)."""
    seen: dict[tuple[int, int, bool], WeightShape] = {}
    result: list[WeightShape] = []
    for value in values:
        for shape in load_shapes(resolve_shapes_arg(value)):
            key = (shape.n, shape.k, shape.experts > 0)
            first = seen.get(key)
            if first is None:
                seen[key] = shape
                result.append(shape)
            elif (first.experts, first.top_k) != (shape.experts, shape.top_k):
                # tables and the tune's store know an expert layer by (n, k) alone
                path, _, line = shape.origin.rpartition(":")
                raise ManifestError(path, int(line) if line.isdigit() else None, "shapes",
                                    f"expected one expert layer per (n, k); {shape.n}x{shape.k} "
                                    f"has {shape.experts} experts, top {shape.top_k} here and "
                                    f"{first.experts}, top {first.top_k} at {first.origin}: "
                                    "tune the two models separately (their tables would clash)")
    return result


def parse_m_grid(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers ("1,16,128") as a sorted tuple without duplicates."""
    values = set()
    for token in text.split(","):
        token = token.strip()
        if not re.fullmatch(r"[0-9]+", token) or int(token) <= 0:
            raise ValueError(f"M grid: expected comma-separated positive integers, got {token!r}")
        values.add(int(token))
    return tuple(sorted(values))
