"""The one place gemmgen reads its environment: where libraries are built and found.

GEMMGEN_BUILD_DIR  build directory (default: $XDG_CACHE_HOME/gemmgen, i.e. ~/.cache/gemmgen).
"""

from __future__ import annotations

import os
from pathlib import Path

BUILD_DIR_VARIABLE = "GEMMGEN_BUILD_DIR"
DEFAULT_MANIFEST_DIR = Path(__file__).resolve().parent / "manifests"


def build_dir(override: str | os.PathLike | None = None) -> Path:
    """The build directory: `override`, else $GEMMGEN_BUILD_DIR, else ~/.cache/gemmgen."""
    if override:
        return Path(override).expanduser().resolve()
    if os.environ.get(BUILD_DIR_VARIABLE):
        return Path(os.environ[BUILD_DIR_VARIABLE]).expanduser().resolve()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return (Path(cache) / "gemmgen").resolve()


def default_manifests() -> list[Path]:
    """The manifests `gemmgen build` builds when given none (tuned tables beside them are not)."""
    return sorted(p for p in DEFAULT_MANIFEST_DIR.glob("*.yaml") if not p.name.endswith(".tuned.yaml"))
