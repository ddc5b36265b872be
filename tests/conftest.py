"""Shared fixtures of the CPU test suite: manifests written to tmp_path, edited line by line.

`BASE_MANIFEST` is a small valid manifest in block style, so that every key sits on its own line
and a test can assert the exact line a `ManifestError` points at. `ManifestCase` edits it with
checked, unique replacements and finds the 1-based line of any (unique) snippet.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gemmgen.generator.expand import expand
from gemmgen.generator.manifest import Manifest, load_manifest

BASE_MANIFEST = """\
library: demo
arch: sm90a
kernels_per_file: 4
families:
  - name: int8
    op: scaled_mm
    dtypes:
      - a: int8
        b: int8
        acc: int32
        d: [bf16, fp16]
    epilogues: [ScaledEpilogue, ScaledEpilogueBias]
    configs:
      - name: small
        tile: [64, 64, 128]
        cluster: [1, 1, 1]
        schedule: warpspecialized
        swap_ab: true
      - name: large
        tile: [128, 128, 128]
        cluster: [2, 1, 1]
        schedule: pingpong
        stages: auto
    dispatch:
      - when: "m <= 64"
        use: small
      - when: "true"
        use: large
"""

# A second family that can be appended to BASE_MANIFEST as is (no overlap with `int8`).
FP8_FAMILY = """\
  - name: fp8
    op: scaled_mm
    dtypes:
      - a: e4m3
        d: bf16
    epilogues: [ScaledEpilogue]
    configs:
      - name: large
        tile: [128, 128, 128]
        cluster: [2, 1, 1]
        schedule: pingpong
    dispatch:
      - when: "true"
        use: large
"""


def line_of(text: str, needle: str) -> int:
    """1-based number of the one line of `text` that contains `needle` (asserts it is unique)."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits} of the test manifest, expected one"
    return hits[0]


def one_kernel_manifest(library: str = "one", *, a: str = "int8", d: str = "bf16",
                        epilogue: str = "ScaledEpilogueBias", tile=(128, 128, 128),
                        cluster=(2, 1, 1), schedule: str = "pingpong") -> str:
    """Text of a valid manifest that expands to exactly one kernel."""
    def triple(values) -> str:
        return "[" + ", ".join(str(v) for v in values) + "]"

    return (f"library: {library}\n"
            "arch: sm90a\n"
            "families:\n"
            f"  - name: {a.replace('e4m3', 'fp8')}\n"
            "    op: scaled_mm\n"
            f"    dtypes: [{{a: {a}, d: {d}}}]\n"
            f"    epilogues: [{epilogue}]\n"
            "    configs:\n"
            f"      - {{name: only, tile: {triple(tile)}, cluster: {triple(cluster)}, "
            f"schedule: {schedule}}}\n"
            "    dispatch:\n"
            "      - {when: \"true\", use: only}\n")


class ManifestCase:
    """A manifest text under edit, written into a test's tmp_path on demand."""

    def __init__(self, directory: Path, text: str = BASE_MANIFEST, name: str = "manifest.yaml"):
        self.directory = directory
        self.text = text
        self.path = directory / name

    def replace(self, old: str, new: str) -> "ManifestCase":
        count = self.text.count(old)
        assert count == 1, f"{old!r} occurs {count} times in the test manifest, expected once"
        self.text = self.text.replace(old, new)
        return self

    def append(self, block: str) -> "ManifestCase":
        self.text += block
        return self

    def line(self, needle: str) -> int:
        return line_of(self.text, needle)

    def write(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.text)
        return self.path

    def load(self) -> Manifest:
        return load_manifest(self.write())

    def expand(self):
        return expand(self.load())


@pytest.fixture
def write_manifest(tmp_path: Path):
    """`write_manifest(text, name="manifest.yaml")` writes YAML text into tmp_path; returns its path."""
    def write(text: str, name: str = "manifest.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path
    return write


@pytest.fixture
def case(tmp_path: Path) -> ManifestCase:
    """A fresh copy of BASE_MANIFEST to edit, written to tmp_path/manifest.yaml."""
    return ManifestCase(tmp_path)


@pytest.fixture(scope="session")
def minimal_manifest():
    """The builder of one-kernel manifest texts (see `one_kernel_manifest`)."""
    return one_kernel_manifest


@pytest.fixture
def fp8_family() -> str:
    """A second family block (a: e4m3) to append to BASE_MANIFEST."""
    return FP8_FAMILY


@pytest.fixture
def default_manifest() -> Path:
    """The shipped default manifest (w8a8_sm90.yaml)."""
    from gemmgen import settings
    paths = [p for p in settings.default_manifests() if p.name == "w8a8_sm90.yaml"]
    assert paths, f"w8a8_sm90.yaml not among {settings.default_manifests()}"
    return paths[0]
