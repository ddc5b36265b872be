"""benchmarks/bench_moe.py's --rules-from (an A/B of dispatch rules in one run), on the CPU: the
option's check, the kernel another manifest's rules pick, and the summary of the rows it moves;
and the checks of its other A/B options (--show-kernels, --json)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("bench_moe", ROOT / "benchmarks" / "bench_moe.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("bench_moe", bench)  # its dataclasses look their module up
_SPEC.loader.exec_module(bench)

SHIPPED = ROOT / "gemmgen" / "manifests" / "moe_sm90.yaml"


def test_rules_from_must_name_a_manifest(tmp_path, capsys):
    assert bench.parse_args(["--rules-from", str(SHIPPED)]).rules_from == SHIPPED
    with pytest.raises(SystemExit):
        bench.parse_args(["--rules-from", str(tmp_path / "missing.yaml")])
    assert "--rules-from: no manifest at" in capsys.readouterr().err


def test_show_kernels_refuses_no_best(capsys):
    # --no-best skips the forced kernels that --show-kernels prints: together they printed nothing
    assert bench.parse_args(["--show-kernels"]).show_kernels
    with pytest.raises(SystemExit):
        bench.parse_args(["--show-kernels", "--no-best"])
    assert "--show-kernels prints the forced kernels' times, which --no-best skips" in capsys.readouterr().err


def test_json_takes_a_path():
    # the rows for benchmarks/compare_moe_runs.py (an A/B of two libraries)
    assert bench.parse_args(["--json", "run.json"]).json == Path("run.json")


def test_another_manifests_rules_name_a_kernel_of_the_same_configs(tmp_path):
    # the per-group rule at 9-32 tokens an expert pointed back at the 6-stage ring: the other
    # manifest picks the other config's kernel, by the name the built library gives it
    edited = tmp_path / "moe_sm90.yaml"
    text = SHIPPED.read_text()
    old = '{when: "tokens_per_expert <= 32", use: wgmma32_s8_fused}'
    assert text.count(old) == 1
    edited.write_text(text.replace(old, '{when: "tokens_per_expert <= 32", use: wgmma32}'))
    problem = dict(x_dtype=torch.int8, m=2048, experts=128, n=1536, k=2048, weight_bits=4, per_group=True)
    names = [bench.gemmgen.dispatch.choose(bench.OP, tuned=False, source="manifests", manifests=[path],
                                           **problem).kernel.name for path in (SHIPPED, edited)]
    assert names[0].endswith("_i8w4g_f32_t128x32x128_wgmma_s8_fused")
    assert names[1].endswith("_i8w4g_f32_t128x32x128_wgmma_s6")


def test_the_summary_counts_only_the_rows_the_other_rules_move():
    rows = [{"rules_kernel": "a", "rules_from_kernel": "a", "rules": 10.0, "rules_from": 10.0},
            {"rules_kernel": "a", "rules_from_kernel": "b", "rules": 12.0, "rules_from": 10.0},
            {"rules_kernel": "a", "rules_from_kernel": "c", "rules": 9.0, "rules_from": 10.0},
            {"rules_kernel": "a", "rules_from_kernel": "d", "rules": None, "rules_from": 10.0}]
    assert bench.rules_from_moved(rows) == (f"geomean {math.sqrt(1.2 * 0.9):.3f} over 2 rows "
                                            "(< 1: the library's rules faster)")
    assert bench.rules_from_moved(rows[:1]) == "no row"
