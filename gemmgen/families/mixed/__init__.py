"""The mixed-input GEMM op family (weight-only quantization): int4 / int8 weights × bf16 / fp16
activations, per-channel or group-wise scales with or without zero points (GPTQ, AWQ), the
weights pre-packed once (`gemmgen.pack_weights`). sm90a: CUTLASS 3.x mixed-input mainloops, and
the family's own "direct" mma.sync kernel for few tokens; sm80: the direct kernel.

Files: `configs.py` (configs, spec, naming), `schema.py` (manifest keys and legality rules),
`packing.py` (the packed layout: packer and unpacker), `checkpoints.py` (GPTQ / AWQ import),
`templates/` + `include/` (sources), `abi.py` (argument struct), `ops.py` (argument checks,
torch op), `tuning.py` (how the tuner builds and times a problem).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...family import ArgsAbi, OpFamily, Variant
from ...generator.kernel_config import ConfigEntry, Origin
from . import schema
from .abi import MixedMmArgs
from .configs import (ACTIVATION_DTYPES, G32_GROUP, KERNEL_FOR_WEIGHT_TYPE, MixedMmSpec,
                      group_size_fits, kernel_class)

_HERE = Path(__file__).resolve().parent


class MixedFamily(OpFamily):
    name = "mixed"
    ops = ("mixed_mm",)
    api_ops = ("mixed_mm",)
    arches = ("sm90a", "sm80")
    variables = ("m", "n", "k")
    spec_type = MixedMmSpec
    family_keys = schema.FAMILY_KEYS
    required_family_keys = schema.REQUIRED_FAMILY_KEYS
    variants_key = "dtypes"
    template_dir = _HERE / "templates"
    include_dir = _HERE / "include"
    args = ArgsAbi("gemmgen_mixed_mm_args", "gemmgen/mixed/mixed_mm_args.h", MixedMmArgs)
    ops_module = "gemmgen.families.mixed.ops"
    public_api = ("mixed_mm", "pack_weights", "unpack_weights", "PackedWeight")
    # A shape the table does not list goes to the manifest's rules, not to the nearest listed
    # shape's winner: the kernels' fit turns on feature tiles per SM and K chunks per split, which
    # a nearby shape need not share (Qwen2.5-7B's 4608 x 3584 took 4096 x 4096's picks: 0.75-0.84x
    # the rules' speed at 16-64 tokens on the H100 and the H200, session 19). Tables list every
    # model of manifests/shapes/; other shapes get the rules or tuning at first use.
    table_nearest_shape = False
    # The tables are measured in bf16; fp16 takes the same configs' fp16 kernels at the same
    # shapes (the configs rank alike in fp16: session 18's forced sweeps, session 19's benchmark).
    table_proxy_fields = (0, 2, 3)  # op, weight, scheme

    @property
    def tuner(self):
        from . import tuning  # imports torch: only when a tune runs
        return tuning  # the module is the hooks object (classes, make_problem, time_candidate, ...)

    # manifest
    def read_variants(self, reader, family_node, arch: str) -> tuple[Variant, ...]:
        return tuple((("a", a), ("w", w), ("scheme", s))
                     for a, w, s in schema.read_variants(reader, family_node))

    def config_keys(self, arch: str) -> frozenset[str]:
        return schema.CONFIG_KEYS

    # When the family's variants have errors, the manifest reader still checks its configs,
    # passing variants=None: all but the shared-memory estimate, which needs the variants.
    configs_need_variants = False

    def read_config(self, reader, node, index: int, arch: str, variants, line: int) -> ConfigEntry:
        plain = None if variants is None else tuple(tuple(value for _, value in v) for v in variants)
        return schema.read_config(reader, node, index, plain, line, arch)

    def config_fields(self, entry: ConfigEntry) -> dict[str, Any]:
        return schema.config_fields(entry)

    def duplicate_config_note(self, arch: str) -> str:
        return " (raster and swizzle are run-time knobs and do not make a new kernel)"

    # kernels and sources
    def make_spec(self, *, library: str, arch: str, op: str, variant: Variant,
                  entry: ConfigEntry, origin: Origin) -> MixedMmSpec:
        return MixedMmSpec(library=library, arch=arch, op=op, config=entry.config,
                           knobs=entry.knobs, origin=origin, **dict(variant))

    def kernel_template(self, arch: str) -> str:
        return "sm80_mixed_mm.cu.j2" if arch == "sm80" else "sm90_mixed_mm.cu.j2"

    def template_context(self, arch: str) -> dict[str, Any]:
        from .cpp import Cpp
        return {"cpp": Cpp()}

    # dispatch and ops
    def dispatch_request(self, op: str, *, a_dtype, weight_type: str, m: int, n: int, k: int,
                         group_size: int | None = None):
        """`group_size`: the packed weight's (None: a multiple of 64 or per-channel); group 32
        has kernels of its own (the `_g32` schemes)."""
        from ...dtypes import dtype_name
        for label, value in (("m", m), ("n", n), ("k", k)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**31:
                raise ValueError(f"{label} must be an int in [1, 2**31 - 1], got {value!r}")
        a = dtype_name(a_dtype)
        if a not in ACTIVATION_DTYPES:
            raise ValueError(f"a_dtype must be one of torch.bfloat16, torch.float16 for mixed_mm; "
                             f"got {a_dtype!r}")
        if not isinstance(weight_type, str) or weight_type not in KERNEL_FOR_WEIGHT_TYPE:
            raise ValueError(f"weight_type must be one of {', '.join(KERNEL_FOR_WEIGHT_TYPE)}; "
                             f"got {weight_type!r}")
        if group_size is not None and (not isinstance(group_size, int) or isinstance(group_size, bool)
                                       or not group_size_fits(group_size, k)):
            raise ValueError(f"group_size must be None, {G32_GROUP}, a multiple of 64 dividing "
                             f"k={k}, or k (per-channel); got {group_size!r}")
        group = k if group_size is None else group_size
        return ("mixed_mm", a, *kernel_class(weight_type, group)), (m, n, k)

    def describe_class(self, key) -> str:
        op, a, w, scheme = key
        return f"{op} {a} x {w} ({scheme}) -> {a}"

    def call_kernel(self, kernel, *args, **kwargs):
        return self.load_ops().mixed_mm(*args, kernel=kernel.name, **kwargs)


FAMILY = MixedFamily()
