"""The op-family plug-in interface, proven by a family that is not W8A8 (tests/family_demo):
registered at run time, it goes through every generic layer — manifest (its own keys, file:line
errors), dispatch conditions over its own variables (n, batch), expand, render (its template,
header and ABI symbol), bindings, library loading and dispatch — with no W8A8 code involved."""

from __future__ import annotations

import ctypes
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `family_demo`, as the bindings import it

import family_demo  # noqa: E402
from family_demo import AxpbyArgs, AxpbyConfig, AxpbySpec  # noqa: E402

from gemmgen import dispatch  # noqa: E402
from gemmgen import families as registry  # noqa: E402
from gemmgen.bindings.library import Kernel, Library, load_library  # noqa: E402
from gemmgen.errors import LibraryNotBuiltError, ManifestError, NoKernelError  # noqa: E402
from gemmgen.generator.dispatch_rules import parse_condition  # noqa: E402
from gemmgen.generator.expand import expand  # noqa: E402
from gemmgen.generator.kernel_config import RuntimeKnobs  # noqa: E402
from gemmgen.generator.manifest import load_manifest  # noqa: E402
from gemmgen.generator.render import (INCLUDE_DIR, include_dirs, render_bindings,  # noqa: E402
                                      render_kernel_sources, render_library_source)

FINGERPRINT = "0123456789abcdef"

MANIFEST = """\
library: demo_axpby
arch: sm90a
kernels_per_file: 2
families:
  - name: axpy
    op: axpby
    dtypes:
      - x: fp16
        out: [fp16, fp32]
      - x: bf16
        out: fp32
    configs:
      - name: narrow
        block: 128
        vector: 2
      - name: wide
        block: 512
        vector: 4
      - name: huge
        block: 1024
        vector: 4
    dispatch:
      - when: "batch <= 8 and n <= 4096"
        use: narrow
      - when: "n > 65536"
        use: {block: 1024, vector: 4}
      - when: "true"
        use: wide
"""

W8A8_FAMILY = """\
  - name: int8
    op: scaled_mm
    dtypes: [{a: int8, d: bf16}]
    epilogues: [ScaledEpilogue]
    configs:
      - {name: small, tile: [64, 64, 128], cluster: [1, 1, 1], schedule: warpspecialized}
      - {name: large, tile: [128, 128, 128], cluster: [2, 1, 1], schedule: pingpong}
    dispatch:
      - {when: "m <= 64", use: small}
      - {when: "true", use: large}
"""

SHORT = {"fp16": "f16", "fp32": "f32", "bf16": "bf16"}


@pytest.fixture(autouse=True)
def demo_family():
    """The demo family, known for the duration of one test only (an out-of-tree family)."""
    registry.register(family_demo.FAMILY)
    dispatch.cache_clear()
    yield family_demo.FAMILY
    registry.unregister(family_demo.FAMILY.name)
    dispatch.cache_clear()


def _write(tmp_path: Path, text: str, name: str = "manifest.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _line(text: str, needle: str) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


def _edit(old: str, new: str, text: str = MANIFEST) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _error(tmp_path: Path, text: str) -> ManifestError:
    with pytest.raises(ManifestError) as info:
        expand(load_manifest(_write(tmp_path, text)))
    return info.value


def _name(x: str, out: str, terse: str, arch: str = "sm90a") -> str:
    return f"{arch}_axpby_{SHORT[x]}_{SHORT[out]}_{terse}"


# ------------------------------------------------------------------ registry

def test_registry_knows_the_family_only_while_registered(demo_family):
    assert registry.for_op("axpby") is demo_family and registry.for_api_op("axpby") is demo_family
    assert registry.get("demo_axpby") is demo_family
    assert "axpby" in registry.known_ops() and "scaled_mm" in registry.known_ops()
    assert registry.for_op("scaled_mm").name == "w8a8"   # the shipped family is untouched
    registry.register(demo_family)                         # registering again is harmless
    with pytest.raises(ValueError, match="claims op"):     # a family may not take another's op
        registry.register(type("Thief", (type(demo_family),), {"name": "thief",
                                                                "ops": ("scaled_mm",)})())
    registry.unregister("demo_axpby")
    assert registry.for_op("axpby") is None
    with pytest.raises(ValueError, match="unknown op 'axpby'"):
        registry.for_api_op("axpby")
    registry.register(demo_family)


def test_discovery_refuses_two_folders_claiming_one_op(demo_family, monkeypatch):
    """Folders under gemmgen/families/ are checked against each other as `register` checks a
    registered family: a second folder taking an op is an error naming it, not a silent shadow."""
    thief = type("Thief", (type(demo_family),), {"name": "thief"})()
    modules = {"gemmgen.families.a_demo": SimpleNamespace(FAMILY=demo_family),
               "gemmgen.families.b_thief": SimpleNamespace(FAMILY=thief)}
    infos = [SimpleNamespace(name=name.rsplit(".", 1)[1], ispkg=True) for name in modules]
    monkeypatch.setattr(registry.pkgutil, "iter_modules", lambda path: infos)
    monkeypatch.setattr(registry.importlib, "import_module", modules.__getitem__)
    registry._discovered.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"op family 'thief' \(gemmgen/families/b_thief\) "
                                             r"claims op\(s\) \['axpby'\] of family 'demo_axpby'"):
            registry._discovered()
    finally:
        monkeypatch.undo()
        registry._discovered.cache_clear()
    assert registry.for_op("scaled_mm").name == "w8a8"  # the real folders again


def test_every_family_public_api_is_in_gemmgen_all(demo_family, monkeypatch):
    """`gemmgen.__all__` is every known family's public_api and the generic names: a new family's
    names are exported without a generic file changing (a registered one's too)."""
    import gemmgen

    monkeypatch.setattr(demo_family, "public_api", ("axpby",))
    exported = gemmgen.__all__
    assert len(exported) == len(set(exported))
    for family in registry.all_families():
        assert set(family.public_api) <= set(exported), family.name
    assert {"grouped_matmul_swiglu_quant", "MoeWeight", "mixed_mm", "scaled_mm", "list_kernels",
            "reload", "autotune"} <= set(exported)
    assert "axpby" in dir(gemmgen) and "reload" in dir(gemmgen)
    # two families may not export one name (gemmgen.<name> would take the first silently)
    copycat = type("Copycat", (type(demo_family),), {"name": "copycat", "ops": ("copy",),
                                                     "api_ops": ("copy",),
                                                     "public_api": ("mixed_mm",)})()
    with pytest.raises(ValueError, match=r"exports \['mixed_mm'\] as gemmgen.<name>, as family "
                                         r"'mixed' does"):
        registry.register(copycat)
    registry.unregister("demo_axpby")
    assert "axpby" not in gemmgen.__all__
    registry.register(demo_family)


def test_the_out_of_tree_include_dir_is_a_build_include_root(demo_family):
    dirs = include_dirs()
    assert dirs[0] == INCLUDE_DIR and demo_family.include_dir in dirs
    assert (demo_family.include_dir / demo_family.args.header).is_file()
    registry.unregister("demo_axpby")
    assert demo_family.include_dir not in include_dirs()
    registry.register(demo_family)


def test_a_library_compiles_with_its_own_families_include_roots_only(demo_family):
    """Adding (or registering) a family must not change another library's nvcc command line,
    or ninja would recompile all of it."""
    from gemmgen.build.toolchain import Toolchain
    toolchain = Toolchain("nvcc", "V13.0", Path("/cutlass"), "4.2.0")
    w8a8 = toolchain.compile_flags("sm90a", ["w8a8"])
    assert f"-I{demo_family.include_dir}" not in w8a8
    assert f"-I{registry.get('w8a8').include_dir}" in w8a8 and f"-I{INCLUDE_DIR}" in w8a8
    registry.unregister("demo_axpby")
    try:
        assert toolchain.compile_flags("sm90a", ["w8a8"]) == w8a8
    finally:
        registry.register(demo_family)
    assert f"-I{demo_family.include_dir}" in toolchain.compile_flags("sm90a", ["demo_axpby"])


# ------------------------------------------------------------------ manifest

def test_manifest_with_the_new_op_validates(tmp_path, demo_family):
    manifest = load_manifest(_write(tmp_path, MANIFEST))
    (family,) = manifest.families
    assert (family.name, family.op, family.plugin) == ("axpy", "axpby", demo_family)
    assert family.combos == (("fp16", "fp16"), ("fp16", "fp32"), ("bf16", "fp32"))
    assert family.variants[0] == (("x", "fp16"), ("out", "fp16"))
    assert [c.config for c in family.configs] == [AxpbyConfig(128, 2), AxpbyConfig(512, 4),
                                                  AxpbyConfig(1024, 4)]
    assert [c.line for c in family.configs] == [_line(MANIFEST, "name: narrow"),
                                                _line(MANIFEST, "name: wide"),
                                                _line(MANIFEST, "name: huge")]
    assert family.variants_line == _line(MANIFEST, "dtypes:")
    # dispatch rules: parsed over the family's own variables, `use` by name and by its keys
    assert [(r.condition.source, r.config_index, r.line) for r in family.dispatch] == [
        ("batch <= 8 and n <= 4096", 0, _line(MANIFEST, '"batch <= 8 and n <= 4096"')),
        ("n > 65536", 2, _line(MANIFEST, '"n > 65536"')),
        ("true", 1, _line(MANIFEST, '"true"'))]
    assert all(r.condition.variables == ("n", "batch") for r in family.dispatch)
    first = family.dispatch[0].condition
    assert first.matches(4096, 8) and not first.matches(4097, 8) and not first.matches(16, 9)


@pytest.mark.parametrize("old, new, needle, key, message", [
    # a key of its family entry it does not know (and one W8A8 knows)
    ("    dtypes:\n", "    epilogues: [ScaledEpilogue]\n    dtypes:\n", "epilogues:",
     "epilogues", "unknown key in families[0]; allowed keys: configs, dispatch, dtypes, name, op"),
    # its own variants
    ("      - x: bf16\n", "      - x: int8\n", "x: int8", "x", "unknown value 'int8'"),
    ("        out: fp32\n", "        out: fp64\n", "out: fp64", "out", "unknown output dtype 'fp64'"),
    ("      - x: bf16\n        out: fp32\n", "      - x: fp32\n        out: fp16\n", "out: fp16",
     "out", "fp16 is narrower than x (fp32)"),
    ("      - x: bf16\n", "      - xx: bf16\n", "- xx: bf16", "xx", "unknown key in dtypes[1]"),
    # its own config keys and legality rule
    ("        block: 512\n", "        block: 500\n", "block: 500", "block", "unknown value 500"),
    ("        block: 512\n", "        block: 512\n        tile: [1, 2, 3]\n", "tile:", "tile",
     "unknown key in configs[1]; allowed keys: block, name, vector"),
    ("        block: 1024\n        vector: 4\n", "        block: 1024\n        vector: 8\n",
     "vector: 8", "vector", "32 bytes; one load moves at most 16"),
    # generic checks over its configs
    ("        block: 1024\n        vector: 4\n", "        block: 512\n        vector: 4\n",
     "name: huge", "configs", "duplicate kernel: same compile-time config as line"),
    ("        use: {block: 1024, vector: 4}\n", "        use: {block: 1024, warp: 4}\n",
     "use: {block: 1024, warp: 4}", "warp", "unknown config key in dispatch `use`; allowed: block, vector"),
    ("        use: {block: 1024, vector: 4}\n", "        use: {vector: 4}\n", "use: {vector: 4}",
     "use", "matches 2 configs"),
    ("        use: narrow\n", "        use: tiny\n", "use: tiny", "use",
     "no config named 'tiny' in this family; names: narrow, wide, huge"),
])
def test_errors_on_its_own_keys_carry_file_line(tmp_path, old, new, needle, key, message):
    text = _edit(old, new)
    error = _error(tmp_path, text)
    assert (error.file, error.line, error.key) == (str(tmp_path / "manifest.yaml"),
                                                   _line(text, needle), key), str(error)
    assert message in error.detail, str(error)
    assert str(error).startswith(f"{tmp_path / 'manifest.yaml'}:{_line(text, needle)}: {key}: ")


def test_the_ops_arch_list_is_enforced(tmp_path, demo_family, monkeypatch):
    monkeypatch.setattr(type(demo_family), "arches", ("sm80",))
    error = _error(tmp_path, MANIFEST)
    assert (error.line, error.key) == (_line(MANIFEST, "op: axpby"), "op")
    assert "op 'axpby' (demo_axpby family) builds kernels for sm80" in error.detail


def test_an_unknown_op_lists_the_registered_one(tmp_path):
    text = _edit("op: axpby", "op: axpbz")
    error = _error(tmp_path, text)
    assert (error.line, error.key) == (_line(text, "op: axpbz"), "op")
    assert "axpby" in error.detail and "scaled_mm" in error.detail


# ----------------------------------------------------- dispatch conditions (n, batch)

@pytest.mark.parametrize("when, key, message", [
    ('"m <= 16"', "when", "unknown variable 'm' in dispatch condition 'm <= 16'; allowed: n, batch"),
    ('"k > 4 and batch < 3"', "when", "unknown variable 'k'"),
    ('"batch"', "when", "bare variable 'batch' is not a condition"),
    ('"n <= batch"', "when", "comparison between two variables"),
])
def test_conditions_over_other_variables_are_rejected_at_their_line(tmp_path, when, key, message):
    text = _edit('"batch <= 8 and n <= 4096"', when)
    error = _error(tmp_path, text)
    assert (error.line, error.key) == (_line(text, f"when: {when}"), key), str(error)
    assert message in error.detail, str(error)


def test_a_gap_over_its_variables_is_reported_with_a_point(tmp_path):
    text = _edit('      - when: "true"\n        use: wide\n', "")
    error = _error(tmp_path, text)
    assert (error.line, error.key) == (_line(text, "dispatch:"), "dispatch"), str(error)
    assert "no dispatch rule matches n=1, batch=9" in error.detail, str(error)


def test_an_unreachable_rule_is_reported_at_its_line(tmp_path):
    text = _edit('"n > 65536"', '"n <= 100 and batch <= 4"')
    error = _error(tmp_path, text)
    assert (error.line, error.key) == (_line(text, "n <= 100 and batch <= 4"), "when"), str(error)
    assert "rule 1 ('n <= 100 and batch <= 4') can never be chosen" in error.detail


# -------------------------------------------------------------- expand, render

@pytest.fixture
def built(tmp_path):
    manifest = load_manifest(_write(tmp_path, MANIFEST))
    return manifest, expand(manifest)


def test_expand_gives_its_specs_with_its_names(built):
    manifest, kernels = built
    assert all(type(k) is AxpbySpec and k.family == "demo_axpby" for k in kernels)
    expected = sorted(_name(x, out, terse) for x, out in [("fp16", "fp16"), ("fp16", "fp32"),
                                                          ("bf16", "fp32")]
                      for terse in ("b128_v2", "b512_v4", "b1024_v4"))
    assert [k.name for k in kernels] == expected
    k = next(k for k in kernels if k.name == "sm90a_axpby_f16_f32_b512_v4")
    assert (k.x, k.out, k.config, k.op, k.arch, k.library) == (
        "fp16", "fp32", AxpbyConfig(512, 4), "axpby", "sm90a", "demo_axpby")
    assert k.dispatch_class == ("axpby", "fp16", "fp32")
    assert k.knobs == RuntimeKnobs() and not k.split_k
    assert (k.origin.family, k.origin.config, k.origin.line) == ("axpy", "wide",
                                                                 _line(MANIFEST, "name: wide"))


def test_render_kernel_sources_uses_its_template(built, demo_family):
    manifest, kernels = built
    units = render_kernel_sources(manifest, kernels)
    # one translation unit per (config, at most kernels_per_file kernels): 3 configs x 2 parts
    assert sorted(u.name for u in units) == sorted(
        f"sm90a_axpby_{t}_part{p}.cu" for t in ("b128_v2", "b512_v4", "b1024_v4") for p in (0, 1))
    assert sorted(k.name for u in units for k in u.kernels) == [k.name for k in kernels]
    for unit in units:
        assert len({k.config for k in unit.kernels}) == 1 and len(unit.kernels) <= 2
        text = unit.source
        assert text.startswith(f"// Generated by gemmgen from {manifest.path}")
        assert '#include "gemmgen/demo_axpby/axpby_args.h"' in text
        assert "gemmgen::device_supports(9, 0, 9, 0)" in text  # the sm90a arch guard
        assert "needs an sm90 (Hopper) GPU" in text
        for k in unit.kernels:
            assert f"int gemmgen_run_{k.name}(const gemmgen_demo_axpby_args* args" in text
            assert f"size_t gemmgen_workspace_{k.name}(" in text
            element = {"fp16": "__half", "bf16": "__nv_bfloat16", "fp32": "float"}
            assert f"axpby<{element[k.x]}, {element[k.out]}, {k.config.vector}>" in text
        assert "scaled_mm" not in text and "cutlass::gemm" not in text


def test_render_library_source_exports_its_args_size_and_includes_its_header(built):
    manifest, kernels = built
    text = render_library_source(manifest, len(kernels), FINGERPRINT, kernels)
    assert '#include "gemmgen/demo_axpby/axpby_args.h"' in text
    assert re.search(r"^GEMMGEN_EXPORT size_t gemmgen_demo_axpby_args_size\(void\) \{\n"
                     r"  return sizeof\(gemmgen_demo_axpby_args\);", text, re.M)
    assert "gemmgen_scaled_mm_args" not in text and "w8a8" not in text
    # without a kernel list, the manifest's families say which ABIs the library carries
    assert render_library_source(manifest, len(kernels), FINGERPRINT) == text


def _exec_bindings(text: str) -> dict:
    namespace: dict = {"__name__": "gemmgen_test_bindings"}
    exec(compile(text, "bindings.py", "exec"), namespace)
    return namespace


def test_bindings_import_and_rebuild_its_specs(built):
    manifest, kernels = built
    text = render_bindings(manifest, kernels, FINGERPRINT, "libgemmgen_demo_axpby.so")
    assert "from family_demo import AxpbyConfig, AxpbySpec" in text
    ns = _exec_bindings(text)
    assert ns["KERNELS"] == tuple(kernels)
    for bound, kernel in zip(ns["KERNELS"], kernels):
        assert type(bound) is AxpbySpec and bound.name == kernel.name
        assert bound.origin == kernel.origin and bound.knobs == kernel.knobs
    assert set(ns["DISPATCH"]) == {("axpby", "fp16", "fp16"), ("axpby", "fp16", "fp32"),
                                   ("axpby", "bf16", "fp32")}
    lines = [r.line for r in manifest.families[0].dispatch]
    assert ns["DISPATCH"][("axpby", "bf16", "fp32")] == (
        ("batch <= 8 and n <= 4096", "sm90a_axpby_bf16_f32_b128_v2", lines[0]),
        ("n > 65536", "sm90a_axpby_bf16_f32_b1024_v4", lines[1]),
        ("true", "sm90a_axpby_bf16_f32_b512_v4", lines[2]))


# ------------------------------------------------------------------ dispatch

def _library(manifest, kernels) -> Library:
    """What load_library builds from the bindings, without a shared object (cdll=None)."""
    ns = _exec_bindings(render_bindings(manifest, kernels, FINGERPRINT, "lib.so"))
    library = Library(ns["LIBRARY"], ns["ARCH"], Path("."), ns["FINGERPRINT"], None, {}, {},
                      SimpleNamespace(**ns))
    library.kernels.update({s.name: Kernel(s, library, None, None) for s in ns["KERNELS"]})
    for key, rules in ns["DISPATCH"].items():
        variables = registry.get(library.kernels[rules[0][1]].spec.family).variables
        library.dispatch[key] = tuple((parse_condition(when, variables), name, line)
                                      for when, name, line in rules)
    return library


@pytest.fixture
def use(monkeypatch):
    def install(*libraries: Library):
        monkeypatch.setattr(dispatch, "libraries", lambda: libraries)
        monkeypatch.setattr(dispatch, "all_kernels",
                            lambda: {n: k for lib in libraries for n, k in lib.kernels.items()})
        dispatch.cache_clear()
    yield install
    dispatch.cache_clear()


def test_choose_is_memoized_per_call_and_gpu_and_forgets_with_the_choices(built, use, monkeypatch):
    """A repeated `choose` of the built libraries answers from its memo (the problem is not
    checked again), per GPU index; `cache_clear` forgets it; a wrong problem is never memoized."""
    manifest, kernels = built
    use(_library(manifest, kernels))
    problem = dict(x_dtype="fp16", out_dtype="fp16", n=4096, batch=8)
    first = dispatch.choose("axpby", **problem)
    assert dispatch.choose("axpby", **problem) is first
    requests = []
    checked = dispatch._dispatch_request
    monkeypatch.setattr(dispatch, "_dispatch_request",
                        lambda op, p: requests.append(op) or checked(op, p))
    assert dispatch.choose("axpby", **problem) is first and requests == []
    assert dispatch.choose("axpby", device=1, **problem) == first and requests == ["axpby"]
    assert dispatch.choose("axpby", device=1, **problem) is not first and requests == ["axpby"]
    dispatch.cache_clear()
    assert dispatch.choose("axpby", **problem) is not first and requests == ["axpby"] * 2
    for _ in range(2):  # an error is raised each time, not remembered
        with pytest.raises(ValueError, match="batch"):
            dispatch.choose("axpby", x_dtype="fp16", out_dtype="fp16", n=8, batch=0)


@pytest.mark.parametrize("x, out, n, batch, terse, rule", [
    ("fp16", "fp16", 4096, 8, "b128_v2", 0),
    ("fp16", "fp16", 4097, 8, "b512_v4", 2),
    ("fp16", "fp32", 100, 9, "b512_v4", 2),
    ("bf16", "fp32", 65537, 1, "b1024_v4", 1),
    ("bf16", "fp32", 1, 1, "b128_v2", 0),
    ("fp16", "fp32", 2**31 - 1, 2**20, "b1024_v4", 1),
])
def test_dispatch_picks_the_kernel_its_rules_say(built, use, x, out, n, batch, terse, rule):
    manifest, kernels = built
    use(_library(manifest, kernels))
    choice = dispatch.choose("axpby", x_dtype=x, out_dtype=out, n=n, batch=batch)
    assert choice.kernel.name == _name(x, out, terse)
    assert (choice.source, choice.rule_index) == ("rule", rule)
    assert choice.line == manifest.families[0].dispatch[rule].line
    assert choice.knobs == RuntimeKnobs()
    assert dispatch.lookup("axpby", x_dtype=x, out_dtype=out, n=n, batch=batch) is choice.kernel
    text = dispatch.explain("axpby", x_dtype=x, out_dtype=out, n=n, batch=batch)
    # rules are numbered from 1, as they stand in the manifest; the arch the answer is for first
    assert text.startswith("for sm90a (no GPU visible: assuming the arch preference sm90a, sm80), "
                           f"n={n}, batch={batch}: rule {rule + 1} of 3 (")
    assert f"it picks {_name(x, out, terse)}" in text
    assert f"{manifest.path}:{choice.line}" in text


def test_dispatch_errors_speak_its_language(built, use):
    manifest, kernels = built
    use(_library(manifest, kernels))
    with pytest.raises(ValueError, match="batch must be a positive int, got 0"):
        dispatch.choose("axpby", x_dtype="fp16", out_dtype="fp16", n=8, batch=0)
    # W8A8's problem description is not this op's: the op's own arguments are named
    with pytest.raises(ValueError, match=r"axpby: unknown argument 'a_dtype'; a problem of axpby "
                                         r"is described by x_dtype, out_dtype, n, batch"):
        dispatch.choose("axpby", a_dtype="int8", out_dtype="bf16", m=1, n=1, k=1)
    with pytest.raises(NoKernelError) as info:  # a class the library does not build
        dispatch.choose("axpby", x_dtype="fp32", out_dtype="fp32", n=8, batch=1)
    assert isinstance(info.value, ValueError) and info.value.op == "axpby"
    assert info.value.key == ("axpby", "fp32", "fp32") and not info.value.from_manifests
    copy = pickle.loads(pickle.dumps(info.value))
    assert ((copy.key, copy.arches, str(copy), copy.from_manifests)
            == (info.value.key, info.value.arches, str(info.value), False))
    assert "computes axpby fp32->fp32" in str(info.value)
    assert "built (arch, x, out): [('sm90a', 'bf16', 'fp32')" in str(info.value)


def test_kernels_lists_only_its_kernels(built, use, tmp_path):
    manifest, kernels = built
    w8a8 = load_manifest(_write(tmp_path, "library: w8\narch: sm90a\nfamilies:\n" + W8A8_FAMILY,
                                "w8.yaml"))
    use(_library(manifest, kernels), _library(w8a8, expand(w8a8)))
    assert [k.name for k in dispatch.kernels("axpby")] == [k.name for k in kernels]
    assert all(k.family.name == "demo_axpby" for k in dispatch.kernels("axpby"))
    # (name, config, origin) as README lists them: the origin is the manifest entry's file:line
    first = dispatch.kernels("axpby")[0]
    assert (first.name, first.config, first.origin) == (first.spec.name, first.spec.config,
                                                        first.spec.origin)
    assert first.origin is not None and first.origin.line > 0
    assert {k.spec.family for k in dispatch.kernels("scaled_mm")} == {"w8a8"}
    assert len(dispatch.kernels()) == len(kernels) + 2
    # the W8A8 op still dispatches beside it
    choice = dispatch.choose("scaled_mm", a_dtype="int8", out_dtype="bf16", m=8, n=64, k=64)
    assert choice.kernel.name.startswith("sm90a_scaled_mm_i8_bf16_scaled_t64x64x128")


def test_without_rules_the_first_config_serves(tmp_path, use):
    text = MANIFEST[:MANIFEST.index("    dispatch:")]
    manifest = load_manifest(_write(tmp_path, text))
    kernels = expand(manifest)
    library = _library(manifest, kernels)
    assert library.dispatch == {}
    use(library)
    choice = dispatch.choose("axpby", x_dtype="fp16", out_dtype="fp32", n=10**6, batch=100)
    assert choice.source == "default" and choice.kernel.name == _name("fp16", "fp32", "b128_v2")


# --------------------------------------------------------------- mixed manifest

def test_one_manifest_mixes_w8a8_and_the_demo_family(tmp_path, use):
    text = MANIFEST + W8A8_FAMILY
    manifest = load_manifest(_write(tmp_path, text))
    assert [(f.name, f.plugin.name) for f in manifest.families] == [("axpy", "demo_axpby"),
                                                                    ("int8", "w8a8")]
    kernels = expand(manifest)
    assert sorted({k.family for k in kernels}) == ["demo_axpby", "w8a8"]
    assert len([k for k in kernels if k.family == "demo_axpby"]) == 9
    assert len([k for k in kernels if k.family == "w8a8"]) == 2
    assert [k.name for k in kernels] == sorted(k.name for k in kernels)
    units = render_kernel_sources(manifest, kernels)
    for unit in units:  # one family per translation unit, each through its own template
        (family,) = {k.family for k in unit.kernels}
        marker = "gemmgen_demo_axpby_args*" if family == "demo_axpby" else "gemmgen_scaled_mm_args*"
        assert marker in unit.source
    library = render_library_source(manifest, len(kernels), FINGERPRINT, kernels)
    for symbol in ("gemmgen_demo_axpby_args_size", "gemmgen_scaled_mm_args_size"):
        assert f"GEMMGEN_EXPORT size_t {symbol}(void)" in library
    assert '#include "gemmgen/demo_axpby/axpby_args.h"' in library
    assert '#include "gemmgen/w8a8/scaled_mm_args.h"' in library
    ns = _exec_bindings(render_bindings(manifest, kernels, FINGERPRINT, "lib.so"))
    assert ns["KERNELS"] == tuple(kernels)
    assert {key[0] for key in ns["DISPATCH"]} == {"axpby", "scaled_mm"}
    # both ops dispatch from the one library, each over its own variables
    use(_library(manifest, kernels))
    assert dispatch.lookup("axpby", x_dtype="fp16", out_dtype="fp16", n=70000,
                           batch=1).name == "sm90a_axpby_f16_f16_b1024_v4"
    assert dispatch.lookup("scaled_mm", a_dtype="int8", out_dtype="bf16", m=65, n=64,
                           k=64).name.startswith("sm90a_scaled_mm_i8_bf16_scaled_t128x128x128")


# ------------------------------------------------- load_library, with a stub .so

def _stub_library(tmp_path: Path, manifest, kernels, size_skew: int = 0) -> Path:
    """A published library folder whose shared object is a C stub built by the host compiler
    from the family's own header (no CUDA): the symbols the loader looks up, nothing more."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    lib_dir = tmp_path / f"current{size_skew}"
    lib_dir.mkdir()
    stub = ['#include "gemmgen/demo_axpby/axpby_args.h"',
            'GEMMGEN_EXPORT const char* gemmgen_last_error(void) { return ""; }',
            f'GEMMGEN_EXPORT const char* gemmgen_library_fingerprint(void) {{ return "{FINGERPRINT}"; }}',
            "GEMMGEN_EXPORT size_t gemmgen_demo_axpby_args_size(void) "
            f"{{ return sizeof(gemmgen_demo_axpby_args) + {size_skew}; }}"]
    for k in kernels:
        stub.append(f"GEMMGEN_EXPORT int gemmgen_run_{k.name}(const void* a, void* w, size_t b, "
                    "void* s) { return 0; }")
        stub.append(f"GEMMGEN_EXPORT size_t gemmgen_workspace_{k.name}(const void* a) {{ return 0; }}")
    (lib_dir / "stub.c").write_text("\n".join(stub) + "\n")
    subprocess.run([cc, "-shared", "-fPIC", *(f"-I{d}" for d in include_dirs()),
                    str(lib_dir / "stub.c"), "-o", str(lib_dir / "lib.so")], check=True)
    (lib_dir / "bindings.py").write_text(render_bindings(manifest, kernels, FINGERPRINT, "lib.so"))
    return lib_dir


def test_load_library_checks_its_abi_and_parses_its_rules(built, tmp_path):
    """The real loader: its ABI size symbol against the ctypes mirror, every kernel's entry
    points, rules parsed over (n, batch)."""
    manifest, kernels = built
    library = load_library(_stub_library(tmp_path, manifest, kernels))
    assert sorted(library.kernels) == [k.name for k in kernels]
    assert ctypes.sizeof(AxpbyArgs) == 56
    rules = library.dispatch[("axpby", "fp16", "fp32")]
    assert [c.variables for c, _, _ in rules] == [("n", "batch")] * 3
    assert rules[1][0].matches(65537, 1) and not rules[1][0].matches(65536, 1)
    with pytest.raises(LibraryNotBuiltError, match="argument struct gemmgen_demo_axpby_args size"):
        load_library(_stub_library(tmp_path, manifest, kernels, size_skew=8))
