"""YAML loading that remembers the line of every key and list item, and typed accessors that turn
a wrong value into a `file:line: key:` ManifestError (manifests and tuned tables use them).

Every ManifestError a Reader raises names a line in 1..max(1, number of lines of the file):
scalars carry no line of their own, so a wrong scalar is reported at the line its parent records
for it (`LocatedDict.key_lines` / `LocatedList.item_lines`, passed as `line=`), an empty file at
line 1, and a YAML error that PyYAML places at the end of the stream (one past the last line) at
the last line. Only a file that cannot be read at all has no line (key `file`).

`Collector` gathers the errors of independent units (a config entry, a dispatch rule, ...) so that
a manifest's reader reports them all at once, as one ManifestErrors; inside a unit, the first error
still ends it.
"""

from __future__ import annotations

import datetime
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import yaml

from ..errors import ManifestError, ManifestErrors


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


# ------------------------------------------------------------------ collecting errors
FAILED = object()  # what Collector.attempt returns for a unit that raised


class Collector:
    """The errors of independent units, reported together: run each unit in `with
    collector.unit():` (or through `attempt`); a ManifestError ends that unit only (a
    ManifestErrors contributes each of its errors). `raise_if_any()` then raises them all as one
    ManifestErrors. A unit whose input depends on a failed one must be skipped by the caller, so
    that no error is reported that only follows from another (no cascades)."""

    def __init__(self) -> None:
        self.errors: list[ManifestError] = []

    def add(self, error: ManifestError) -> None:
        self.errors.extend(error.errors if isinstance(error, ManifestErrors) else (error,))

    @contextmanager
    def unit(self) -> Iterator[None]:
        try:
            yield
        except ManifestError as exc:
            self.add(exc)

    def attempt(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs), or FAILED (its error recorded) if it raised a ManifestError."""
        try:
            return fn(*args, **kwargs)
        except ManifestError as exc:
            self.add(exc)
            return FAILED

    def __bool__(self) -> bool:
        return bool(self.errors)

    def raise_if_any(self) -> None:
        if self.errors:
            raise ManifestErrors(self.errors)


# ------------------------------------------------------------------ describing values
_MAX_SHOWN = 60


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN - 3] + "..."


def show(value: Any) -> str:
    """A value as an error message quotes it: Python's repr for strings, numbers, booleans, lists
    and mappings (as the messages always did), words for what repr would spell in Python terms."""
    if value is None:
        return "nothing (an empty value)"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return f"binary data ({len(value)} bytes)"
    if isinstance(value, (set, frozenset)):
        return _clip("{" + ", ".join(sorted(map(repr, value))) + "}")
    if isinstance(value, LocatedDict):
        return _clip(repr(dict(value)))
    if isinstance(value, LocatedList):
        return _clip(repr(list(value)))
    return _clip(repr(value))


def describe(value: Any) -> str:
    """What kind of YAML value `value` is, in words, with the value: "a string 'abc'",
    "an integer 3", "a list [1, 2]", "nothing (an empty value)". Never a Python type name."""
    if value is None:
        return show(value)
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, int):
        return f"an integer {value!r}" if abs(value) < 10**60 else "a very large integer"
    if isinstance(value, float):
        return f"a number {value!r}"
    if isinstance(value, str):
        return f"a string {show(value)}" if value else "an empty string"
    if isinstance(value, list):
        return f"a list {show(value)}" if value else "an empty list []"
    if isinstance(value, dict):
        return f"a mapping {show(value)}" if value else "an empty mapping {}"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"a date/time ({value})"
    if isinstance(value, (bytes, bytearray)):
        return show(value)
    if isinstance(value, (set, frozenset)):
        return f"a set {show(value)}"
    return "a value of an unsupported kind"


def key_name(key: Any) -> str:
    """A mapping key as the `key` of a ManifestError: never empty."""
    if isinstance(key, str) and key.strip():
        return key
    return show(key) if key is not None else "~ (an empty key)"


# ------------------------------------------------------------------------- loading
class _Located:
    """A SafeLoader whose mappings and sequences carry their source lines; `root_line` is the
    line where the document's root node starts (None: the document is empty)."""

    root_line: int | None = None

    def construct_document(self, node):
        self.root_line = node.start_mark.line + 1
        return super().construct_document(node)

    def construct_object(self, node, deep=False):
        # A tagged scalar such as `!!int abc` or `!!timestamp x` makes SafeLoader's own
        # constructors raise ValueError/TypeError/...: report it at the node, as YAML errors are.
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except RecursionError:
            raise yaml.constructor.ConstructorError(
                None, None, "the document is nested too deeply", node.start_mark) from None
        except Exception:  # noqa: BLE001 - any constructor failure is bad YAML input
            value = node.value if isinstance(node, yaml.ScalarNode) else "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {_clip(repr(value))} as a value of tag "
                            f"!!{node.tag.rsplit(':', 1)[-1]}", node.start_mark) from None


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LocatedDict:
    # NOTES: YAML merge keys (`<<: *base`) put the merged keys first, and a key of the mapping's
    # own overrides a merged one (as yaml.safe_load reads it); only a key the mapping spells
    # twice itself is a duplicate.
    own = {id(key_node) for key_node, _ in node.value if key_node.tag != "tag:yaml.org,2002:merge"}
    loader.flatten_mapping(node)
    result = LocatedDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    spelled = set()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value (such as a name), not a list or "
                            "a mapping", key_node.start_mark) from None
        if id(key_node) in own:
            if key in spelled:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            spelled.add(key)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = key_node.start_mark.line + 1
    return result


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LocatedList:
    result = LocatedList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


class _LineLoader(_Located, yaml.SafeLoader):
    """PyYAML's own (pure-Python) loader: every file's errors are its words and marks."""


# libyaml's parser (PyYAML built with it) reads a large machine-written file about 3x faster, but
# its composer recurses in C: a document nested a few ten thousand levels deep crashes the process.
# Its event stream is flat, so the nesting is measured on it first (a tenth of the parse).
_FAST_BASE = getattr(yaml, "CSafeLoader", None)
FAST_NESTING_LIMIT = 200  # deeper documents take the pure-Python loader, which reports them


if _FAST_BASE is not None:
    class _FastLineLoader(_Located, _FAST_BASE):
        """`_LineLoader` on libyaml's parser (see `_parse`)."""
else:
    _FastLineLoader = None

for _loader in (_LineLoader, _FastLineLoader):
    if _loader is not None:
        _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
        _loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _nesting_within(text: str, limit: int) -> bool:
    """Whether `text` parses (libyaml's event stream) with collections nested at most `limit`
    deep; False on any YAML error, which the pure-Python loader then reports."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_FAST_BASE):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > limit:
                    return False
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return False
    return True


def line_count(text: str) -> int:
    """Number of lines of `text` (a last line without a newline counts; "" has none)."""
    return len(text.splitlines())


def line_at(text: str, position: int) -> int:
    """1-based line of the character at `position` of `text`."""
    return len((text[:position] + "x").splitlines())


def _parse(text: str, fast: bool = False) -> tuple[Any, int | None]:
    """(document, line of its root node) of `text`; raises yaml.YAMLError, marked where it can.
    `fast` (large machine-written files: tuned tables) reads a document libyaml parses, nested at
    most FAST_NESTING_LIMIT deep, with libyaml's parser; anything else, and every error, goes
    through PyYAML's own loader, so errors read the same either way."""
    if fast and _FastLineLoader is not None and _nesting_within(text, FAST_NESTING_LIMIT):
        loader = _FastLineLoader(text)
        try:
            return loader.get_single_data(), loader.root_line
        except yaml.YAMLError:
            pass  # reported below, in the pure-Python loader's words
        finally:
            loader.dispose()
    loader = _LineLoader(text)
    try:
        try:
            return loader.get_single_data(), loader.root_line
        except RecursionError:
            mark = loader.get_mark()
            raise yaml.MarkedYAMLError(None, None, "the document is nested too deeply",
                                       mark) from None
    finally:
        loader.dispose()


def load_yaml(path: Path) -> tuple[Any, str]:
    """Parse `path`; returns (document, text). Raises yaml.YAMLError with its own mark on bad YAML
    (a failing tagged scalar such as `!!int abc` included), OSError or UnicodeDecodeError."""
    text = Path(path).read_text()
    return _parse(text)[0], text


def _yaml_error(path: str, text: str, exc: yaml.YAMLError) -> ManifestError:
    last = max(1, line_count(text))
    if isinstance(exc, yaml.reader.ReaderError):
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        return ManifestError(path, min(line_at(text, exc.position), last), "yaml",
                             f"not valid YAML: character U+{ord(char):04X} is not allowed in YAML "
                             f"text ({exc.reason})")
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = min(mark.line + 1, last) if mark is not None else 1
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    if context and problem.startswith("but "):  # e.g. "expected a single document in the stream"
        problem = f"{context}, {problem}"
    return ManifestError(path, line, "yaml", f"not valid YAML: {problem}")


def load_checked(path: str | Path, what: str) -> Any:
    """Parse `path` (a `what`, e.g. "manifest"); unreadable files and bad YAML become
    ManifestErrors at the file (key `file`) or at YAML's own mark (key `yaml`)."""
    return Reader(str(path)).load(what)


class Reader:
    """Typed accessors that turn a wrong value into a ManifestError at its line."""

    def __init__(self, path: str):
        self.path = path
        self.root_line = 1     # line of the document's root node, after load()

    def load(self, what: str, fast: bool = False) -> Any:
        """Read and parse the reader's file (a `what`, e.g. "manifest"); unreadable files and bad
        YAML become ManifestErrors at the file (key `file`) or at YAML's own mark (key `yaml`).
        `fast`: a large machine-written file, read with libyaml where it can (see `_parse`)."""
        try:
            data = Path(self.path).read_bytes()
        except OSError as exc:
            raise ManifestError(self.path, None, "file", f"cannot read {what}: {exc}") from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[:exc.start].count(b"\n") + 1
            raise ManifestError(self.path, line, "yaml", f"not valid YAML: the {what} is not "
                                f"UTF-8 text (byte 0x{data[exc.start]:02x} on this line)") from None
        text = text.replace("\r\n", "\n").replace("\r", "\n")  # as Path.read_text() reads it
        try:
            doc, root_line = _parse(text, fast)
        except yaml.YAMLError as exc:
            raise _yaml_error(self.path, text, exc) from None
        self.root_line = root_line or 1
        return doc

    # ---------------------------------------------------------------- accessors
    def error(self, node: Any, key: str, message: str, index: int | None = None,
              line: int | None = None) -> ManifestError:
        """A ManifestError at `key` of mapping `node` (or item `index` of list `node`); `line` is
        where the node itself sits, for a node that carries no line (a scalar)."""
        if isinstance(node, LocatedDict):
            line = node.line_of(key)
        elif isinstance(node, LocatedList):
            line = node.line_of(index) if index is not None else node.line
        return ManifestError(self.path, line, key, message)

    def top(self, doc: Any, where: str, allowed: Iterable[str], required: Iterable[str]) -> LocatedDict:
        """The document `doc` as a mapping (see `mapping`); an empty file is an error at line 1."""
        if doc is None:
            raise ManifestError(self.path, 1, where, f"the file is empty; expected a mapping with "
                                                     f"keys {_keys(required)}")
        return self.mapping(doc, where, allowed, required, line=self.root_line)

    def mapping(self, node: Any, where: str, allowed: Iterable[str], required: Iterable[str],
                line: int | None = None) -> LocatedDict:
        """`node` (called `where` in messages) as a mapping with `allowed` keys, `required` ones
        among them. `line`: where the node sits, for a node without a line of its own (a scalar
        where a mapping belongs): its parent's `line_of` its key or index."""
        allowed, wanted = set(allowed), set(required)
        if not isinstance(node, LocatedDict):
            hint = f" with keys {_keys(required)}" if wanted else ""
            raise ManifestError(self.path, getattr(node, "line", None) or line, where,
                                f"expected a mapping (key: value lines){hint}, got {describe(node)}")
        for key in node:
            if key not in allowed:
                raise ManifestError(self.path, node.line_of(key), key_name(key),
                                    f"unknown key in {where}; allowed keys: {', '.join(sorted(allowed))}")
        for key in sorted(wanted - set(node)):
            raise ManifestError(self.path, node.line, key, f"missing required key in {where}")
        return node

    def sequence(self, node: LocatedDict, key: str, allow_scalar: bool = False) -> list:
        value = node[key]
        if allow_scalar and not isinstance(value, list):
            return [value]
        if not isinstance(value, list) or not value:
            raise self.error(node, key, f"expected a non-empty list, got {show(value)}")
        return value

    def choice(self, node: LocatedDict, key: str, allowed: tuple, default: Any = None) -> Any:
        value = node.get(key, default)
        # Compare types too: YAML's `2.0` or `true` must not pass for the integer 2 or 1.
        if not any(value == option and type(value) is type(option) for option in allowed):
            raise self.error(node, key, f"unknown value {show(value)}; expected one of "
                                        f"{', '.join(map(str, allowed))}")
        return value

    def flag(self, node: LocatedDict, key: str, default: bool = False) -> bool:
        """A true/false key (`default` when absent)."""
        value = node.get(key, default)
        if not isinstance(value, bool):
            raise self.error(node, key, f"expected true or false, got {value!r}")
        return value

    def triple(self, node: LocatedDict, key: str, default: Any = None) -> tuple[int, int, int]:
        value = node.get(key, default)
        if (not isinstance(value, list) or len(value) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise self.error(node, key, f"expected three integers [M, N, K], got {show(value)}")
        return tuple(value)  # type: ignore[return-value]


def _keys(keys: Iterable[str]) -> str:
    """Key names for a message, in the order given (sorted if given as a set)."""
    keys = sorted(keys) if isinstance(keys, (set, frozenset)) else list(keys)
    return ", ".join(keys)
