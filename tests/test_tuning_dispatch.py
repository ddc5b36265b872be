"""The dispatch chain with a tuned table, on a library built in memory (no compile, no GPU):
table exact shape → nearest shape → manifest rules → default; each fallback warned once."""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest

from gemmgen import dispatch
from gemmgen.bindings.library import Kernel, Library
from gemmgen.generator.dispatch_rules import parse_condition
from gemmgen.generator.kernel_config import RuntimeKnobs
from gemmgen.tuning.table import Bucket, ClassTable, ShapeEntry, kernel_set_hash, load_table, render_table

GPU = ("NVIDIA H200", 132)


def _library(case, with_rules: bool = True) -> Library:
    specs = case.expand()
    library = Library("demo", "sm90a", Path("."), "f" * 16, None, {}, {}, None)
    library.kernels.update({s.name: Kernel(s, library, None, None) for s in specs})
    if with_rules:  # the manifest's rules: small for m <= 64, large above
        for s in specs:
            if s.origin.config == "small":
                large = next(x.name for x in specs if x.origin.config == "large"
                             and (x.a, x.d, x.epilogue) == (s.a, s.d, s.epilogue))
                library.dispatch[("scaled_mm", s.a, s.d, s.epilogue)] = (
                    (parse_condition("m <= 64"), s.name, 40), (parse_condition("true"), large, 42))
    return library


def _name(library: Library, config: str, d: str = "bf16", epilogue: str = "ScaledEpilogueBias") -> str:
    return next(k.name for k in library.kernels.values()
                if (k.spec.origin.config, k.spec.d, k.spec.epilogue) == (config, d, epilogue))


def _with_table(library: Library, tmp_path, *, gpu=GPU, kernel_set=None) -> Library:
    small, large = _name(library, "small"), _name(library, "large")
    shape = ShapeEntry(4096, 4096, (Bucket(8, large, RuntimeKnobs("along_n", 4)),
                                    Bucket(4096, small, RuntimeKnobs())))
    meta = {"library": "demo", "arch": "sm90a", "gpu": gpu[0], "sm_count": gpu[1],
            "kernel_set": kernel_set or kernel_set_hash(library.kernels)}
    path = tmp_path / "demo.tuned.yaml"
    path.write_text(render_table(meta, [ClassTable(("scaled_mm", "int8", "bf16",
                                                     "ScaledEpilogueBias"), (shape,))]))
    object.__setattr__(library, "tables", (load_table(path, library.kernels),))
    return library


@pytest.fixture
def use(monkeypatch):
    def install(library: Library, gpu=GPU):
        monkeypatch.setattr(dispatch, "libraries", lambda: (library,))
        monkeypatch.setattr(dispatch, "all_kernels", lambda: dict(library.kernels))
        dispatch.cache_clear()
        monkeypatch.setattr(dispatch, "gpu_identity", functools.lru_cache(lambda device=None: gpu))
        return library
    yield install
    dispatch.cache_clear()


def _choose(m, n=4096, k=4096, d="bf16", epilogue="ScaledEpilogueBias", **kw):
    return dispatch.choose("scaled_mm", a_dtype="int8", out_dtype=d, epilogue=epilogue,
                           m=m, n=n, k=k, **kw)


def test_exact_shape_uses_the_table_bucket_and_its_knobs(case, use, tmp_path):
    library = use(_with_table(_library(case), tmp_path))
    choice = _choose(4)   # the table says large (with knobs) where the rules would say small
    assert choice.source == "table" and choice.kernel.name == _name(library, "large")
    assert choice.knobs == RuntimeKnobs("along_n", 4)
    assert "measured shape (n=4096, k=4096), bucket m <= 8" in choice.reason
    choice = _choose(2000)
    assert choice.kernel.name == _name(library, "small") and choice.knobs == RuntimeKnobs()
    text = dispatch.explain("scaled_mm", a_dtype="int8", out_dtype="bf16",
                            epilogue="ScaledEpilogueBias", m=4, n=4096, k=4096)
    assert "tuned table" in text and "raster along_n, swizzle 4" in text


def test_unmeasured_shape_uses_the_nearest_one_and_warns_once(case, use, tmp_path, caplog):
    use(_with_table(_library(case), tmp_path))
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        first = _choose(4, n=5120)
        _choose(5, n=5120)
    assert first.source == "table" and "nearest measured shape (n=4096, k=4096)" in first.reason
    warnings = [r for r in caplog.records if "nearest measured shape" in r.getMessage()]
    assert len(warnings) == 1 and "(n=5120, k=4096) was not tuned" in warnings[0].getMessage()


def test_other_epilogue_and_dtype_use_the_same_configs_sibling(case, use, tmp_path):
    library = use(_with_table(_library(case), tmp_path))
    choice = _choose(4, d="fp16", epilogue="ScaledEpilogue")
    assert choice.source == "table"
    assert choice.kernel.name == _name(library, "large", "fp16", "ScaledEpilogue")
    assert "measured as int8 bf16 ScaledEpilogueBias" in choice.reason


@pytest.mark.parametrize("gpu, kernel_set, why", [
    (("NVIDIA H100 PCIe", 114), None, "measured on NVIDIA H200 (132 SMs), this GPU is NVIDIA H100 PCIe"),
    (GPU, "0" * 16, "another kernel set"),
])
def test_mismatched_table_falls_back_to_the_rules_with_one_warning(case, use, tmp_path, caplog,
                                                                   gpu, kernel_set, why):
    library = _with_table(_library(case), tmp_path, kernel_set=kernel_set)
    use(library, gpu=gpu)
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        choices = [_choose(m) for m in (4, 5, 2000)]
    assert [c.source for c in choices] == ["rule"] * 3
    assert choices[0].kernel.name == _name(library, "small") and choices[0].rule == "m <= 64"
    assert choices[2].kernel.name == _name(library, "large")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and why in messages[0] and "falls back" in messages[0]


def test_without_a_table_the_rules_serve_and_say_so(case, use, caplog):
    library = use(_library(case))
    with caplog.at_level(logging.INFO, logger="gemmgen.dispatch"):
        choice = _choose(4)
        _choose(100)
    assert choice.source == "rule" and choice.kernel.name == _name(library, "small")
    assert "(no tuned table)" in choice.reason
    notes = [r for r in caplog.records if "no tuned table" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO  # nothing fell back: not a warning


def test_tuned_false_skips_the_table(case, use, tmp_path):
    library = use(_with_table(_library(case), tmp_path))
    choice = _choose(4, tuned=False)
    assert choice.source == "rule" and choice.kernel.name == _name(library, "small")
    assert "not consulted" in choice.reason


def test_no_rules_and_no_table_entry_still_has_a_default(case, use, caplog):
    library = use(_library(case, with_rules=False))
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        choice = _choose(4, d="fp16", epilogue="ScaledEpilogue")
    assert choice.source == "default"
    assert choice.kernel.name == _name(library, "small", "fp16", "ScaledEpilogue")  # first config
    assert any("has no dispatch rules" in r.getMessage() for r in caplog.records)
