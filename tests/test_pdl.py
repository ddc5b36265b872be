"""Programmatic dependent launch (CPU side): the flag the ops pass is the one the C header
defines, in the struct field the header names, and the switch works."""

from __future__ import annotations

import re
from pathlib import Path

from gemmgen.bindings import launch
from gemmgen.families.w8a8 import abi, ops

HEADER = Path(ops.__file__).resolve().parent / "include" / "gemmgen" / "w8a8" / "scaled_mm_args.h"


def test_the_flag_and_its_field_match_the_header():
    text = HEADER.read_text()
    assert int(re.search(r"#define GEMMGEN_LAUNCH_PDL (\d+)", text).group(1)) == ops._LAUNCH_PDL
    c_fields = re.findall(r"^\s+\S.*?(\w+);", text.split("typedef struct gemmgen_scaled_mm_args")[1]
                          .split("}")[0], flags=re.M)
    assert c_fields[-1] == "launch_flags" == abi.ScaledMmArgs._fields_[-1][0]


def test_the_switch():
    before = launch.programmatic_dependent_launch()
    try:
        launch.set_programmatic_dependent_launch(False)
        assert launch.programmatic_dependent_launch() is False
        launch.set_programmatic_dependent_launch(True)
        assert launch.programmatic_dependent_launch() is True
    finally:
        launch.set_programmatic_dependent_launch(before)
