"""The smallest op family that plugs into gemmgen: `out = alpha * x + beta * out`, batched.

Test and documentation material (docs/adding-a-family.md), not shipped: it lives outside
`gemmgen/families/`, so it is not discovered; tests make it known with
`gemmgen.families.register(FAMILY)` and forget it with `unregister("demo_axpby")`.

It has everything a family supplies, and nothing of the W8A8 family:

    - name: axpy
      op: axpby                               # manifest op
      dtypes: [{x: fp16, out: [fp16, fp32]}]  # its variants: (x, out) pairs
      configs:
        - {name: narrow, block: 128, vector: 2}
        - {name: wide, block: 512, vector: 8}
      dispatch:                               # conditions over ITS variables: n and batch
        - {when: "batch <= 8", use: narrow}
        - {when: "true", use: wide}

Kernel name grammar: ``{arch}_{op}_{x}_{out}_b{block}_v{vector}``, e.g.
``sm90a_axpby_f16_f32_b128_v2``. The kernel template (templates/axpby.cu.j2) is valid-looking
CUDA but no test compiles it.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemmgen.family import ArgsAbi, OpFamily, Variant
from gemmgen.generator.kernel_config import ConfigEntry, KernelSpec, Origin, RuntimeKnobs

_HERE = Path(__file__).resolve().parent

DTYPES = ("fp16", "bf16", "fp32")
BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}
BLOCKS = (128, 256, 512, 1024)
VECTORS = (1, 2, 4, 8)
_SHORT = {"fp16": "f16", "bf16": "bf16", "fp32": "f32"}
_CPP = {"fp16": "__half", "bf16": "__nv_bfloat16", "fp32": "float"}
_DTYPE_KEYS = {"x", "out"}
_CONFIG_KEYS = frozenset({"name", "block", "vector"})
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


# ------------------------------------------------------------------ config and spec
@dataclass(frozen=True)
class AxpbyConfig:
    """Compile-time shape of one kernel: threads per block, elements per thread and load."""

    block: int
    vector: int

    @property
    def terse(self) -> str:
        return f"b{self.block}_v{self.vector}"


@dataclass(frozen=True, kw_only=True)
class AxpbySpec(KernelSpec):
    """One axpby kernel: x dtype, out dtype, config."""

    family = "demo_axpby"
    class_fields = ("x", "out")

    x: str
    out: str

    @property
    def name(self) -> str:
        return kernel_name(self)


def kernel_name(spec: AxpbySpec) -> str:
    """``{arch}_{op}_{x}_{out}_{config}``, e.g. ``sm90a_axpby_f16_f32_b128_v2``."""
    return "_".join([spec.arch, spec.op, _SHORT[spec.x], _SHORT[spec.out], spec.config.terse])


# ----------------------------------------------------------------------- C ABI
class AxpbyArgs(ctypes.Structure):
    """Mirror of `gemmgen_demo_axpby_args` (include/gemmgen/demo_axpby/axpby_args.h)."""

    _fields_ = [
        ("x", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("n", ctypes.c_int64), ("batch", ctypes.c_int64),
        ("ldx", ctypes.c_int64), ("ldout", ctypes.c_int64),
        ("alpha", ctypes.c_float), ("beta", ctypes.c_float),
    ]


# -------------------------------------------------------------------- manifest
def _read_variants(reader, fam) -> tuple[Variant, ...]:
    variants: list[Variant] = []
    dtypes = reader.sequence(fam, "dtypes")
    for i, entry in enumerate(dtypes):
        d = reader.mapping(entry, f"dtypes[{i}]", _DTYPE_KEYS, _DTYPE_KEYS, line=dtypes.line_of(i))
        x = reader.choice(d, "x", DTYPES)
        for out in reader.sequence(d, "out", allow_scalar=True):
            if out not in DTYPES:
                raise reader.error(d, "out", f"unknown output dtype {out!r}; expected one of "
                                             f"{', '.join(DTYPES)}")
            if BYTES[out] < BYTES[x]:
                raise reader.error(d, "out", f"axpby accumulates into out; {out} is narrower "
                                             f"than x ({x})")
            variant = (("x", x), ("out", out))
            if variant in variants:
                raise reader.error(d, "out", f"the pair x={x}, out={out} is listed twice")
            variants.append(variant)
    return tuple(variants)


def _read_config(reader, node, index: int, variants, line: int) -> ConfigEntry:
    c = reader.mapping(node, f"configs[{index}]", _CONFIG_KEYS, ("block", "vector"), line=line)
    name = c.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME_RE.match(name)):
        raise reader.error(c, "name", f"expected a lowercase identifier, got {name!r}")
    config = AxpbyConfig(block=reader.choice(c, "block", BLOCKS),
                         vector=reader.choice(c, "vector", VECTORS))
    widest = max(BYTES[value] for variant in variants for _, value in variant)
    if config.vector * widest > 16:  # the arch's legality rule: one load is at most 16 bytes
        raise reader.error(c, "vector", f"vector {config.vector} x {widest}-byte elements is "
                                        f"{config.vector * widest} bytes; one load moves at most 16")
    return ConfigEntry(name, config, RuntimeKnobs(), line)


# ---------------------------------------------------------------------- family
class DemoAxpbyFamily(OpFamily):
    name = "demo_axpby"
    ops = ("axpby",)
    api_ops = ("axpby",)
    arches = ("sm90a", "sm80")
    variables = ("n", "batch")
    spec_type = AxpbySpec
    family_keys = frozenset({"dtypes"})
    required_family_keys = frozenset({"dtypes"})
    variants_key = "dtypes"
    template_dir = _HERE / "templates"
    include_dir = _HERE / "include"
    args = ArgsAbi("gemmgen_demo_axpby_args", "gemmgen/demo_axpby/axpby_args.h", AxpbyArgs)
    ops_module = "family_demo"  # no torch op: this module stands in for it
    public_api = ()

    def read_variants(self, reader, family_node, arch: str) -> tuple[Variant, ...]:
        return _read_variants(reader, family_node)

    def config_keys(self, arch: str) -> frozenset[str]:
        return _CONFIG_KEYS

    def read_config(self, reader, node, index: int, arch: str, variants, line: int) -> ConfigEntry:
        return _read_config(reader, node, index, variants, line)

    def config_fields(self, entry: ConfigEntry) -> dict[str, Any]:
        return {"block": entry.config.block, "vector": entry.config.vector}

    def make_spec(self, *, library: str, arch: str, op: str, variant: Variant,
                  entry: ConfigEntry, origin: Origin) -> AxpbySpec:
        return AxpbySpec(library=library, arch=arch, op=op, config=entry.config,
                         knobs=entry.knobs, origin=origin, **dict(variant))

    def kernel_template(self, arch: str) -> str:
        return "axpby.cu.j2"

    def template_context(self, arch: str) -> dict[str, Any]:
        return {"element": _CPP.__getitem__}

    def dispatch_request(self, op: str, *, x_dtype: str, out_dtype: str, n: int, batch: int):
        for label, value in (("n", n), ("batch", batch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{label} must be a positive int, got {value!r}")
        for label, value in (("x_dtype", x_dtype), ("out_dtype", out_dtype)):
            if value not in DTYPES:
                raise ValueError(f"{label} must be one of {', '.join(DTYPES)}, got {value!r}")
        return ("axpby", x_dtype, out_dtype), (n, batch)

    def describe_class(self, key) -> str:
        op, x, out = key
        return f"{op} {x}->{out}"


FAMILY = DemoAxpbyFamily()
