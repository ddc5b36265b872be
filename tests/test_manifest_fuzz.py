"""Property-based fuzz of manifest reading (hypothesis; CPU only, no nvcc, a few seconds).

Starting from valid manifests (tests/conftest.py's and the shipped ones of every op family:
w8a8_sm90.yaml, w8a8_sm80.yaml, mixed_sm90.yaml, moe_sm90.yaml),
each example mutates the YAML tree (a value of another type or an illegal value, a deleted key, an
unknown or extra key, a duplicated or dropped list item, a mapping swapped for a scalar or a list)
or the text itself (truncated, a line deleted, duplicated or re-indented, YAML syntax characters
inserted, the file emptied) and checks the contract of `load_manifest` + `expand`:

* they succeed, or raise ManifestError and nothing else;
* the error names the file, a line in 1..max(1, number of lines of the file) (an empty file is
  reported at line 1; YAML errors that PyYAML places one past the last line are reported at the
  last line) and a non-empty key; `str(err)` is `file:line: key: message`;
* the message never spells a Python type name (NoneType, LocatedDict, str, int, ...);
* nothing is written: the example's directory holds the manifest alone afterwards.

A second property: `parse_condition` raises nothing but ConditionError, whatever the text.

Every test is derandomized (the same examples on every run), so CI is deterministic.
"""

from __future__ import annotations

import copy
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gemmgen import settings as gemmgen_settings  # noqa: E402
from gemmgen.errors import ManifestError  # noqa: E402
from gemmgen.generator.dispatch_rules import Condition, ConditionError, parse_condition  # noqa: E402
from gemmgen.generator.expand import expand  # noqa: E402
from gemmgen.generator.manifest import load_manifest  # noqa: E402


def _load_conftest():
    """tests/conftest.py by path: `import conftest` may find tests/gpu/conftest.py instead."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("_fuzz_base_manifests",
                                                  Path(__file__).with_name("conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_conftest = _load_conftest()
BASE_MANIFEST, FP8_FAMILY = _conftest.BASE_MANIFEST, _conftest.FP8_FAMILY
one_kernel_manifest = _conftest.one_kernel_manifest

SM80_BASE = """\
library: demo80
arch: sm80
families:
  - name: int8
    op: scaled_mm
    dtypes:
      - a: int8
        d: [bf16, fp16]
    epilogues: [ScaledEpilogue, ScaledEpilogueBias]
    exclude: [{d: fp16, epilogue: ScaledEpilogueBias}]
    configs:
      - name: small
        tile: [64, 64, 64]
        warp: [32, 32, 64]
        stages: 4
      - name: large
        tile: [128, 128, 64]
        warp: [64, 64, 64]
        instruction: [16, 8, 32]
        stages: 5
        swizzle: 2
        split_k: {mode: serial, slices: 4}
    dispatch:
      - when: "m <= 64"
        use: small
      - when: "true"
        use: {tile: [128, 128, 64]}
"""


def _shipped(name: str) -> str:
    paths = [p for p in gemmgen_settings.default_manifests() if p.name == name]
    assert paths, f"{name} not among {gemmgen_settings.default_manifests()}"
    return paths[0].read_text()


BASES = [BASE_MANIFEST, BASE_MANIFEST + FP8_FAMILY, one_kernel_manifest(), SM80_BASE,
         _shipped("w8a8_sm90.yaml"), _shipped("w8a8_sm80.yaml"), _shipped("mixed_sm90.yaml"),
         _shipped("moe_sm90.yaml")]
TREES = [yaml.safe_load(text) for text in BASES]
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's is ~10x faster, same YAML

# Python type names a message must not spell (values are quoted; kinds are said in words).
_TYPE_NAME_RE = re.compile(r"NoneType|Located(Dict|List)|datetime\.|\bgot (str|int|float|bool|dict|"
                           r"list|bytes|set|tuple)\b|<class ")

# ----------------------------------------------------------------------- values
_TOKENS = ["int8", "e4m3", "bf16", "fp16", "fp32", "int32", "sm90a", "sm80", "scaled_mm", "auto",
           "pingpong", "cooperative", "warpspecialized", "persistent", "streamk", "serial",
           "parallel", "heuristic", "along_m", "ScaledEpilogue", "ScaledEpilogueAzp", "small",
           "large", "m <= 16", "true", "m <=", "Demo-1", "", " ", "~", "null", "yes", "0x10",
           "2024-01-01", "1e3", ".inf", "{", "- a", "a: b", "'", "\t", "int4", "uint4",
           "scale", "scale_zero", "mixed_mm", "grouped_matmul_swiglu_quant",
           "tokens_per_expert <= 16", "experts > 8"]
_KEYS = ["library", "arch", "kernels_per_file", "families", "name", "op", "dtypes", "epilogues",
         "exclude", "configs", "dispatch", "a", "b", "acc", "d", "epilogue", "tile", "cluster",
         "warp", "instruction", "schedule", "epilogue_schedule", "stages", "tile_scheduler",
         "raster", "swizzle", "swap_ab", "split_k", "mode", "slices", "when", "use", "unknown_key",
         "", "Tile", "0", "w", "x", "schemes", "intermediate"]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-3, max_value=300),
    st.sampled_from([0, 1, 2, 16, 17, 64, 128, 256, 2**31, 2**64, -2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from(_TOKENS),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(_KEYS), inner, max_size=3)),
    max_leaves=6,
) | st.sampled_from([[64, 64, 128], [128, 128], [1, 1, 1, 1], [2.0, 1, 1], [True, 1, 1], [],
                     {}, {"mode": "serial", "slices": 2}, [{"a": "int8", "d": "bf16"}]])


def _paths(node, prefix=()):
    """Every path (tuple of keys / indices) to a node of a plain YAML tree, the root included."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, prefix + (i,))


def _get(tree, path):
    for step in path:
        tree = tree[step]
    return tree


@st.composite
def mutated_trees(draw):
    """(a base's tree with 1-3 structural mutations, dumped as YAML text)."""
    tree = copy.deepcopy(draw(st.sampled_from(TREES)))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(tree))
        # the root itself now and then (a whole document of another kind), else a node in it
        root = len(paths) == 1 or draw(st.integers(0, 24)) == 24
        path = () if root else draw(st.sampled_from(paths[1:]))
        node = _get(tree, path)
        kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add_key",
                                     "duplicate", "to_scalar", "to_list"]))
        if kind == "replace" or (kind in ("delete", "duplicate") and not path):
            new = copy.deepcopy(draw(values))  # never mutate a strategy's constant later
        elif kind == "to_scalar":
            new = draw(scalars)
        elif kind == "to_list":
            new = [node] if not isinstance(node, list) else draw(scalars)
        elif kind == "add_key":
            if not isinstance(node, dict):
                continue
            node[draw(st.sampled_from(_KEYS))] = copy.deepcopy(draw(values))
            continue
        else:  # delete or duplicate within the parent
            parent, last = _get(tree, path[:-1]), path[-1]
            if kind == "delete":
                del parent[last]
            elif isinstance(parent, list):
                parent.insert(last, copy.deepcopy(parent[last]))
            continue
        if not path:
            tree = new
        else:
            _get(tree, path[:-1])[path[-1]] = new
    flow = draw(st.sampled_from([False, None, True]))
    return yaml.dump(tree, Dumper=_DUMPER, default_flow_style=flow, sort_keys=False,
                     allow_unicode=True)


_YAML_CHARS = list(":-[]{},#&*!|>'\"%@`?~ \t\n") + ["  ", "\n  ", ": ", "- ", "\x00", "\x07",
                                                      "\u2028", "\r", "é", "---\n", "...\n",
                                                      "!!int ", "!!timestamp ", "&a ", "*a",
                                                      "<<: ", "!!binary ", "? "]


@st.composite
def mutated_texts(draw):
    """A base's text (or a tree-mutated one) with 1-3 textual mutations."""
    text = draw(st.sampled_from(BASES) | mutated_trees())
    for _ in range(draw(st.integers(1, 3))):
        lines = text.split("\n")
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        kind = draw(st.sampled_from(["truncate", "delete_line", "duplicate_line", "swap_lines",
                                     "indent", "dedent", "tab", "insert", "insert", "value",
                                     "value", "truncate_line", "empty"]))
        if kind == "truncate":  # within line i
            cut = len("\n".join(lines[:i])) + draw(st.integers(0, len(lines[i]) + 1))
            text = text[:cut]
        elif kind == "truncate_line":  # the last lines go
            text = "\n".join(lines[:i + 1]) + "\n"
        elif kind == "empty" and draw(st.integers(0, 4)) != 4:
            continue  # keep emptied files rare: they stop every other mutation
        elif kind == "delete_line":
            text = "\n".join(lines[:i] + lines[i + 1:])
        elif kind == "duplicate_line":
            text = "\n".join(lines[:i + 1] + lines[i:])
        elif kind == "swap_lines":
            j = draw(st.integers(0, max(0, len(lines) - 1)))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif kind in ("indent", "dedent", "tab"):
            line = lines[i]
            if kind == "indent":
                line = " " * draw(st.integers(1, 4)) + line
            elif kind == "dedent":
                line = line[draw(st.integers(1, 4)):] if line.startswith(" ") else line
            else:
                line = "\t" + line
            lines[i] = line
            text = "\n".join(lines)
        elif kind == "insert":
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(_YAML_CHARS) | st.text(max_size=3)) + text[at:]
        elif kind == "value":
            line = lines[i]
            if ":" in line:
                lines[i] = line[:line.index(":") + 1] + " " + draw(
                    st.sampled_from(_TOKENS) | st.text(max_size=6))
                text = "\n".join(lines)
        else:
            text = draw(st.sampled_from(["", "\n", "   \n", "# only a comment\n", "---\n", "~\n",
                                         "[]\n", "{}\n", "0\n", "library\n"]))
    return text


# ---------------------------------------------------------------------- checking
def _check(text: str, base_dir: Path) -> ManifestError | None:
    """Write `text` into a fresh directory, load + expand it, assert the error contract."""
    directory = Path(tempfile.mkdtemp(dir=base_dir))
    path = directory / "manifest.yaml"
    path.write_text(text)
    read_back = path.read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    last_line = max(1, len(read_back.splitlines()))
    error = None
    try:
        kernels = expand(load_manifest(path))
        assert kernels
    except ManifestError as exc:
        error = exc
    # never any other exception type: anything else propagates and fails the example
    assert sorted(os.listdir(directory)) == ["manifest.yaml"], "reading a manifest wrote files"
    if error is None:
        return None
    assert error.file in (str(path), str(path.resolve())), str(error)
    assert isinstance(error.line, int) and 1 <= error.line <= last_line, (error.line, last_line,
                                                                          str(error))
    assert isinstance(error.key, str) and error.key.strip(), str(error)
    assert str(error).startswith(f"{error.file}:{error.line}: {error.key}: "), str(error)
    assert error.detail and not _TYPE_NAME_RE.search(error.detail), str(error)
    return error


_FUZZ = settings(max_examples=500, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much])


def test_bases_are_valid(tmp_path):
    for text in BASES:
        assert _check(text, tmp_path) is None


@_FUZZ
@given(text=mutated_trees())
def test_fuzz_mutated_trees(tmp_path, text):
    _check(text, tmp_path)


@_FUZZ
@given(text=mutated_texts())
def test_fuzz_mutated_texts(tmp_path, text):
    _check(text, tmp_path)


# ------------------------------------------------------------------- conditions
_COND_TOKENS = ["m", "n", "k", "batch", "x", "<", "<=", ">", ">=", "==", "!=", "=", "and", "or",
                "not", "(", ")", "true", "false", "True", "None", "0", "1", "16", "-1", "2**31",
                "99999999999999999999999", "1.5", "0x10", "1_000", "m.real", "f(m)", "[", "]", ",",
                ":", "lambda", "if", "else", "in", "is", "+", "*", "'", '"', "\\", "#", "\n", "\t",
                "\x00", "é", "ｍ", "\u2028", ";", "import os", "__import__", "{", "}", "@", "...",
                "await", "yield", "m := 1", "f'{m}'"]

conditions = (st.text(max_size=40)
              | st.lists(st.sampled_from(_COND_TOKENS), max_size=12).map(" ".join)
              | st.lists(st.sampled_from(_COND_TOKENS), max_size=12).map("".join)
              | st.integers(1, 200).map(lambda depth: "(" * depth + "m < 2" + ")" * depth)
              | st.integers(1, 300).map(lambda depth: "not " * depth + "m < 2")
              | st.integers(1, 40).map(lambda n: " or ".join(f"(m < {i} and n > {i})"
                                                               for i in range(1, n + 1))))


@pytest.mark.filterwarnings("ignore::SyntaxWarning")  # ast.parse on '1and m' (see report)
@settings(max_examples=1000, deadline=None, derandomize=True, database=None)
@given(text=conditions, variables=st.sampled_from([("m", "n", "k"), ("n", "batch")]))
def test_fuzz_conditions(text, variables):
    try:
        condition = parse_condition(text, variables)
    except ConditionError as exc:
        assert str(exc)
    else:
        assert isinstance(condition, Condition)


# ------------------------------------------------------------- every error of a manifest
# load_manifest reports every independent error at once (ManifestErrors, see
# docs/manifest-errors.md): each listed error keeps the single-error contract above, and the
# exception's own fields and first line are those of the first (lowest-line) error.
from gemmgen.errors import ManifestErrors  # noqa: E402


@st.composite
def heavily_mutated_trees(draw):
    """A base's tree with 2-6 of its leaves (scalars) replaced: several independent mistakes."""
    tree = copy.deepcopy(draw(st.sampled_from(TREES)))
    leaves = [p for p in _paths(tree) if p and not isinstance(_get(tree, p), (dict, list))]
    for path in draw(st.lists(st.sampled_from(leaves), min_size=2, max_size=6, unique=True)):
        _get(tree, path[:-1])[path[-1]] = copy.deepcopy(draw(scalars | values))
    return yaml.dump(tree, Dumper=_DUMPER, default_flow_style=draw(st.sampled_from([False, None])),
                     sort_keys=False, allow_unicode=True)


def _check_every_error(text: str, base_dir: Path) -> None:
    error = _check(text, base_dir)  # the single-error contract, for the first error
    if error is None or not isinstance(error, ManifestErrors):
        return  # valid, or an error of expand() (fail-fast: duplicates, dispatch ownership)
    path = Path(error.file)
    read_back = path.read_bytes().decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    last_line = max(1, len(read_back.splitlines()))
    errors = error.errors
    assert errors, str(error)
    assert (error.file, error.line, error.key, error.detail) == (
        errors[0].file, errors[0].line, errors[0].key, errors[0].detail)
    assert str(error) == "\n".join(str(e) for e in errors)
    lines = [e.line for e in errors]
    assert lines == sorted(lines, key=lambda line: line or 0), lines
    assert len({(e.line, e.key, e.detail) for e in errors}) == len(errors), str(error)
    for e in errors:
        assert not isinstance(e, ManifestErrors), str(error)
        assert e.file == error.file, str(error)
        assert isinstance(e.line, int) and 1 <= e.line <= last_line, (e.line, last_line, str(e))
        assert isinstance(e.key, str) and e.key.strip(), str(e)
        assert str(e).startswith(f"{e.file}:{e.line}: {e.key}: "), str(e)
        assert e.detail and not _TYPE_NAME_RE.search(e.detail), str(e)


@_FUZZ
@given(text=heavily_mutated_trees() | mutated_trees() | mutated_texts())
def test_fuzz_every_error_has_a_line(tmp_path, text):
    _check_every_error(text, tmp_path)
