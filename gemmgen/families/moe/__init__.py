"""The MoE op family, `grouped_matmul_swiglu_quant` (like Ascend's
aclnnGroupedMatmulSwigluQuantV2): the first half of a quantized MoE expert layer. Token rows
grouped by expert, one GEMM per expert (A8W8 int8 or fp8 e4m3, or A8W4: int4 weights with int8
activations; per-token x_scale, per-channel or (A8W4) per-group weight scales), SwiGLU, and dynamic
per-token quantization of the result; sm90a (CUTLASS 3.x pointer-array grouped GEMM, and the
family's own mma.sync "direct" kernel for few tokens per expert, and its own int8-wgmma "wgmma"
kernel for A8W4 beyond; per-group scales on those two).

Files: `configs.py` (configs, spec, naming), `schema.py` (manifest keys and legality rules),
`grouping.py` (group lists: offsets and checks), `packing.py` (the packed weight layout),
`templates/` + `include/` (sources: group setup on the device, the CUTLASS grouped GEMM, the direct
and wgmma kernels, SwiGLU + quant),
`abi.py` (argument struct), `ops.py` (argument checks, torch op), `tuning.py` (how the tuner
builds and times a point).

Dispatch class: (op, x, w, scales). Dispatch variables: `tokens_per_expert` (ceil(M / E), the mean rows per expert: the per-expert
counts live on the device and are never read by the host), `experts` (E), `n`, `k`, `rows` (M,
tokens × top-k, rounded up to the tuner's row grid: `rows_key`). A tuned table (`gemmgen tune`
on the shapes of manifests/shapes/moe_*.yaml) lists an expert layer's (n, k) with buckets over
rows, measured at that layer's experts and top-k: for one layer, rows tell a decode step
(top-k rows in top-k experts) from a batch with the same tokens per expert (Qwen3: 1 token and
16 tokens both have one row an expert, in 8 and in ~80 experts); it serves listed layers only
(another model's layer goes to the rules, not to the nearest listed one).
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

from ...family import ArgsAbi, OpFamily, Variant
from ...generator.kernel_config import ConfigEntry, Origin
from ...tuning.shapes import MOE_M_GRID
from . import schema
from .abi import MoeArgs
from .configs import ELEMENTS, MoeSpec

_HERE = Path(__file__).resolve().parent
_INT32_MAX = 2**31 - 1


def rows_key(m: int) -> int:
    """The `rows` dispatch variable of M rows: M rounded up to the next point of the family's rows
    grid (gemmgen.tuning.shapes.MOE_M_GRID; past its last point, to a multiple of it, at most
    2^31 - 1, the largest value a dispatch variable takes). A table tuned on points of that grid
    (all of them, a tune's default, or those a tune's --m names) buckets at its points, so the
    rounding never moves a problem to another bucket; and a process that sees every prefill
    length memoizes a few dozen decisions an expert layer, not one per length."""
    if m > MOE_M_GRID[-1]:
        return min(-(-m // MOE_M_GRID[-1]) * MOE_M_GRID[-1], _INT32_MAX)
    return MOE_M_GRID[bisect.bisect_left(MOE_M_GRID, m)]


class MoeFamily(OpFamily):
    name = "moe"
    ops = ("grouped_matmul_swiglu_quant",)
    api_ops = ("grouped_matmul_swiglu_quant",)
    arches = ("sm90a",)
    variables = ("tokens_per_expert", "experts", "n", "k", "rows")
    spec_type = MoeSpec
    family_keys = schema.FAMILY_KEYS
    required_family_keys = schema.REQUIRED_FAMILY_KEYS
    variants_key = "dtypes"
    configs_need_variants = False
    template_dir = _HERE / "templates"
    include_dir = _HERE / "include"
    args = ArgsAbi("gemmgen_moe_args", "gemmgen/moe/moe_args.h", MoeArgs)
    ops_module = "gemmgen.families.moe.ops"
    public_api = ("grouped_matmul_swiglu_quant", "pack_moe_weights", "MoeWeight")
    table_nearest_shape = False
    table_proxy_fields = None  # an int8 table says nothing of fp8 or A8W4 kernels
    table_m_name = "rows"
    table_m = ("rows M (tokens x top-k), measured at each layer's experts and top-k "
               "(manifests/shapes/moe_*.yaml)")

    @property
    def tuner(self):
        from . import tuning  # imports torch: only when a tune runs
        return tuning

    def table_point(self, values: tuple[int, ...]) -> tuple[int, int, int]:
        """(rows, n, k): a table's m is the rows M of x."""
        _tokens_per_expert, _experts, n, k, rows = values
        return rows, n, k

    # manifest
    def read_variants(self, reader, family_node, arch: str) -> tuple[Variant, ...]:
        return tuple((("x", x), ("w", w), ("scales", scales))
                     for x, w, scales in schema.read_variants(reader, family_node))

    def config_keys(self, arch: str) -> frozenset[str]:
        return schema.CONFIG_KEYS

    def read_config(self, reader, node, index: int, arch: str, variants, line: int) -> ConfigEntry:
        plain = None if variants is None else tuple(tuple(v for _, v in var) for var in variants)
        return schema.read_config(reader, node, index, line, plain)

    def config_fields(self, entry: ConfigEntry) -> dict[str, Any]:
        return schema.config_fields(entry)

    def duplicate_config_note(self, arch: str) -> str:
        return " (raster and swizzle are run-time knobs and do not make a new kernel)"

    # kernels and sources
    def make_spec(self, *, library: str, arch: str, op: str, variant: Variant,
                  entry: ConfigEntry, origin: Origin) -> MoeSpec:
        return MoeSpec(library=library, arch=arch, op=op, config=entry.config, knobs=entry.knobs,
                       origin=origin, **dict(variant))

    def kernel_template(self, arch: str) -> str:
        return "sm90_grouped_swiglu_quant.cu.j2"  # CUTLASS, direct and wgmma kernels alike

    def template_context(self, arch: str) -> dict[str, Any]:
        from .cpp import Cpp
        return {"cpp": Cpp()}

    # dispatch and ops
    def dispatch_request(self, op: str, *, x_dtype, m: int, experts: int, n: int, k: int,
                         weight_bits: int = 8, per_group: bool = False):
        from ...dtypes import dtype_name
        for label, value in (("m", m), ("experts", experts), ("n", n), ("k", k)):
            low = 0 if label == "m" else 1
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _INT32_MAX:
                raise ValueError(f"{label} must be an int in [{low}, 2^31 - 1], got {value!r}")
        x = dtype_name(x_dtype)
        if x not in ELEMENTS:
            raise ValueError("x_dtype must be torch.int8 or torch.float8_e4m3fn for "
                             f"grouped_matmul_swiglu_quant; got {x_dtype!r}")
        if type(weight_bits) is not int or weight_bits not in (8, 4):
            raise ValueError(f"weight_bits must be 8 or 4, got {weight_bits!r}")
        if weight_bits == 4 and x != "int8":
            raise ValueError("weight_bits=4 (A8W4) takes int8 activations (x_dtype torch.int8); "
                             f"got {x_dtype!r}")
        if per_group and weight_bits != 4:
            raise ValueError("per-group weight scales are A8W4's only (weight_bits=4)")
        tokens_per_expert = max(1, -(-m // experts))
        return ((op, x, "int4" if weight_bits == 4 else x, "group" if per_group else "channel"),
                (tokens_per_expert, experts, n, k, rows_key(m)))

    def describe_class(self, key) -> str:
        op, x, w, scales = key
        return f"{op} {x} x {w} ({scales} scales) -> {x} q"

    def call_kernel(self, kernel, *args, **kwargs):
        return self.load_ops().grouped_matmul_swiglu_quant(*args, kernel=kernel.name, **kwargs)


FAMILY = MoeFamily()
