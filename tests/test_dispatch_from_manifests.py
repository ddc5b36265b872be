"""Dispatch decisions from the manifests alone, before anything is built (no compile, no GPU):
`dispatch.choose/lookup/explain(..., source="manifests")` (or `manifests=[paths]`) and `gemmgen
list --dispatch --manifests`; explain names the arch and GPU its answer is for; rules are named
1-based with their manifest line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gemmgen import dispatch, settings
from gemmgen.bindings import library as binding_library
from gemmgen.bindings.library import manifest_libraries, manifest_library
from gemmgen.cli import main as cli_main
from gemmgen.errors import LibraryNotBuiltError, NoKernelError
from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import load_manifest
from gemmgen.generator.render import render_bindings

INT8_BIAS = dict(a_dtype="int8", out_dtype="bf16", epilogue="ScaledEpilogueBias")


@pytest.fixture(autouse=True)
def _fresh():
    dispatch.cache_clear()
    binding_library.reload()
    yield
    dispatch.cache_clear()
    binding_library.reload()


@pytest.fixture
def no_built_library(monkeypatch, tmp_path):
    """An empty build directory: nothing is built."""
    monkeypatch.setenv(settings.BUILD_DIR_VARIABLE, str(tmp_path / "empty"))


def test_the_rules_of_a_manifest_without_a_build(case, no_built_library):
    path = case.write()
    with pytest.raises(LibraryNotBuiltError):
        dispatch.choose("scaled_mm", m=4, n=64, k=64, **INT8_BIAS)
    for m, config, index in ((4, "small", 0), (64, "small", 0), (65, "large", 1)):
        choice = dispatch.choose("scaled_mm", m=m, n=64, k=64, manifests=[path], **INT8_BIAS)
        assert choice.source == "rule" and choice.kernel.spec.origin.config == config
        assert choice.rule_index == index and choice.line == case.line(
            'when: "m <= 64"' if index == 0 else 'when: "true"')
        # rules are named as the manifest names them: 1-based, with their line
        assert f"rule {index + 1} of 2 ({path}:{choice.line}): " in choice.reason
    kernel = dispatch.lookup("scaled_mm", m=4, n=64, k=64, manifests=[path], **INT8_BIAS)
    assert not kernel.library.built and kernel.library.manifest == str(path)
    with pytest.raises(LibraryNotBuiltError, match=rf"{kernel.name} was read from the manifest "
                                                   rf".*`gemmgen build {re.escape(str(path))}`"):
        kernel(None, None, None, None)
    assert len(dispatch.kernels("scaled_mm", manifests=[path])) == len(expand(load_manifest(path)))


def test_the_libraries_read_from_manifests_match_the_generated_bindings(case):
    """What `gemmgen build` would publish: the same kernels and the same expanded rules."""
    path = case.write()
    manifest = load_manifest(path)
    specs = expand(manifest)
    ns: dict = {}
    exec(compile(render_bindings(manifest, specs, "f" * 16, "lib.so"), "<bindings>", "exec"), ns)
    library = manifest_library(path)
    assert (library.name, library.arch) == (ns["LIBRARY"], ns["ARCH"])
    assert tuple(k.spec for k in library.kernels.values()) == ns["KERNELS"]
    assert {key: tuple((c.source, name, line) for c, name, line in rules)
            for key, rules in library.dispatch.items()} == ns["DISPATCH"]


def test_explain_names_the_arch_and_that_no_gpu_is_visible(case):
    path = case.write()
    text = dispatch.explain("scaled_mm", m=4, n=64, k=64, manifests=[path], **INT8_BIAS)
    assert text.startswith(f"for sm90a (no GPU visible: assuming the arch preference sm90a, sm80), "
                           f"from the manifest {path} (not built), m=4, n=64, k=64: rule 1 of 2 (")
    text = dispatch.explain("scaled_mm", m=4, n=64, k=64, arch="sm90a", manifests=[path], **INT8_BIAS)
    assert text.startswith("for sm90a (arch sm90a asked for; no GPU visible), from the manifest")


def test_explain_names_the_gpu_when_one_is_visible(case, monkeypatch):
    path = case.write()
    monkeypatch.setattr(dispatch, "gpu_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(dispatch, "gpu_identity", lambda device=None: ("NVIDIA H200", 132))
    text = dispatch.explain("scaled_mm", m=4, n=64, k=64, manifests=[path], **INT8_BIAS)
    assert text.startswith("for sm90a on NVIDIA H200 (cc 9.0), from the manifest")


def test_a_gpu_of_capability_8_gets_the_sm80_kernels(monkeypatch):
    """Without `arch`, dispatch tries the arches that run on the GPU (not sm90a on an L40S)."""
    monkeypatch.setattr(dispatch, "gpu_capability", lambda device=None: (8, 9))
    monkeypatch.setattr(dispatch, "gpu_identity", lambda device=None: ("NVIDIA L40S", 142))
    choice = dispatch.choose("scaled_mm", m=37, n=4096, k=4096, source="manifests", **INT8_BIAS)
    assert choice.kernel.spec.arch == "sm80"
    text = dispatch.explain("scaled_mm", m=37, n=4096, k=4096, source="manifests", **INT8_BIAS)
    assert text.startswith("for sm80 on NVIDIA L40S (cc 8.9), from the manifest ")


def test_the_shipped_manifests_and_their_tuned_table(no_built_library):
    """The default: the shipped manifests with the table beside w8a8_sm90.yaml (H200)."""
    libraries = manifest_libraries()
    assert {lib.name for lib in libraries} >= {"w8a8", "w8a8_sm80", "mixed"}
    w8a8 = next(lib for lib in libraries if lib.name == "w8a8")
    assert w8a8.tables and not any(t.partial for t in w8a8.tables)
    choice = dispatch.choose("scaled_mm", m=37, n=4096, k=4096, source="manifests", **INT8_BIAS)
    assert choice.source == "table" and choice.kernel.library is w8a8
    assert "not checked: no GPU visible" in choice.reason  # used unchecked, and said so
    rules = dispatch.choose("scaled_mm", m=37, n=4096, k=4096, source="manifests", tuned=False,
                            **INT8_BIAS)
    assert rules.source == "rule" and re.search(r"rule \d+ of \d+ \(.*w8a8_sm90\.yaml:\d+\): ", rules.reason)
    sm80 = dispatch.explain("scaled_mm", m=37, n=4096, k=4096, source="manifests", arch="sm80", **INT8_BIAS)
    assert sm80.startswith("for sm80 (arch sm80 asked for; no GPU visible), from the manifest ")
    assert "w8a8_sm80.yaml" in sm80 and "(no tuned table)" in sm80


def test_an_unlisted_shape_on_the_h200_takes_the_estimate_from_the_four_nearest_shapes(monkeypatch,
                                                                                      no_built_library):
    """Gemma-3-27B's qkv (8192 x 5376), in no table: the H200 table's cost model
    transfers each kernel's times from the 4 nearest listed shapes (cost_model.REFERENCES) and
    the lowest blended estimate wins; the reason names those shapes."""
    from gemmgen import families
    from gemmgen.tuning import cost_model
    monkeypatch.setattr(dispatch, "gpu_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(dispatch, "gpu_identity", lambda device=None: ("NVIDIA H200", 132))
    dispatch.cache_clear()
    try:
        choice = dispatch.choose("scaled_mm", m=192, n=8192, k=5376, source="manifests", **INT8_BIAS)
    finally:
        dispatch.cache_clear()
    w8a8 = next(lib for lib in manifest_libraries() if lib.name == "w8a8")
    table = next(t for t in w8a8.tables if t.gpu[0] == "NVIDIA H200")
    model = table.classes[("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")].model
    refs = model.nearest_shapes(8192, 5376)
    assert len(refs) == cost_model.REFERENCES == 4 and (8192, 5376) not in model.shapes
    family = families.for_op("scaled_mm")
    estimates = model.blended_estimates(
        192, 8192, 5376, refs, lambda name, m, n, k: family.cost_features(w8a8.kernels[name].spec, m, n, k, 132),
        list(model.coef))
    best = min(estimates, key=lambda name: (estimates[name], name))
    assert choice.source == "table" and choice.kernel.name == best
    assert f"cost model estimate {estimates[best]:.1f} µs" in choice.reason
    assert "4 nearest measured shapes (" + "; ".join(f"n={n}, k={k}" for n, k in refs) + ")" in choice.reason


def test_a_shape_only_the_h200_tuned_is_served_on_the_h100_from_both_tables(monkeypatch, no_built_library):
    """Qwen2.5-7B's down projection (3584 x 18944) is in the H200's table, not the H100's: on the
    H100 each kernel's estimate is the geometric mean of its own table's cost model and its H200
    time there scaled by its H100 / H200 time ratio over the shapes both tables list; a shape
    neither lists takes the own model alone, and the H200 (which lists every H100 shape) never
    takes the H100's."""
    import math
    from gemmgen import families
    from gemmgen.tuning import cost_model
    key = ("scaled_mm", "e4m3", "bf16", "ScaledEpilogueBias")
    problem = dict(a_dtype="e4m3", out_dtype="bf16", epilogue="ScaledEpilogueBias")
    w8a8 = next(lib for lib in manifest_libraries() if lib.name == "w8a8")
    h100, h200 = (next(t for t in w8a8.tables if t.gpu[0] == name)
                  for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"))
    own, other = h100.classes[key].model, h200.classes[key].model
    assert (3584, 18944) in other.shapes and (3584, 18944) not in own.shapes
    assert (8192, 5376) not in other.shapes | own.shapes and own.shapes <= other.shapes
    family = families.for_op("scaled_mm")

    def features(name, m, n, k):
        return family.cost_features(w8a8.kernels[name].spec, m, n, k, 132)

    def choose_on(gpu, m, n, k):
        monkeypatch.setattr(dispatch, "gpu_capability", lambda device=None: (9, 0))
        monkeypatch.setattr(dispatch, "gpu_identity", lambda device=None: (gpu, 132))
        dispatch.cache_clear()
        try:
            return dispatch.choose("scaled_mm", m=m, n=n, k=k, source="manifests", **problem)
        finally:
            dispatch.cache_clear()

    mine = own.blended_estimates(64, 3584, 18944, own.nearest_shapes(3584, 18944), features, list(own.coef))
    there = cost_model.sibling_estimates(cost_model.gpu_time_ratios(own, other), other, 64, 3584, 18944, features,
                                         list(mine))
    both = {name: math.sqrt(mine[name] * there[name]) for name in mine if name in there}
    best = min(both, key=lambda name: (both[name], name))
    choice = choose_on("NVIDIA H100 80GB HBM3", 64, 3584, 18944)
    assert choice.source == "table" and choice.kernel.name == best
    assert f"cost model estimate {both[best]:.1f} µs" in choice.reason
    assert ("with its time at this very shape on NVIDIA H200" in choice.reason
            and f"over the {len(own.shapes & other.shapes)} shapes both tables list" in choice.reason)
    assert "at this very shape" not in choose_on("NVIDIA H100 80GB HBM3", 64, 8192, 5376).reason
    assert "at this very shape" not in choose_on("NVIDIA H200", 64, 8192, 5376).reason


def test_the_shipped_mixed_tables_serve_listed_shapes_and_the_rules_the_rest(no_built_library):
    """The mixed family's tables (H100 and H200) list the dense models of manifests/shapes/; a
    shape they do not list goes to the rules, never to the nearest listed shape's winner."""
    import torch
    mixed = next(lib for lib in manifest_libraries() if lib.name == "mixed")
    assert {t.gpu[0] for t in mixed.tables} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    problem = dict(a_dtype=torch.bfloat16, weight_type="uint4", m=64)
    listed = dispatch.choose("mixed_mm", n=4608, k=3584, source="manifests", **problem)
    assert listed.source == "table" and "measured shape (n=4608, k=3584)" in listed.reason
    unlisted = dispatch.choose("mixed_mm", n=4352, k=3840, source="manifests", **problem)
    rules = dispatch.choose("mixed_mm", n=4352, k=3840, source="manifests", tuned=False, **problem)
    assert unlisted.source == "rule" and (unlisted.kernel, unlisted.knobs) == (rules.kernel, rules.knobs)
    # fp16 was not tuned (the tune measured bf16): the bf16 entries pick the same config's fp16
    # kernel on listed shapes; unlisted ones take the rules
    fp16 = dict(problem, a_dtype=torch.float16)
    proxy = dispatch.choose("mixed_mm", n=4608, k=3584, source="manifests", **fp16)
    assert proxy.source == "table" and "measured as bf16 int4 scale_zero and applied to the same " \
        "config's fp16 int4 scale_zero kernel" in proxy.reason
    assert proxy.kernel.spec.a == "fp16" and proxy.kernel.spec.origin == listed.kernel.spec.origin
    assert proxy.knobs == listed.knobs
    assert dispatch.choose("mixed_mm", n=4352, k=3840, source="manifests", **fp16).source == "rule"


def test_the_shipped_moe_tables_serve_their_layers_and_the_rules_the_rest(no_built_library):
    """The MoE family's tables (H100 and H200) list the expert layers of manifests/shapes/moe_*
    (the bucket's kernel is the one the table file names); another layer goes to the rules."""
    import torch
    moe = next(lib for lib in manifest_libraries() if lib.name == "moe")
    assert {t.gpu[0] for t in moe.tables} == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    # the fp8 fast-accumulation configs (session 34) were tuned on the H200 only: the H100 table
    # keeps its entries (all of kernels the library still has) and lacks the new kernels
    assert {t.gpu[0] for t in moe.tables if t.partial} == {"NVIDIA H100 80GB HBM3"}
    problem = dict(x_dtype=torch.int8, m=512, experts=8)
    listed = dispatch.choose("grouped_matmul_swiglu_quant", n=28672, k=4096, source="manifests", **problem)
    assert listed.source == "table" and "measured shape (n=28672, k=4096), bucket rows <= " in listed.reason
    path, line = re.search(r"tuned table \((\S+\.yaml):(\d+);", listed.reason).groups()
    assert f"kernel: {listed.kernel.name}," in open(path).read().splitlines()[int(line) - 1]
    unlisted = dispatch.choose("grouped_matmul_swiglu_quant", n=28160, k=4096, source="manifests", **problem)
    rules = dispatch.choose("grouped_matmul_swiglu_quant", n=28160, k=4096, source="manifests",
                            tuned=False, **problem)
    assert unlisted.source == "rule" and (unlisted.kernel, unlisted.knobs) == (rules.kernel, rules.knobs)


def test_moe_rows_between_the_tuned_points_take_the_bucket_that_covers_them(no_built_library):
    """Dispatch rounds rows up to MOE_M_GRID before it reads a table. A table tuned on fewer of
    its points (the shipped H100 table: 512 and 768, not 640) buckets at its own points, so rows
    in between take the bucket that covers them; and through dispatch, whichever shipped table
    this machine's GPU takes, a problem gets the bucket of its rounded rows."""
    import torch
    from gemmgen.families.moe import rows_key
    from gemmgen.tuning.shapes import SHAPES_DIR
    from gemmgen.tuning.table import load_table
    assert [rows_key(m) for m in (2, 257, 320, 600, 641, 8193)] == [2, 320, 320, 640, 768, 16384]
    key = ("grouped_matmul_swiglu_quant", "int8", "int8", "channel")
    coarse = load_table(SHAPES_DIR.parent / "moe_sm90.tuned.h100-80gb-hbm3.yaml")
    assert 512 in coarse.metadata["m_grid"] and 640 not in coarse.metadata["m_grid"]
    at = {m: coarse.classes[key].lookup(rows_key(m), 28672, 4096).bucket for m in (600, 640, 768)}
    assert at[600] == at[640] == at[768] and at[768].m_max == 768
    problem = dict(x_dtype=torch.int8, experts=8, n=28672, k=4096, source="manifests")
    for m in (600, 640, 768, 1000):
        choice = dispatch.choose("grouped_matmul_swiglu_quant", m=m, **problem)
        assert choice.source == "table"
        path = re.search(r"tuned table \((\S+\.yaml):\d+", choice.reason).group(1)
        bucket = load_table(path).classes[key].lookup(rows_key(m), 28672, 4096).bucket
        assert choice.kernel.name == bucket.kernel, (m, path)


def test_a_problem_description_with_a_wrong_argument_is_refused_by_name():
    """choose / explain name an unknown or missing argument and the op's problem arguments
    (not a TypeError from inside the family)."""
    import torch
    with pytest.raises(ValueError, match=r"grouped_matmul_swiglu_quant: unknown argument 'rows'; a "
                                         r"problem of grouped_matmul_swiglu_quant is described by "
                                         r"x_dtype, m, experts, n, k, weight_bits \(optional\), "
                                         r"per_group \(optional\)"):
        dispatch.explain("grouped_matmul_swiglu_quant", source="manifests", x_dtype=torch.int8,
                         rows=512, experts=8, n=28672, k=4096)
    with pytest.raises(ValueError, match=r"scaled_mm: missing argument 'k'; a problem of scaled_mm "
                                         r"is described by "):
        dispatch.choose("scaled_mm", source="manifests", m=37, n=4096, **INT8_BIAS)


def test_a_class_no_manifest_builds_is_a_no_kernel_error():
    """fp8 with an azp epilogue: no shipped manifest builds it, so dispatch from the manifests
    raises NoKernelError (a ValueError) with the class key and `from_manifests`; an epilogue of
    the other op is the problem description's own ValueError."""
    import torch
    with pytest.raises(NoKernelError, match=r"no kernel of the manifests .* computes scaled_mm "
                                            r"e4m3->bf16 with ScaledEpilogueAzp") as info:
        dispatch.lookup("scaled_mm_azp", source="manifests", a_dtype=torch.float8_e4m3fn,
                        out_dtype=torch.bfloat16, epilogue="ScaledEpilogueAzp", m=8, n=512, k=256)
    assert info.value.key == ("scaled_mm", "e4m3", "bf16", "ScaledEpilogueAzp")
    assert info.value.from_manifests and set(info.value.arches) >= {"sm90a"}
    with pytest.raises(ValueError, match=r"epilogue 'ScaledEpilogueAzp' does not belong to op "
                                         r"'scaled_mm'"):
        dispatch.lookup("scaled_mm", source="manifests", a_dtype=torch.int8,
                        out_dtype=torch.bfloat16, epilogue="ScaledEpilogueAzp", m=8, n=512, k=256)


def test_a_problems_arguments_are_read_from_the_familys_signature(monkeypatch):
    """Positional-or-keyword parameters count as the problem's arguments; with **problem, an
    unknown name is left to the family."""
    from gemmgen import families as registry

    class Named:
        def dispatch_request(self, op, a_dtype, *, m, n=1):
            return (op, a_dtype), (m, n)

    class OpenEnded:
        def dispatch_request(self, op, *, m, **extra):
            return (op,), (m, len(extra))

    monkeypatch.setattr(registry, "for_api_op", lambda op: Named())
    assert dispatch._dispatch_request("x", {"a_dtype": "int8", "m": 3})[1] == (("x", "int8"), (3, 1))
    with pytest.raises(ValueError, match=r"x: missing argument 'a_dtype'; a problem of x is "
                                         r"described by a_dtype, m, n \(optional\)"):
        dispatch._dispatch_request("x", {"m": 3})
    monkeypatch.setattr(registry, "for_api_op", lambda op: OpenEnded())
    assert dispatch._dispatch_request("x", {"m": 3, "tag": 1})[1] == (("x",), (3, 1))
    with pytest.raises(ValueError, match=r"x: missing argument 'm'"):
        dispatch._dispatch_request("x", {"tag": 1})


def test_an_edited_manifest_is_read_again(case):
    path = case.write()
    assert dispatch.lookup("scaled_mm", m=4, n=64, k=64, manifests=[path], **INT8_BIAS).spec.origin.config == "small"
    case.replace('when: "m <= 64"', 'when: "m <= 2"')
    case.write()
    assert dispatch.lookup("scaled_mm", m=4, n=64, k=64, manifests=[path], **INT8_BIAS).spec.origin.config == "large"


def test_bad_source_and_two_manifests_of_one_library(case, tmp_path):
    with pytest.raises(ValueError, match="unknown source 'everything'"):
        dispatch.choose("scaled_mm", m=4, n=64, k=64, source="everything", **INT8_BIAS)
    first = case.write()
    second = tmp_path / "other.yaml"
    second.write_text(case.text)
    with pytest.raises(Exception, match="both build library 'demo'"):
        dispatch.choose("scaled_mm", m=4, n=64, k=64, manifests=[first, second], **INT8_BIAS)


def test_one_manifest_path_and_one_file_named_two_ways(case, tmp_path):
    """`manifests=` takes one path (str or Path) as well as a list; one file named two ways (a
    relative path and an absolute one, a link) is one manifest, as `gemmgen validate` counts it."""
    path = case.write()
    want = dispatch.lookup("scaled_mm", m=4, n=64, k=64, manifests=[path], **INT8_BIAS).name
    for one in (str(path), path):
        assert dispatch.lookup("scaled_mm", m=4, n=64, k=64, manifests=one, **INT8_BIAS).name == want
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    assert dispatch.lookup("scaled_mm", m=4, n=64, k=64, manifests=[path, link, str(path)],
                           **INT8_BIAS).name == want


def test_a_weight_type_of_another_type_is_refused_by_name():
    import torch
    with pytest.raises(ValueError, match=r"weight_type must be one of .*; got \['uint4b8'\]"):
        dispatch.choose("mixed_mm", source="manifests", a_dtype=torch.bfloat16,
                        weight_type=["uint4b8"], m=1, n=4096, k=4096)


# ------------------------------------------------------------------------------ CLI

def test_cli_list_dispatch_from_the_manifests(case, capsys, no_built_library):
    path = case.write()
    assert cli_main(["list", "--dispatch", "--manifests", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"demo (sm90a, 8 kernels) from {path} (not built)\n")
    first, second = case.line('when: "m <= 64"'), case.line('when: "true"')
    assert re.search(rf"    rule 1 of 2 \(line {first}\): +'m <= 64' +-> sm90a_scaled_mm_i8_bf16_scaled_t64x64", out)
    assert re.search(rf"    rule 2 of 2 \(line {second}\): +'true' +-> sm90a_scaled_mm_i8_bf16_scaled_t128x128", out)


def test_cli_list_dispatch_without_a_build_points_at_manifests(capsys, no_built_library):
    assert cli_main(["list", "--dispatch"]) == 1
    err = capsys.readouterr().err
    assert "`gemmgen build`" in err and "`gemmgen list --dispatch --manifests`" in err
    assert err.count("\n") == 1
    assert cli_main(["list", "--dispatch", "--manifests"]) == 0  # the shipped manifests
    out = capsys.readouterr().out
    assert "w8a8 (sm90a, " in out and "tuned table: " in out and "entries; a cost model for untuned shapes in 2 of 2 classes)" in out
    assert "(NVIDIA H100 80GB HBM3, 132 SMs" in out and "(NVIDIA H200, 132 SMs" in out
    assert cli_main(["list", "--manifests", "--build-dir", "x"]) == 1
    assert "drop --build-dir" in capsys.readouterr().err


def test_choice_reason_keeps_the_0_based_rule_index(case):
    path = case.write()
    choice = dispatch.choose("scaled_mm", m=100, n=64, k=64, manifests=[path], **INT8_BIAS)
    assert (choice.rule_index, choice.rule) == (1, "true")
    line = case.line('when: "true"')
    assert choice.reason.startswith(f"rule 2 of 2 ({path}:{line}): 'true' is the first that matches "
                                    "(no tuned table)")
    assert dispatch.rule_label(2, 5, 68) == "rule 3 of 5 (line 68)"


def test_a_stand_in_class_shares_the_family_fields_and_bad_fields_are_refused():
    """`table_proxy_fields` are indices into the class key; another index is a family bug."""
    from types import SimpleNamespace
    bf16, i8 = ("mixed_mm", "bf16", "int4", "scale"), ("mixed_mm", "bf16", "int8", "scale")
    table = SimpleNamespace(classes={bf16: "bf16 int4", i8: "bf16 int8"})
    assert dispatch._proxy_class(table, ("mixed_mm", "fp16", "int4", "scale"), (0, 2, 3)) == "bf16 int4"
    assert dispatch._proxy_class(table, ("mixed_mm", "fp16", "int4", "scale_zero"), (0, 2, 3)) is None
    with pytest.raises(ValueError, match="table_proxy_fields"):
        dispatch._proxy_class(table, bf16, (0, 4))


def test_cli_list_dispatch_names_a_cost_model_of_an_older_feature_set(capsys, no_built_library, tmp_path):
    from gemmgen.families.w8a8 import FAMILY as W8A8
    from gemmgen.settings import DEFAULT_MANIFEST_DIR
    manifest = tmp_path / "w8a8_sm90.yaml"
    manifest.write_text((Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.yaml").read_text())
    table = (Path(DEFAULT_MANIFEST_DIR) / "w8a8_sm90.tuned.h100-80gb-hbm3.yaml").read_text()
    assert f"features: {W8A8.cost_feature_set}" in table
    (tmp_path / "w8a8_sm90.tuned.h100-80gb-hbm3.yaml").write_text(
        table.replace(f"features: {W8A8.cost_feature_set}", "features: w8a8-tiles-0"))
    assert cli_main(["list", "--dispatch", "--manifests", str(manifest)]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 classes, of feature set w8a8-tiles-0, which this gemmgen refits from the stored times" in out
    assert f"`gemmgen tune --refit {tmp_path / 'w8a8_sm90.tuned.h100-80gb-hbm3.yaml'}` rewrites it" in out
