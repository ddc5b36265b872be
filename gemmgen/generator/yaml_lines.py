"""YAML loading that remembers the line of every key and list item, and typed accessors that turn
a wrong value into a `file:line: key:` ManifestError (manifests and tuned tables use them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ..errors import ManifestError


class LocatedDict(dict):
    """A mapping from YAML with `line` (1-based) of itself and `key_lines[key]` of each key."""

    line: int = 0
    key_lines: dict[Any, int]

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class LocatedList(list):
    """A sequence from YAML with `line` of itself and `item_lines[i]` of each item."""

    line: int = 0
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if 0 <= index < len(self.item_lines) else self.line


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings and sequences carry their source lines."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LocatedDict:
    loader.flatten_mapping(node)
    result = LocatedDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LocatedList:
    result = LocatedList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def load_checked(path: str | Path, what: str) -> Any:
    """Parse `path` (a `what`, e.g. "manifest"); unreadable files and bad YAML become
    ManifestErrors at the file (key `file`) or at YAML's own mark (key `yaml`)."""
    try:
        doc, _ = load_yaml(Path(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ManifestError(str(path), mark.line + 1 if mark else None, "yaml",
                            f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise ManifestError(str(path), None, "file", f"cannot read {what}: {exc}") from None
    return doc


def load_yaml(path: Path) -> tuple[Any, str]:
    """Parse `path`; returns (document, text). Raises yaml.YAMLError with its own mark on bad YAML."""
    text = Path(path).read_text()
    return yaml.load(text, Loader=_LineLoader), text


class Reader:
    """Typed accessors that turn a wrong value into a ManifestError at its line."""

    def __init__(self, path: str):
        self.path = path

    def error(self, node: Any, key: str, message: str, index: int | None = None) -> ManifestError:
        line = None
        if isinstance(node, LocatedDict):
            line = node.line_of(key)
        elif isinstance(node, LocatedList):
            line = node.line_of(index) if index is not None else node.line
        return ManifestError(self.path, line, key, message)

    def mapping(self, node: Any, where: str, allowed: set[str], required: set[str]) -> LocatedDict:
        if not isinstance(node, LocatedDict):
            raise ManifestError(self.path, getattr(node, "line", None), where,
                                f"expected a mapping, got {type(node).__name__}")
        for key in node:
            if key not in allowed:
                raise self.error(node, str(key),
                                 f"unknown key in {where}; allowed keys: {', '.join(sorted(allowed))}")
        for key in sorted(required - set(node)):
            raise ManifestError(self.path, node.line, key, f"missing required key in {where}")
        return node

    def sequence(self, node: LocatedDict, key: str, allow_scalar: bool = False) -> list:
        value = node[key]
        if allow_scalar and not isinstance(value, list):
            return [value]
        if not isinstance(value, list) or not value:
            raise self.error(node, key, f"expected a non-empty list, got {value!r}")
        return value

    def choice(self, node: LocatedDict, key: str, allowed: tuple, default: Any = None) -> Any:
        value = node.get(key, default)
        # Compare types too: YAML's `2.0` or `true` must not pass for the integer 2 or 1.
        if not any(value == option and type(value) is type(option) for option in allowed):
            raise self.error(node, key, f"unknown value {value!r}; expected one of "
                                        f"{', '.join(map(str, allowed))}")
        return value

    def triple(self, node: LocatedDict, key: str, default: Any = None) -> tuple[int, int, int]:
        value = node.get(key, default)
        if (not isinstance(value, list) or len(value) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise self.error(node, key, f"expected three integers [M, N, K], got {value!r}")
        return tuple(value)  # type: ignore[return-value]
