"""The generic kernel vocabulary every op family shares: where a kernel was declared (`Origin`),
a kernel to build (`KernelSpec`, subclassed by each family with its own fields and name grammar),
one manifest config entry (`ConfigEntry`) and the run-time scheduler knobs (`RuntimeKnobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

# Run-time scheduler settings CUTLASS takes per call (they never multiply the binaries).
RASTER_ORDERS = ("heuristic", "along_m", "along_n")
SWIZZLES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Origin:
    """Where a kernel was declared: manifest file, line of its config, family and config label.

    `label` (without the line) heads generated sources, so moving a config within the manifest
    does not change the sources and trigger a rebuild.
    """

    file: str
    line: int
    family: str
    config: str

    @property
    def label(self) -> str:
        return f"{self.file}, family {self.family!r}, config {self.config!r}"

    def __str__(self) -> str:
        return f"{self.file}:{self.line} (family {self.family!r}, config {self.config!r})"


@dataclass(frozen=True)
class RuntimeKnobs:
    """Scheduler settings passed at every call; the default ones of a config live here."""

    raster: str = "heuristic"
    swizzle: int = 1
    split_k_slices: int = 1  # default K slices of a kernel built with split-K


@dataclass(frozen=True)
class ConfigEntry:
    """One entry of a manifest family's `configs` list, as the family's reader parsed it."""

    name: str | None
    config: Any  # the family's frozen compile-time config (tile shapes, schedules, ...)
    knobs: RuntimeKnobs
    line: int


@dataclass(frozen=True, kw_only=True)
class KernelSpec:
    """One kernel to generate, compile and bind. Each op family subclasses it with the fields
    that shape its binaries (dtypes, epilogue, ...) and names them in `class_fields`; `name` is
    the family's one naming function."""

    family: ClassVar[str]              # the OpFamily.name that builds it
    class_fields: ClassVar[tuple[str, ...]]  # with `op`, the dispatch class of the kernel

    library: str
    arch: str
    op: str
    config: Any
    knobs: RuntimeKnobs = field(default_factory=RuntimeKnobs, compare=False)
    origin: Origin | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define `name`")

    @property
    def dispatch_class(self) -> tuple[str, ...]:
        """(op, *class fields): the problems one dispatch table of rules serves."""
        return (self.op, *(getattr(self, f) for f in self.class_fields))

    @property
    def split_k(self) -> bool:
        """Whether the kernel takes a run-time K slice count (`RuntimeKnobs.split_k_slices`)."""
        return False

    @property
    def unit_key(self) -> tuple:
        """Kernels with one key may share a translation unit (default: same tile config).

        NOTES: grouping by config (not by position in the sorted list) keeps incremental builds
        incremental: adding a config adds files without reshuffling the existing ones."""
        return (self.config.terse,)

    @property
    def unit_stem(self) -> str:
        """File stem of the translation unit holding this kernel."""
        return "_".join((self.arch, self.op, *map(str, self.unit_key)))
