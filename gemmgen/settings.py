"""The one place gemmgen reads its environment: where libraries are built and found.

GEMMGEN_BUILD_DIR  build directory (default: $XDG_CACHE_HOME/gemmgen, i.e. ~/.cache/gemmgen).

`using_build_dir(dir)` sets the build directory for a block of code (the CLI's `--build-dir` on
commands that read libraries, e.g. `gemmgen list`); it wins over the environment, an explicit
`build_dir(override)` wins over it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BUILD_DIR_VARIABLE = "GEMMGEN_BUILD_DIR"
DEFAULT_MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"

_scoped_build_dir: Path | None = None


def build_dir(override: str | os.PathLike | None = None) -> Path:
    """The build directory: `override`, else the one `using_build_dir` set, else
    $GEMMGEN_BUILD_DIR, else ~/.cache/gemmgen."""
    if override:
        return Path(override).expanduser().resolve()
    if _scoped_build_dir is not None:
        return _scoped_build_dir
    if os.environ.get(BUILD_DIR_VARIABLE):
        return Path(os.environ[BUILD_DIR_VARIABLE]).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return (Path(cache) / "gemmgen").resolve()


@contextmanager
def using_build_dir(directory: str | os.PathLike | None) -> Iterator[Path]:
    """Within the block, `build_dir()` is `directory` (None or "": no change). Process-wide, for
    a command's duration; callers reload what they loaded from the previous directory."""
    global _scoped_build_dir
    previous = _scoped_build_dir
    if directory:
        _scoped_build_dir = Path(directory).expanduser().resolve()
    try:
        yield build_dir()
    finally:
        _scoped_build_dir = previous


def default_manifests() -> list[Path]:
    """The manifests `gemmgen build` builds when given none (tuned tables beside them are not)."""
    return sorted(p for p in DEFAULT_MANIFEST_DIR.glob("*.yaml")
                  if not p.name.endswith(".tuned.yaml") and ".tuned." not in p.name)
