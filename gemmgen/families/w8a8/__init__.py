"""The W8A8 scaled GEMM op family: int8 / fp8 (e4m3) operands, bf16/fp16 output, the four vLLM
dequant epilogues; sm90a (CUTLASS 3.x) and sm80 (CUTLASS 2.x, split-K) kernels.

Files: `configs.py` (configs, spec, naming), `schema.py` (manifest keys), `sm90_rules.py` /
`sm80_rules.py` (legality), `templates/` + `include/` (sources), `abi.py` (argument struct),
`ops.py` (argument checks, torch op), `tuning.py` (how the tuner builds and times a problem).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...family import ArgsAbi, OpFamily, Variant
from ...generator.kernel_config import ConfigEntry, Origin
from . import schema
from .abi import ScaledMmArgs
from .configs import AZP_EPILOGUES, EPILOGUES, ScaledMmSpec, Sm80TileConfig, is_azp

_HERE = Path(__file__).resolve().parent
_TEMPLATES = {"sm90a": "sm90_scaled_mm.cu.j2", "sm80": "sm80_scaled_mm.cu.j2"}
_INT32_MAX = 2**31 - 1


class W8A8Family(OpFamily):
    name = "w8a8"
    ops = ("scaled_mm",)
    api_ops = ("scaled_mm", "scaled_mm_azp")
    arches = ("sm90a", "sm80")
    variables = ("m", "n", "k")
    spec_type = ScaledMmSpec
    family_keys = schema.FAMILY_KEYS
    required_family_keys = schema.REQUIRED_FAMILY_KEYS
    variants_key = "dtypes"
    template_dir = _HERE / "templates"
    include_dir = _HERE / "include"
    args = ArgsAbi("gemmgen_scaled_mm_args", "gemmgen/w8a8/scaled_mm_args.h", ScaledMmArgs)
    ops_module = "gemmgen.families.w8a8.ops"
    public_api = ("scaled_mm", "scaled_mm_azp")

    @property
    def tuner(self):
        from . import tuning  # imports torch: only when a tune runs
        return tuning  # the module is the hooks object (classes, make_problem, time_candidate, ...)

    # The cost model of tuned tables (gemmgen/tuning/cost_model.py): per kernel, the busiest SM's
    # share of the work and the bytes moved. Chosen by held-out shapes (benchmarks/RESULTS.md).
    cost_feature_set = "w8a8-tiles-2"

    def cost_features(self, spec, m: int, n: int, k: int, sm_count: int) -> list[float]:
        """[1, waves x K iterations, waves, input MB, output MB, K iterations, tiles x K
        iterations / SMs] of one problem for one kernel: a wave is one CTA tile per SM (swap-AB
        kernels tile Dᵀ; cluster shapes round the tile grid up), a K iteration one tile-K step.
        A stream-K kernel splits the tiles' K iterations evenly over the SMs: its waves are
        tiles / SMs, not rounded up (feature set 2; set 1 rounded them up as for the others,
        and the model then missed where stream-K wins: a narrow N x deep K at 1-2 partial
        waves, e.g. 2304 x 16384 at 1024 rows, 0.64-0.68 of the oracle on the H200). For a
        stream-K kernel the second and last features are then the same number; the
        non-negative fit keeps one of them (the shipped tables: the second)."""
        def ceil_div(a: int, b: int) -> int:
            return -(-a // b)

        config = spec.config
        tile_m, tile_n, tile_k = config.tile
        cluster_m, cluster_n = getattr(config, "cluster", (1, 1, 1))[:2]
        rows, cols = (n, m) if getattr(config, "swap_ab", False) else (m, n)
        tiles = (ceil_div(ceil_div(rows, tile_m), cluster_m) * cluster_m
                 * ceil_div(ceil_div(cols, tile_n), cluster_n) * cluster_n)
        streamk = getattr(config, "tile_scheduler", "") == "streamk"
        waves = tiles / sm_count if streamk else ceil_div(tiles, sm_count)
        k_iterations = ceil_div(k, tile_k)
        return [1.0, float(waves * k_iterations), float(waves), (n * k + m * k) / 1e6,
                m * n * 2 / 1e6, float(k_iterations), tiles * k_iterations / sm_count]

    # manifest
    def read_variants(self, reader, family_node, arch: str) -> tuple[Variant, ...]:
        return tuple((("a", a), ("d", d), ("epilogue", e))
                     for a, d, e in schema.read_combos(reader, family_node, arch))

    def config_keys(self, arch: str) -> frozenset[str]:
        return schema.CONFIG_KEYS[arch]

    # A config's checks do not depend on the family's variants (see schema.read_sm90_config /
    # read_sm80_config): when the variants have errors, the manifest reader still checks the
    # configs, passing variants=None.
    configs_need_variants = False

    def read_config(self, reader, node, index: int, arch: str, variants, line: int) -> ConfigEntry:
        combos = None if variants is None else [tuple(value for _, value in v) for v in variants]
        read = schema.read_sm80_config if arch == "sm80" else schema.read_sm90_config
        return read(reader, node, index, combos, line)

    def config_fields(self, entry: ConfigEntry) -> dict[str, Any]:
        return schema.config_fields(entry)

    def duplicate_config_note(self, arch: str) -> str:
        return "" if arch == "sm80" else (" (raster and swizzle are run-time knobs and do not "
                                          "make a new kernel)")

    # kernels and sources
    def make_spec(self, *, library: str, arch: str, op: str, variant: Variant,
                  entry: ConfigEntry, origin: Origin) -> ScaledMmSpec:
        return ScaledMmSpec(library=library, arch=arch, op=op, config=entry.config,
                            knobs=entry.knobs, origin=origin, **dict(variant))

    def kernel_template(self, arch: str) -> str:
        return _TEMPLATES[arch]

    def template_context(self, arch: str) -> dict[str, Any]:
        from .cpp import Cpp
        return {"cpp": Cpp()}

    # dispatch and ops
    def api_op(self, spec) -> str:
        return "scaled_mm_azp" if is_azp(spec.epilogue) else "scaled_mm"

    def dispatch_request(self, op: str, *, a_dtype, out_dtype, epilogue: str | None = None,
                         m: int, n: int, k: int):
        from ...dtypes import dtype_name
        for label, value in (("m", m), ("n", n), ("k", k)):
            # the kernels take int sizes (C++ int): 2^31 and up cannot be dispatched
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _INT32_MAX:
                raise ValueError(f"{label} must be an int in [1, 2^31 - 1] = [1, {_INT32_MAX}], "
                                 f"got {value!r}")
        epilogue = epilogue or ("ScaledEpilogue" if op == "scaled_mm" else "ScaledEpilogueAzp")
        if epilogue not in EPILOGUES or (op == "scaled_mm_azp") != is_azp(epilogue):
            allowed = AZP_EPILOGUES if op == "scaled_mm_azp" else tuple(
                e for e in EPILOGUES if not is_azp(e))
            raise ValueError(f"epilogue {epilogue!r} does not belong to op {op!r}; expected one of "
                             f"{', '.join(allowed)}")
        return ("scaled_mm", dtype_name(a_dtype), dtype_name(out_dtype), epilogue), (m, n, k)

    def describe_class(self, key) -> str:
        op, a, d, epilogue = key
        return f"{op} {a}->{d} with {epilogue}"

    def call_kernel(self, kernel, *args, **kwargs):
        ops = self.load_ops()
        fn = ops.scaled_mm_azp if is_azp(kernel.spec.epilogue) else ops.scaled_mm
        return fn(*args, kernel=kernel.name, **kwargs)


FAMILY = W8A8Family()
