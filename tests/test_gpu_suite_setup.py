"""The GPU suite's own setup (tests/gpu/conftest.py), on the CPU: its fixtures' bodies only run
on a GPU machine, so a broken one (session 26's `w8a8_dispatch_library` called a function the
package does not export) would otherwise surface only there. With nothing built, the tuner
fixtures' helper must skip with its reason, for each family that has a tuner."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gemmgen import settings


def _load_gpu_conftest():
    """tests/gpu/conftest.py by path (`import conftest` finds tests/conftest.py)."""
    spec = importlib.util.spec_from_file_location(
        "_gpu_suite_conftest", Path(__file__).with_name("gpu") / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("family, manifest", [("w8a8", "w8a8_sm90.yaml"), ("moe", "moe_sm90.yaml")])
def test_tuner_library_skips_with_its_reason_when_nothing_is_built(family, manifest, tmp_path,
                                                                    monkeypatch):
    import gemmgen
    monkeypatch.setenv(settings.BUILD_DIR_VARIABLE, str(tmp_path))
    gemmgen.reload()
    try:
        conftest = _load_gpu_conftest()
        with pytest.raises(pytest.skip.Exception, match=rf"no one {family} library for the tuner: "
                                                        rf".*gemmgen/manifests/{manifest}"):
            conftest._tuner_library(family, manifest)
    finally:
        monkeypatch.undo()
        gemmgen.reload()
