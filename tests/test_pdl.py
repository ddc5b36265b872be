"""Programmatic dependent launch (CPU side): the flag the ops pass is the one the C header
defines, in the struct field the header names, and the switch works."""

from __future__ import annotations

import re
from pathlib import Path

from gemmgen.bindings import launch
from gemmgen.families.moe import abi as moe_abi
from gemmgen.families.w8a8 import abi, ops

HEADER = Path(ops.__file__).resolve().parent / "include" / "gemmgen" / "w8a8" / "scaled_mm_args.h"
C_API = Path(ops.__file__).resolve().parents[2] / "templates" / "include" / "gemmgen" / "c_api.h"
MOE_HEADER = Path(ops.__file__).resolve().parents[1] / "moe" / "include" / "gemmgen" / "moe" / "moe_args.h"


def test_the_flag_and_its_field_match_the_header():
    define = re.search(r"#define GEMMGEN_LAUNCH_PDL (\d+)", C_API.read_text())
    assert int(define.group(1)) == launch.LAUNCH_PDL
    for header, struct, mirror in ((HEADER, "gemmgen_scaled_mm_args", abi.ScaledMmArgs),
                                   (MOE_HEADER, "gemmgen_moe_args", moe_abi.MoeArgs)):
        body = header.read_text().split(f"typedef struct {struct}")[1].split("}")[0]
        c_fields = re.findall(r"^\s+\S.*?(\w+);", body, flags=re.M)
        assert c_fields[-1] == "launch_flags" == mirror._fields_[-1][0]


def test_the_switch():
    before = launch.programmatic_dependent_launch()
    try:
        launch.set_programmatic_dependent_launch(False)
        assert launch.programmatic_dependent_launch() is False
        launch.set_programmatic_dependent_launch(True)
        assert launch.programmatic_dependent_launch() is True
    finally:
        launch.set_programmatic_dependent_launch(before)
