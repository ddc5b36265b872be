"""The op-family plug-in interface: all that the generic pipeline layers know about a family.

An op family (W8A8 scaled GEMM, mixed-input GEMM, grouped MoE GEMM, ...) is one folder under
`gemmgen/families/` whose `__init__.py` defines `FAMILY`, an `OpFamily` instance. The generic
layers — YAML reading with file:line errors, expansion, rendering, the ninja build and atomic
publish, library loading, dispatch rules and tuned tables, the tuner and the CLI — reach a family
only through this class, looked up by a manifest's `op` (`gemmgen.families.for_op`), by the op a
user calls (`for_api_op`) or by a kernel spec's `family` (`get`).

What a family supplies (see docs/adding-a-family.md for a walk-through):
  manifest   `ops`, `arches`, `family_keys`, `read_variants`, `config_keys`, `read_config`,
             `config_fields` (how a dispatch rule's `use` mapping names a config)
  kernels    `make_spec` → a `KernelSpec` subclass with its fields and its one naming function
  sources    `template_dir` / `kernel_template(arch)` (Jinja2), `include_dir` (C++ headers)
  C ABI      `args` (`ArgsAbi`): its argument struct's C typedef, header and ctypes mirror
  dispatch   `variables` (what rule conditions may test), `api_ops`, `dispatch_request`
  ops        `ops_module` (registers its torch ops on import) and `public_api`
  tuning     `tuner` (optional): how the tuner builds a problem, times a candidate, what knobs
"""

from __future__ import annotations

import ctypes
import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from .generator.kernel_config import ConfigEntry, KernelSpec, Origin

# A variant is one combination of a family's class fields (e.g. a, d, epilogue), as
# (field, value) pairs in `KernelSpec.class_fields` order.
Variant = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ArgsAbi:
    """A family's kernel argument struct: C typedef (in `header`) and its ctypes mirror.

    Every kernel entry point takes a pointer to it; each library exports `<typedef>_size()`
    once per family it holds, and the loader refuses a library whose size differs."""

    typedef: str
    header: str
    mirror: type[ctypes.Structure]

    @property
    def size_symbol(self) -> str:
        return f"{self.typedef}_size"


class OpFamily(ABC):
    """One op family. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]                  # folder and spec name, e.g. "w8a8"
    ops: ClassVar[tuple[str, ...]]       # the manifest `op` values it builds
    api_ops: ClassVar[tuple[str, ...]]   # the op names dispatch answers for (`dispatch.choose`)
    arches: ClassVar[tuple[str, ...]]    # the kernel arches it can build (see gemmgen/arch.py)
    variables: ClassVar[tuple[str, ...]] = ("m", "n", "k")  # dispatch-rule variables
    spec_type: ClassVar[type[KernelSpec]]     # its KernelSpec subclass (class fields, naming)
    family_keys: ClassVar[frozenset[str]]     # its keys of a manifest family entry
    required_family_keys: ClassVar[frozenset[str]] = frozenset()
    # Whether `read_config` needs the variants: when False, a family entry whose variants have
    # an error still gets its configs checked (read_config then receives variants=None), so
    # `gemmgen validate` reports both mistakes at once.
    configs_need_variants: ClassVar[bool] = True
    variants_key: ClassVar[str]          # the manifest key errors about variants point at
    template_dir: ClassVar[Path]
    include_dir: ClassVar[Path]
    args: ClassVar[ArgsAbi]
    ops_module: ClassVar[str]            # imported on first use: registers the torch ops
    public_api: ClassVar[tuple[str, ...]] = ()  # names of ops_module exported as gemmgen.<name>
    # The tuner's hooks (usually the family's tuning module): classes(built, options),
    # make_problem(cls, m, n, k, seed=, shape=), time_candidate(candidate, problem),
    # knob_variants(kernel), knobs_worth_trying(kernel, m, n, sm_count), optionally
    # accepts_shape(shape) (default: shapes naming no experts), grid_for(shape, m_grid) (the M
    # measured on a shape), autotune_options(key) (tuning at first use; without it, none),
    # knobs_always_tried(kernel, m, n, sm_count) (knob settings timed even when
    # the kernel's first pass is not among the fastest), retime_window(m) (how far from the
    # fastest, a fraction, first-pass times are re-timed side by side) and MEASURE_METHOD (a name
    # for how make_problem / time_candidate measure, put in the store's file name so that a store
    # measured another way is not resumed), M_GRID (a tune's M grid when --m is not given; else
    # the generic one) and check_m_grid(m_grid) (a message refusing a grid whose points the
    # family's dispatch would not look up, or None); None: not tunable. `shape` is the
    # WeightShape being tuned (its model facts, e.g. an MoE layer's experts and top-k).
    tuner: ClassVar[Any] = None
    # The cost model's feature set (gemmgen/tuning/cost_model.py) and its version name, stored
    # with a tuned table's fitted coefficients: `cost_features(spec, m, n, k, sm_count)` -> the
    # features of one problem for one kernel. None: tables of this family hold no cost model and
    # an untuned shape takes the nearest measured shape's winner.
    cost_feature_set: ClassVar[str | None] = None

    def cost_features(self, spec: KernelSpec, m: int, n: int, k: int, sm_count: int) -> list[float]:
        raise NotImplementedError(f"op family {self.name!r} has no cost model")

    # Tuned tables are keyed by a weight shape (n, k) and bucketed over m. `table_point` maps a
    # problem's dispatch-variable values to those coordinates, None when the family's problems
    # have none (then it has no tables). `table_nearest_shape`: whether a shape the table does
    # not list takes the nearest listed shape's winner (else the manifest's rules serve it).
    table_nearest_shape: ClassVar[bool] = True
    # `table_proxy_fields`: which fields of a dispatch class key (op, *class fields) a measured
    # class must share to stand in for a class the table does not hold, whose kernel is then the
    # same config's sibling (default: op and the first field, e.g. W8A8's input dtype); None: no
    # stand-in (that class takes the rules).
    table_proxy_fields: ClassVar[tuple[int, ...] | None] = (0, 1)
    table_m: ClassVar[str] = "M"  # what a table's m counts, in words (for its header)
    table_m_name: ClassVar[str] = "m"  # its dispatch variable (in dispatch's reasons)

    def table_point(self, values: tuple[int, ...]) -> tuple[int, int, int] | None:
        """(m, n, k) of a problem's dispatch values in a tuned table: the values themselves for
        variables (m, n, k, ...)."""
        return tuple(values[:3]) if self.variables[:3] == ("m", "n", "k") else None

    @property
    def has_tables(self) -> bool:
        """Whether the family's problems map into tuned tables (`table_point`)."""
        return self.table_point(tuple(range(1, len(self.variables) + 1))) is not None

    # ---------------------------------------------------------------- manifest
    @abstractmethod
    def read_variants(self, reader, family_node, arch: str) -> tuple[Variant, ...]:
        """The variants a manifest family entry declares (exclusions applied), in order."""

    @abstractmethod
    def config_keys(self, arch: str) -> frozenset[str]:
        """The keys a `configs` entry may have for `arch` (including `name`)."""

    @abstractmethod
    def read_config(self, reader, node, index: int, arch: str, variants: tuple[Variant, ...],
                    line: int) -> ConfigEntry:
        """One `configs` entry, validated against the arch's legality rules (file:line errors)."""

    @abstractmethod
    def config_fields(self, entry: ConfigEntry) -> dict[str, Any]:
        """A config as the manifest spells it, for matching a dispatch rule's `use` mapping."""

    def duplicate_config_note(self, arch: str) -> str:
        """Appended to the 'duplicate kernel' error (e.g. which keys are run-time knobs)."""
        return ""

    # ----------------------------------------------------------------- kernels
    @abstractmethod
    def make_spec(self, *, library: str, arch: str, op: str, variant: Variant,
                  entry: ConfigEntry, origin: Origin) -> KernelSpec:
        """The kernel of one variant × config."""

    # ----------------------------------------------------------------- sources
    @abstractmethod
    def kernel_template(self, arch: str) -> str:
        """Name of the kernel template in `template_dir`."""

    def template_context(self, arch: str) -> dict[str, Any]:
        """Extra names the kernel template uses (e.g. a C++ spelling helper)."""
        return {}

    # ------------------------------------------------------------ dispatch, ops
    def api_op(self, spec: KernelSpec) -> str:
        """The user-facing op a kernel serves (default: its manifest op)."""
        return spec.op

    @abstractmethod
    def dispatch_request(self, op: str, **problem) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(dispatch class key, variable values in `variables` order) of a user's problem
        description, e.g. `("scaled_mm", "int8", "bf16", "ScaledEpilogue"), (m, n, k)`;
        ValueError naming the bad argument otherwise. Name the problem's parameters (keyword
        parameters after `op`): dispatch.choose / explain check a description against them and
        name an unknown or missing one (a family taking `**problem` gets no unknown-name check)."""

    def describe_class(self, key: tuple[str, ...]) -> str:
        """A dispatch class in words, for messages."""
        return " ".join(key)

    def load_ops(self):
        """The family's ops module (imports torch and registers the torch ops once)."""
        return importlib.import_module(self.ops_module)

    def call_kernel(self, kernel, *args, **kwargs):
        """Run one built kernel through the family's public op (`Kernel.__call__`)."""
        raise NotImplementedError(f"op family {self.name!r} has no callable kernels")
