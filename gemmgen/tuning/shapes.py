"""Weight shapes to tune for: the per-model (N, K) files of manifests/shapes/, and the M grid."""

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

_TOP_KEYS = ("model", "shapes")
_SHAPE_KEYS = ("name", "n", "k")
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


def _check_keys(path: str, node: Any, key: str, where: str, allowed: tuple[str, ...],
                line: int) -> LocatedDict:
    """`node` (the value of `key`, at `line`) as a mapping with exactly the `allowed` keys."""
    if not isinstance(node, LocatedDict):
        raise ManifestError(path, line, key,
                            f"expected a mapping, got {type(node).__name__} {node!r}")
    for given in node:
        if given not in allowed:
            raise ManifestError(path, node.line_of(given), str(given),
                                f"expected one of {', '.join(allowed)}, got unknown key {given!r}")
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
        node = _check_keys(path, item, "shapes", "shape", _SHAPE_KEYS, line)
        name, n, k = _name(path, node, "name"), _dim(path, node, "n"), _dim(path, node, "k")
        if (n, k) in first_line:
            earlier, earlier_name = first_line[(n, k)]
            raise ManifestError(path, line, "shapes",
                                f"expected each (n, k) once, got {n}x{k} ({name}) again after "
                                f"line {earlier} ({earlier_name})")
        first_line[(n, k)] = (line, name)
        shapes.append(WeightShape(name, n, k, model, f"{path}:{line}"))
    return shapes


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
    """Load every file or stem in `values`, in order, keeping the first shape of each (n, k)."""
    seen: set[tuple[int, int]] = set()
    result: list[WeightShape] = []
    for value in values:
        for shape in load_shapes(resolve_shapes_arg(value)):
            if (shape.n, shape.k) not in seen:
                seen.add((shape.n, shape.k))
                result.append(shape)
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
