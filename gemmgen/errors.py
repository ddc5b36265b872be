"""Exception types gemmgen raises: each one says what is wrong, where, and what was expected."""

from __future__ import annotations


class GemmgenError(Exception):
    """Base class of gemmgen's own errors."""


class ManifestError(GemmgenError, ValueError):
    """A manifest that cannot be built; names file, line and key before anything compiles."""

    def __init__(self, file: str, line: int | None, key: str, message: str):
        self.file = str(file)
        self.line = line
        self.key = key
        self.detail = message
        where = f"{self.file}:{line}" if line else self.file
        super().__init__(f"{where}: {key}: {message}")


class BuildError(GemmgenError, RuntimeError):
    """The compile or link of a kernel library failed; the previous library stays published."""


class LibraryNotBuiltError(GemmgenError, RuntimeError):
    """No kernel library has been built yet, or it does not match its bindings."""


class KernelLaunchError(GemmgenError, RuntimeError):
    """A kernel refused the problem or failed to launch; carries CUTLASS's or CUDA's reason."""
