"""The shipped weight-shape files, their loader's file:line:key errors, and the M grid parser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gemmgen.errors import ManifestError
from gemmgen.tuning.shapes import (DEFAULT_M_GRID, SHAPES_DIR, WeightShape, load_many, load_shapes,
                                   parse_m_grid, resolve_shapes_arg)

# stem -> (model, {name: (n, k)}), from the published configs (see each file's header).
EXPECTED = {
    "llama3_8b": ("Llama-3-8B", {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096),
                                 "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}),
    "llama3_70b": ("Llama-3-70B", {"qkv_proj": (10240, 8192), "o_proj": (8192, 8192),
                                   "gate_up_proj": (57344, 8192), "down_proj": (8192, 28672)}),
    "llama2_70b": ("Llama-2-70B", {"qkv_proj": (10240, 8192), "o_proj": (8192, 8192),
                                   "gate_up_proj": (57344, 8192), "down_proj": (8192, 28672)}),
    "qwen2_5_7b": ("Qwen2.5-7B", {"qkv_proj": (4608, 3584), "o_proj": (3584, 3584),
                                  "gate_up_proj": (37888, 3584), "down_proj": (3584, 18944)}),
    "qwen2_5_72b": ("Qwen2.5-72B", {"qkv_proj": (10240, 8192), "o_proj": (8192, 8192),
                                    "gate_up_proj": (59136, 8192), "down_proj": (8192, 29568)}),
    "mixtral_8x7b": ("Mixtral-8x7B", {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096),
                                      "w13": (28672, 4096), "w2": (4096, 14336)}),
    "llama3_2_3b": ("Llama-3.2-3B", {"qkv_proj": (5120, 3072), "o_proj": (3072, 3072),
                                     "gate_up_proj": (16384, 3072), "down_proj": (3072, 8192)}),
    "qwen3_32b": ("Qwen3-32B", {"qkv_proj": (10240, 5120), "o_proj": (5120, 8192),
                                "gate_up_proj": (51200, 5120), "down_proj": (5120, 25600)}),
    "mistral_nemo_12b": ("Mistral-Nemo-12B", {"qkv_proj": (6144, 5120), "o_proj": (5120, 4096),
                                              "gate_up_proj": (28672, 5120), "down_proj": (5120, 14336)}),
    "gemma2_9b": ("Gemma-2-9B", {"qkv_proj": (8192, 3584), "o_proj": (3584, 4096),
                                 "gate_up_proj": (28672, 3584), "down_proj": (3584, 14336)}),
    "gemma2_27b": ("Gemma-2-27B", {"qkv_proj": (8192, 4608), "o_proj": (4608, 4096),
                                   "gate_up_proj": (73728, 4608), "down_proj": (4608, 36864)}),
    "llama3_70b_tp8": ("Llama-3-70B (TP=8)", {"qkv_proj": (1280, 8192), "o_proj": (8192, 1024),
                                              "gate_up_proj": (7168, 8192), "down_proj": (8192, 3584)}),
    "phi3_medium_14b": ("Phi-3-medium-14B", {"qkv_proj": (7680, 5120), "o_proj": (5120, 5120),
                                             "gate_up_proj": (35840, 5120), "down_proj": (5120, 17920)}),
    "yi1_5_34b": ("Yi-1.5-34B", {"qkv_proj": (9216, 7168), "o_proj": (7168, 7168),
                                 "gate_up_proj": (40960, 7168), "down_proj": (7168, 20480)}),
    "llama3_1_405b_tp8": ("Llama-3.1-405B (TP=8)", {"qkv_proj": (2304, 16384), "o_proj": (16384, 2048),
                                                    "gate_up_proj": (13312, 16384), "down_proj": (16384, 6656)}),
    "mistral_small_24b": ("Mistral-Small-24B", {"qkv_proj": (6144, 5120), "o_proj": (5120, 4096),
                                                "gate_up_proj": (65536, 5120), "down_proj": (5120, 32768)}),
    "qwen2_5_32b": ("Qwen2.5-32B", {"qkv_proj": (7168, 5120), "o_proj": (5120, 5120),
                                    "gate_up_proj": (55296, 5120), "down_proj": (5120, 27648)}),
    "qwen2_5_72b_tp4": ("Qwen2.5-72B (TP=4)", {"qkv_proj": (2560, 8192), "o_proj": (8192, 2048),
                                               "gate_up_proj": (14784, 8192), "down_proj": (8192, 7392)}),
    "gemma3_12b": ("Gemma-3-12B", {"qkv_proj": (8192, 3840), "o_proj": (3840, 4096),
                                   "gate_up_proj": (30720, 3840), "down_proj": (3840, 15360)}),
    "gemma3_27b": ("Gemma-3-27B", {"qkv_proj": (8192, 5376), "o_proj": (5376, 4096),
                                   "gate_up_proj": (43008, 5376), "down_proj": (5376, 21504)}),
    "internlm2_5_20b": ("InternLM2.5-20B", {"qkv_proj": (8192, 6144), "o_proj": (6144, 6144),
                                           "gate_up_proj": (32768, 6144), "down_proj": (6144, 16384)}),
}

GOOD = """\
model: Demo
shapes:
  - {name: qkv, n: 6144, k: 4096}
  - name: down
    n: 4096
    k: 14336
"""


# MoE expert layers: (model, n, k, experts, top_k) of each file's one layer (w13: gate and up)
EXPECTED_MOE = {"moe_mixtral_8x7b": ("Mixtral-8x7B (MoE)", 28672, 4096, 8, 2),
                "moe_qwen3_30b_a3b": ("Qwen3-30B-A3B (MoE)", 1536, 2048, 128, 8),
                "moe_deepseek_v2_lite": ("DeepSeek-V2-Lite (MoE)", 2816, 2048, 64, 6),
                # held out of the shipped tables (dispatch on layers nobody tuned)
                "moe_deepseek_v3": ("DeepSeek-V3 (MoE)", 4096, 7168, 256, 8),
                "moe_qwen3_235b_a22b": ("Qwen3-235B-A22B (MoE)", 3072, 4096, 128, 8),
                "moe_mixtral_8x22b": ("Mixtral-8x22B (MoE)", 32768, 6144, 8, 2),
                "moe_llama4_scout": ("Llama-4-Scout-17B-16E (MoE)", 16384, 5120, 16, 1)}


def test_shipped_files_are_exactly_the_expected_models():
    assert sorted(p.stem for p in SHAPES_DIR.glob("*.yaml")) == sorted([*EXPECTED, *EXPECTED_MOE])


@pytest.mark.parametrize("stem", sorted(EXPECTED_MOE))
def test_shipped_moe_file_names_its_experts(stem):
    model, n, k, experts, top_k = EXPECTED_MOE[stem]
    (shape,) = load_shapes(SHAPES_DIR / f"{stem}.yaml")
    assert (shape.model, shape.name, shape.n, shape.k, shape.experts, shape.top_k) == (
        model, "w13", n, k, experts, top_k)


@pytest.mark.parametrize("stem", sorted(EXPECTED))
def test_shipped_file_loads_with_expected_shapes(stem):
    model, layers = EXPECTED[stem]
    shapes = load_shapes(SHAPES_DIR / f"{stem}.yaml")
    assert {s.name: (s.n, s.k) for s in shapes} == layers
    assert len(shapes) == len(layers) == 4
    assert all(s.model == model for s in shapes)
    assert all(s.n % 16 == 0 and s.k % 16 == 0 for s in shapes)
    assert all(s.origin.startswith(f"{SHAPES_DIR / stem}.yaml:") for s in shapes)


def test_spot_checks_against_published_configs():
    def get(stem, name):
        return next((s.n, s.k) for s in load_shapes(SHAPES_DIR / f"{stem}.yaml") if s.name == name)
    assert get("llama3_8b", "qkv_proj") == ((32 + 2 * 8) * 128, 4096) == (6144, 4096)
    assert get("qwen2_5_7b", "gate_up_proj") == (2 * 18944, 3584) == (37888, 3584)
    assert get("qwen2_5_72b", "down_proj") == (8192, 29568)


def test_good_file_records_model_and_origin_lines(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text(GOOD)
    assert load_shapes(path) == [WeightShape("qkv", 6144, 4096, "Demo", f"{path}:3"),
                                 WeightShape("down", 4096, 14336, "Demo", f"{path}:4")]


# (replace this, with that) in GOOD -> (line, key, words in the message)
ERRORS = {
    "unknown top key": (("model: Demo\n", "model: Demo\narch: sm90a\n"), 2, "arch",
                        "model, shapes"),
    "unknown shape key": (("    k: 14336\n", "    k: 14336\n    m: 16\n"), 7, "m", "name, n, k"),
    "missing model": (("model: Demo\n", ""), 1, "model", "expected key 'model'"),
    "missing shape key": (("  - {name: qkv, n: 6144, k: 4096}", "  - {name: qkv, n: 6144}"),
                          3, "k", "expected key 'k'"),
    "n not int": (("n: 6144", "n: '6144'"), 3, "n", "positive integer, got '6144'"),
    "k bool": (("    k: 14336", "    k: true"), 6, "k", "positive integer, got True"),
    "n negative": (("    n: 4096", "    n: -4096"), 5, "n", "positive integer, got -4096"),
    "k float": (("k: 4096}", "k: 4096.0}"), 3, "k", "positive integer, got 4096.0"),
    "n unaligned": (("    n: 4096", "    n: 4104"), 5, "n", "multiple of 16"),
    "k unaligned": (("k: 4096}", "k: 4088}"), 3, "k", "multiple of 16"),
    "duplicate n, k": (("    n: 4096\n    k: 14336", "    n: 6144\n    k: 4096"), 4, "shapes",
                       "got 6144x4096 (down) again after line 3 (qkv)"),
}


@pytest.mark.parametrize("case", ERRORS)
def test_error_names_file_line_and_key(tmp_path, case):
    (old, new), line, key, words = ERRORS[case]
    assert GOOD.count(old) == 1
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace(old, new))
    with pytest.raises(ManifestError) as err:
        load_shapes(path)
    assert str(err.value).startswith(f"{path}:{line}: {key}: expected"), str(err.value)
    assert words in str(err.value)
    assert (err.value.line, err.value.key) == (line, key)


@pytest.mark.parametrize("shapes_text, words", [("shapes: []", "non-empty list"),
                                                ("shapes:", "non-empty list"),
                                                ("shapes: [4096]", "expected a mapping")])
def test_empty_or_malformed_shape_list(tmp_path, shapes_text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(f"model: Demo\n{shapes_text}\n")
    with pytest.raises(ManifestError, match=rf"^{re.escape(str(path))}:2: shapes: expected") as err:
        load_shapes(path)
    assert words in str(err.value)


def test_invalid_yaml_and_missing_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: Demo\nshapes: [\n")
    where = re.escape(str(path))
    with pytest.raises(ManifestError, match=rf"^{where}:\d+: yaml: expected valid YAML"):
        load_shapes(path)
    with pytest.raises(ManifestError, match="file: expected a readable file"):
        load_shapes(tmp_path / "absent.yaml")


def test_resolve_by_stem_and_by_path(tmp_path, monkeypatch):
    assert resolve_shapes_arg("llama3_8b") == SHAPES_DIR / "llama3_8b.yaml"
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD)
    assert resolve_shapes_arg(str(path)) == path
    monkeypatch.chdir(tmp_path)
    assert resolve_shapes_arg("mine.yaml") == Path("mine.yaml")


def test_resolve_unknown_lists_available_stems():
    with pytest.raises(ManifestError) as err:
        resolve_shapes_arg("llama9_1t")
    assert "'llama9_1t'" in str(err.value)
    assert all(stem in str(err.value) for stem in EXPECTED)


def test_load_many_dedups_across_files_keeping_first(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text("model: Extra\nshapes:\n  - {name: o_proj, n: 4096, k: 4096}\n"
                    "  - {name: new, n: 512, k: 4096}\n")
    shapes = load_many(["llama3_8b", "mixtral_8x7b", str(path)])
    assert [(s.model, s.name) for s in shapes] == [
        ("Llama-3-8B", "qkv_proj"), ("Llama-3-8B", "o_proj"), ("Llama-3-8B", "gate_up_proj"),
        ("Llama-3-8B", "down_proj"), ("Extra", "new")]
    distinct = {shape for _, shapes in EXPECTED.values() for shape in shapes.values()}
    # Mistral-Small-24B shares 2 shapes with Mistral-Nemo-12B, Qwen2.5-32B 1 with Phi-3-medium
    assert len(load_many(sorted(EXPECTED))) == len(distinct) == 70


def test_default_m_grid_is_sorted_and_covers_powers_of_two():
    assert list(DEFAULT_M_GRID) == sorted(set(DEFAULT_M_GRID))
    assert {2 ** i for i in range(15)} <= set(DEFAULT_M_GRID)
    assert (DEFAULT_M_GRID[0], DEFAULT_M_GRID[-1]) == (1, 16384)


def test_parse_m_grid_sorts_and_dedups():
    assert parse_m_grid("64, 1,16,64 ,8") == (1, 8, 16, 64)
    assert parse_m_grid(",".join(map(str, DEFAULT_M_GRID))) == DEFAULT_M_GRID


@pytest.mark.parametrize("text, token", [("1,0,4", "'0'"), ("1,-2", "'-2'"), ("1,x", "'x'"),
                                         ("1,,2", "''"), ("1.5", "'1.5'"), ("", "''"),
                                         ("1-16384:pow2", "'1-16384:pow2'")])
def test_parse_m_grid_names_bad_token(text, token):
    with pytest.raises(ValueError, match=f"got {token}$"):
        parse_m_grid(text)
