#!/usr/bin/env python3
"""Benchmark gemmgen.grouped_matmul_swiglu_quant (MoE first half) against torch, side by side.

For every dtype, model, token count T and routing, on the same data (M = T x top-k rows, grouped
by expert; group_list = per-expert counts, int64 on the GPU). dtypes: int8 (A8W8), e4m3 (fp8) and
a8w4 (int8 x, int4 weights -8..7 with per-channel scales, packed two per byte by
gemmgen.pack_moe_weights(..., weight_bits=4)) and a8w4g (the same with per-group scales
[E, K/128, N], the direct kernels):
  torch per-expert  for each non-empty expert: torch._int_mm (int8; rows padded to 17 when an
                    expert has <= 16) or torch._scaled_mm (e4m3, row-wise scales, bf16 out,
                    use_fast_accum; an expert's scales copied to a 16-byte aligned buffer when
                    they start unaligned: cuBLASLt refuses them), dequant, silu(act) * gate,
                    per-row quant; counts known on the host (the straightforward loop).
                    a8w4 rows: torch has no int4 x int8 GEMM, so this is the int8 pipeline on the
                    int4 values held as int8 (one per byte: 2x the int4 weight bytes; exactly
                    A8W4's math); a8w4g rows: n/a (no torch int GEMM takes per-group scales)
  torch grouped     int8 and a8w4(g) rows: bf16 torch._grouped_mm on x and W dequantized to bf16
                    outside the timed region (2x the int8 weight bytes); e4m3 rows:
                    torch._scaled_grouped_mm (row-wise x_scale [M], weight_scale [E, N], bf16
                    out); then the same torch SwiGLU + quant
  gemmgen           gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                    check=False), dispatch as shipped (a8w4: the MoeWeight with bits=4)
  gemmgen best      the same op forced to each built kernel of the row's (x, w) types
                    (kernel=name; spec.x, spec.w): the fastest; also the fastest unfused
                    (grouped GEMM writing C, then SwiGLU + quant) and the fastest fused kernel
                    (SwiGLU and the row max in the GEMM's epilogue, then a quant pass), and
                    their ratio
  floor             weights (+ scales) of the experts that got >= 1 token read once at the
                    measured copy bandwidth (a8w4: the int4 bytes, N x K/2 per expert; a8w4g:
                    + the per-group scales, N x K/128 x 4 bytes)
  A8W8 / A8W4       a8w4 rows: gemmgen's int8 A8W8 µs of the same (model, T, routing) over the
                    A8W4 µs: the int8 row's, or, when int8 rows are not run, gemmgen's int8 op
                    timed in the a8w4 row on the int4 values held as int8 (same x)
It prints µs, the speed-ups of gemmgen over both torch pipelines, gemmgen / floor, and the issue's
targets evaluated (PASS/FAIL counts, worst case); --markdown PATH appends the tables to PATH.

NOTES (timing method): each impl's calls for `R` rotations (weight copy i % pools, x copy i) are
captured in one CUDA graph (eager when capture fails: said in the output) and the replays timed
(gemmgen.tuning.measure.graph_time_us, which `gemmgen tune` uses for the MoE family too: a spin
kernel hides the host, a warm-up batch, then --reps batches of ~300 µs back to back, the median)
and divided by R; every column of a row is timed twice, in order and then in reverse order, and
keeps the better (the impl timed right after the torch pipelines ran up to 9% slow). R and the
number of weight copies are chosen so that the bytes one replay reads (active experts' weights as
gemmgen reads them, int4 at half a byte, + x) exceed twice the L2 (Mixtral's experts are 117 MB
each: one copy). After a point's timings its q_scales are checked: int8 and a8w4 rows against the
torch per-expert pipeline's (the same exact math; a8w4: the int8 pipeline on the int4 values held
as int8), e4m3 and a8w4g rows against gemmgen.reference in float64 (e4m3: torch's fp8 pipeline,
fast accumulation, is itself ~1.5% off float64 at K ~7000, so it cannot referee; its own error is
reported beside gemmgen's); rtol 1e-2, e4m3 2e-2 (fast accumulation: ~1% at K 7168); a warning line
if they disagree.

    python benchmarks/bench_moe.py [--quick] [--dtypes int8,e4m3,a8w4] [--models qwen3-30b-a3b]
                                   [--tokens 1,256] [--routing uniform] [--markdown benchmarks/RESULTS.md]
                                   [--kernels direct --show-kernels]   # every direct kernel's µs
                                   [--rules-from edited_moe_sm90.yaml]  # rules A/B in one run
                                   [--json run.json]  # the rows, for compare_moe_runs.py
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import re
import shlex
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

_HERE = Path(__file__).resolve().parent
try:
    import gemmgen
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(_HERE.parent))
    import gemmgen
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
from bench_mixed_mm import copy_bandwidth, geomean  # noqa: E402  (helpers only: no side effects)
from gemmgen.errors import NoKernelError  # noqa: E402
from gemmgen.families.moe import tuning as moe_tuning  # noqa: E402
from gemmgen.tuning.measure import graph_time_us  # noqa: E402
from gemmgen.tuning.shapes import SHAPES_DIR, available_stems, load_shapes  # noqa: E402

OP = "grouped_matmul_swiglu_quant"


@dataclass(frozen=True)
class Model:
    experts: int
    k: int        # hidden size
    n: int        # 2 x intermediate (act | gate)
    topk: int


def _shipped_models() -> dict[str, Model]:
    """Every MoE expert layer of gemmgen/manifests/shapes/moe_*.yaml, named by its file's stem
    without `moe_`, with dashes (moe_qwen3_30b_a3b.yaml: qwen3-30b-a3b)."""
    models = {}
    for stem in available_stems():
        for shape in load_shapes(SHAPES_DIR / f"{stem}.yaml") if stem.startswith("moe_") else ():
            if shape.experts:
                models[stem.removeprefix("moe_").replace("_", "-")] = Model(
                    shape.experts, shape.k, shape.n, shape.top_k)
    return models


MODELS = _shipped_models()
# The three the shipped tables list and issues 11 and 12 name their floors on; the others
# (--models) are held out: dispatch takes the manifest's rules for them.
DEFAULT_MODELS = ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"]
# a row's dtype -> x's (and q's) element type, the weight's element type, its packed bits
DTYPES = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "a8w4": torch.int8, "a8w4g": torch.int8}
X_TYPE = {"int8": "int8", "e4m3": "e4m3", "a8w4": "int8", "a8w4g": "int8"}  # kernel spec.x
W_TYPE = {"int8": "int8", "e4m3": "e4m3", "a8w4": "int4", "a8w4g": "int4"}  # kernel spec.w
WEIGHT_BITS = {"int8": 8, "e4m3": 8, "a8w4": 4, "a8w4g": 4}
SCALES = {"int8": "channel", "e4m3": "channel", "a8w4": "channel", "a8w4g": "group"}  # spec.scales
A8W4_ROWS = ("a8w4", "a8w4g")
GROUP = 128  # a8w4g's group size
QMAX = {"int8": 127.0, "e4m3": 448.0}                            # by X_TYPE
ROUTINGS = moe_tuning.ROUTINGS
DEFAULT_TOKENS = [1, 16, 64, 256, 1024, 4096]
QUICK = {"dtypes": ["int8", "a8w4"], "models": ["mixtral-8x7b", "qwen3-30b-a3b"], "tokens": [16, 256, 4096],
         "routing": ["uniform"]}
MAX_ROTATIONS = 8
# q_scale check bounds (relative, the largest over a row's tokens); e4m3 against float64: its
# fast-accumulation kernels measured 0.9-1.2% off at K 6144-7168 (session 43)
CHECK_RTOL = {"int8": 1e-2, "e4m3": 2e-2, "a8w4": 1e-2, "a8w4g": 1e-2}
# the dtypes whose check's reference is gemmgen.reference in float64 (no exact torch pipeline)
FLOAT64_CHECKED = ("e4m3", "a8w4g")
# int8 / a8w4: the bf16 pipeline rounds x·scale and W·scale to bf16
GROUPED_RTOL = {"int8": 3e-2, "e4m3": 2e-2, "a8w4": 3e-2, "a8w4g": 3e-2}
TARGETS = ("(1) gemmgen >= 2.5x torch per-expert at >= 256 tokens (A8W8: int8 and e4m3 rows)",
           "(2) gemmgen faster than torch's fp8 grouped pipeline at every shape (e4m3 rows)",
           "(3) gemmgen <= 1.5x the weight-read floor at <= 1024 tokens (A8W8: int8 and e4m3 rows)",
           "(4) A8W4 >= 1.5x faster than gemmgen's A8W8 at <= 256 tokens (a8w4 and a8w4g rows)",
           "(5) A8W4 <= 1.5x the int4 weight-read floor at <= 256 tokens (a8w4 and a8w4g rows)",
           "(6) fused >= 1.15x unfused (best kernel of each) where tokens per expert >= 128 (A8W8 rows)")


# ---------------------------------------------------------------- arguments
def _list_arg(kind=str, choices=None):
    """A comma- (or space-) separated list: `--x a,b` or `--x a b`."""
    def parse(text: str):
        values = [kind(v) for v in text.split(",") if v.strip()]
        bad = [v for v in values if choices is not None and v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return values
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", nargs="+", metavar="LIST", type=_list_arg(str, DTYPES),
                   help=f"element types: int8 (A8W8), e4m3 (fp8), a8w4 (int8 x, int4 weights), "
                        f"a8w4g (a8w4 with group-{GROUP} scales) "
                        f"(default {','.join(DTYPES)}; --quick: {','.join(QUICK['dtypes'])})")
    p.add_argument("--models", nargs="+", metavar="LIST", type=_list_arg(str, MODELS),
                   help=f"models (default {','.join(DEFAULT_MODELS)}; --quick: {','.join(QUICK['models'])}; "
                        f"any of {','.join(MODELS)})")
    p.add_argument("--tokens", nargs="+", metavar="LIST", type=_list_arg(int),
                   help=f"token counts T (default {','.join(map(str, DEFAULT_TOKENS))}; --quick: "
                        f"{','.join(map(str, QUICK['tokens']))}); rows M = T x top-k")
    p.add_argument("--routing", nargs="+", metavar="LIST", type=_list_arg(str, ROUTINGS),
                   help="uniform: top-k distinct experts uniformly per token; skewed: expert "
                        "probabilities ~ 1/(i+1) (Zipf) (default both; --quick: uniform)")
    p.add_argument("--quick", action="store_true",
                   help="a subset: Mixtral and Qwen3, T in 16,256,4096, uniform, int8 and a8w4, 10 reps")
    p.add_argument("--reps", type=int, help="timed batches per measurement, median taken (default 20; --quick 10)")
    p.add_argument("--no-best", action="store_true", help="skip timing every forced kernel (gemmgen best)")
    p.add_argument("--kernels", metavar="REGEX",
                   help="gemmgen best: only the built kernels whose name matches (re.search)")
    p.add_argument("--show-kernels", action="store_true",
                   help="print every forced kernel's µs under its row (A/B of configs in one run)")
    p.add_argument("--rules-from", type=Path, metavar="MANIFEST",
                   help="also time the kernel that this manifest's rules pick (forced by name: its "
                        "configs must be the built library's), beside the library's own rules: an "
                        "A/B of dispatch rules in one run, with no second build")
    p.add_argument("--mem-gib", type=float, default=20.0, help="cap on the weight copies' memory (GiB)")
    p.add_argument("--markdown", type=Path, metavar="PATH",
                   help="append the results section (device, torch, date, command) to PATH, "
                        "e.g. benchmarks/RESULTS.md")
    p.add_argument("--json", type=Path, metavar="PATH",
                   help="write the run's rows (every column, each forced kernel's µs) and its "
                        "device, date and command to PATH as JSON: benchmarks/compare_moe_runs.py "
                        "compares runs of two libraries")
    args = p.parse_args(argv)
    for name, default in (("dtypes", list(DTYPES)), ("models", DEFAULT_MODELS),
                          ("tokens", DEFAULT_TOKENS), ("routing", list(ROUTINGS))):
        given = [v for values in getattr(args, name) or [] for v in values]
        setattr(args, name, list(dict.fromkeys(given)) or (QUICK[name] if args.quick else default))
    args.tokens = sorted(args.tokens)
    args.dtypes = [d for d in DTYPES if d in args.dtypes]  # int8 rows before a8w4 (A8W8 / A8W4)
    args.reps = args.reps or (10 if args.quick else 20)
    if args.show_kernels and args.no_best:
        p.error("--show-kernels prints the forced kernels' times, which --no-best skips: drop one")
    if args.rules_from is not None and not args.rules_from.is_file():
        p.error(f"--rules-from: no manifest at {args.rules_from}")
    if min(args.tokens) < 1 or args.reps < 1 or args.mem_gib <= 0:
        p.error("--tokens, --reps and --mem-gib must be positive")
    return args


# ---------------------------------------------------------------- data
def routing_counts(model: Model, tokens: int, routing: str, name: str) -> list[int]:
    """Rows per expert: every token picks top-k distinct experts (uniform or Zipf-skewed, as
    `gemmgen tune` routes its batches), seeded by the model, tokens and routing."""
    return moe_tuning.routing_counts(tokens, model.experts, model.topk,
                                     zlib.crc32(f"{name}/{tokens}/{routing}".encode()), routing)


def _scales(shape, k: int, kind: str) -> torch.Tensor:
    """Scales for values of `kind` (int8, e4m3, int4): both sides' together keep C O(1), as the
    tuner's (a fused kernel's time depends on C's values)."""
    return moe_tuning.unit_output_scales(shape, k, kind)


def _random(shape, kind: str) -> torch.Tensor:
    """Full-range random values of `kind`; int4: -8..7 held in an int8 tensor."""
    if kind == "int8":
        return torch.randint(-128, 128, shape, dtype=torch.int8, device="cuda")
    if kind == "int4":
        return torch.randint(-8, 8, shape, dtype=torch.int8, device="cuda")
    return torch.randn(shape, dtype=torch.bfloat16, device="cuda").to(torch.float8_e4m3fn)


def weight_bytes(dtype: str) -> float:
    """Bytes per weight element that gemmgen reads: 1, or 1/2 for int4."""
    return WEIGHT_BITS[dtype] / 8


def bytes_per_copy(dtype: str) -> float:
    """Bytes per weight element of one rotated copy: the packed weight, the logical one (torch's),
    plus (a8w4) the values held as int8, plus (int8, a8w4) the bf16 dequantized weight of the
    torch grouped baseline."""
    return (weight_bytes(dtype) + 1 + (1 if dtype in A8W4_ROWS else 0)
            + (2 if X_TYPE[dtype] == "int8" else 0))


@dataclass
class Weights:
    """Copies of one model's expert weights, rotated call by call."""

    packed: list                                   # gemmgen.MoeWeight: [E, N, K] (a8w4: uint8
                                                   # [E, N, K/2], bits=4) + scales [E, N], act and
                                                   # gate interleaved
    held: list                                     # 8-bit MoeWeights of the same values (a8w4: the
                                                   # int4 values held as int8, the A8W8 op's); else
                                                   # `packed`
    logical: list                                  # (weight [E, N, K] contiguous, act half then gate
                                                   # half; scale [E, N]) of the same values: torch's
    bf16: list = field(default_factory=list)       # int8, a8w4: dequantized [E, K, N] views (K-major)


def make_weights(model: Model, dtype: str, copies: int) -> Weights:
    e, n, k = model.experts, model.n, model.k
    kind = W_TYPE[dtype]
    w = torch.empty(e, n, k, dtype=DTYPES[dtype], device="cuda")
    for i in range(e):  # per expert: bounded temporaries
        w[i] = _random((n, k), kind)
    per_group = SCALES[dtype] == "group"
    scale = _scales((e, k // GROUP, n) if per_group else (e, n), k, kind)
    pack = gemmgen.pack_moe_weights
    logical = [(w, scale)] + [(w.clone(), scale) for _ in range(copies - 1)]
    # the A8W8 op's weights (8-bit weights take per-channel scales: the first group's stands in)
    held = [pack(lw.transpose(1, 2), scale[:, 0] if per_group else scale) for lw, _ in logical]
    if dtype in A8W4_ROWS:
        first = pack(w.transpose(1, 2), scale, weight_bits=4)  # uint8 [E, N, K/2], bits=4
        packed = [first] + [dataclasses.replace(first, weight=first.weight.clone())
                            for _ in range(copies - 1)]
    else:
        packed = held
    weights = Weights(packed, held, logical)
    if X_TYPE[dtype] == "int8":
        wb = torch.empty(e, n, k, dtype=torch.bfloat16, device="cuda")
        for i in range(e):
            s = scale[i].t().repeat_interleave(GROUP, dim=1) if per_group else scale[i][:, None]
            wb[i] = (w[i].float() * s).to(torch.bfloat16)
        weights.bf16 = [wb.transpose(1, 2)] + [wb.clone().transpose(1, 2) for _ in range(copies - 1)]
    return weights


@dataclass
class Inputs:
    """R rotated copies of x, x_scale (and bf16 x for the int8 grouped baseline) of one point."""

    x: list
    x_scale: list
    x_bf16: list
    counts: list[int]
    group_list: torch.Tensor                       # int64 [E] counts on the GPU
    offs: torch.Tensor                             # int32 [E] cumsum on the GPU (torch grouped)


def make_inputs(model: Model, dtype: str, counts: list[int], copies: int) -> Inputs:
    m, k = sum(counts), model.k
    x = [_random((m, k), X_TYPE[dtype]) for _ in range(copies)]
    xs = [_scales((m,), k, X_TYPE[dtype]) for _ in range(copies)]
    xb = [(a.float() * s[:, None]).to(torch.bfloat16) for a, s in zip(x, xs)] if X_TYPE[dtype] == "int8" else []
    gl = torch.tensor(counts, dtype=torch.int64, device="cuda")
    return Inputs(x, xs, xb, counts, gl, torch.cumsum(gl, 0).to(torch.int32))


# ---------------------------------------------------------------- the impls: fn(i) -> (q, q_scale)
def swiglu_quant(c: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """torch SwiGLU (first half act, second half gate) + per-row quant, as the reference defines
    (q has x's element type: int8 for int8 and a8w4)."""
    half = c.shape[1] // 2
    s = F.silu(c[:, :half]) * c[:, half:]
    scale = s.abs().amax(dim=1) / QMAX[X_TYPE[dtype]]
    y = s / scale.clamp_min(1e-30)[:, None]
    if X_TYPE[dtype] == "int8":
        return y.round().clamp_(-127, 127).to(torch.int8), scale
    return y.clamp_(-448, 448).to(torch.float8_e4m3fn), scale


def per_expert_fn(dtype: str, weights: Weights, inp: Inputs):
    """The straightforward loop over the non-empty experts (counts on the host). a8w4: the int8
    loop on the int4 values held as int8 (torch has no int4 x int8 GEMM): A8W4's exact math.
    Not for a8w4g (no torch int GEMM takes per-group scales)."""
    m, k = inp.x[0].shape
    n = weights.logical[0][0].shape[1]
    int8 = X_TYPE[dtype] == "int8"
    spans, start = [], 0
    for e, count in enumerate(inp.counts):
        if count:
            spans.append((e, start, start + count))
        start += count
    # torch._int_mm refuses M <= 16: such experts' rows go through a 17-row buffer (rows sliced
    # off after). torch._scaled_mm (cuBLASLt row-wise) takes any M but wants a 16-byte aligned
    # scale_a: an expert whose rows start off a multiple of 4 gets its scales copied to one.
    a_pad = torch.zeros(17, k, dtype=DTYPES[dtype], device="cuda")
    s_buf = torch.zeros(max([b - a for _, a, b in spans] + [1]), device="cuda")
    q = torch.empty(m, n // 2, dtype=DTYPES[dtype], device="cuda")
    q_scale = torch.empty(m, device="cuda")

    def fn(i: int):
        x, xs = inp.x[i % len(inp.x)], inp.x_scale[i % len(inp.x)]
        w, w_scale = weights.logical[i % len(weights.logical)]
        for e, a0, a1 in spans:
            rows, a, sa = a1 - a0, x[a0:a1], xs[a0:a1]
            if int8:
                if rows <= 16:
                    a_pad[:rows].copy_(a)
                    a = a_pad
                c = torch._int_mm(a, w[e].t())[:rows].float() * sa[:, None] * w_scale[e][None]
            else:
                if a0 % 4:
                    sa = s_buf[:rows].copy_(sa)
                c = torch._scaled_mm(a, w[e].t(), scale_a=sa[:, None], scale_b=w_scale[e][None],
                                     out_dtype=torch.bfloat16, use_fast_accum=True).float()
            qe, se = swiglu_quant(c, dtype)
            q[a0:a1].copy_(qe)
            q_scale[a0:a1].copy_(se)
        return q, q_scale
    return fn


def grouped_fn(dtype: str, weights: Weights, inp: Inputs):
    """torch's grouped GEMM (int32 end offsets, unpadded groups) + torch SwiGLU + quant."""
    def fn(i: int):
        if X_TYPE[dtype] == "int8":  # int8, a8w4: bf16 on the dequantized weights
            g = torch._grouped_mm(inp.x_bf16[i % len(inp.x_bf16)], weights.bf16[i % len(weights.bf16)],
                                  offs=inp.offs)
        else:
            w, w_scale = weights.logical[i % len(weights.logical)]
            g = torch._scaled_grouped_mm(inp.x[i % len(inp.x)], w.transpose(1, 2),
                                         inp.x_scale[i % len(inp.x)], w_scale, offs=inp.offs,
                                         out_dtype=torch.bfloat16, use_fast_accum=True)
        return swiglu_quant(g.float(), dtype)
    return fn


def gemmgen_fn(packed: list, inp: Inputs, kernel: str | None = None):
    """gemmgen's op on rotated copies of a packed MoeWeight (8-bit, or bits=4: A8W4)."""
    op = gemmgen.grouped_matmul_swiglu_quant  # bound once, as user code does
    gl = inp.group_list

    def fn(i: int):
        return op(inp.x[i % len(inp.x)], packed[i % len(packed)], None,
                  inp.x_scale[i % len(inp.x)], gl, "count", False, kernel=kernel)
    return fn


# ---------------------------------------------------------------- timing
class Timer:
    """µs per call of fn(0..R-1), captured in one CUDA graph (eager when capture fails)."""

    def __init__(self, reps: int):
        self.reps = reps
        self.stream = torch.cuda.Stream()

    def __call__(self, fn, rotations: int) -> tuple[float, str]:
        return graph_time_us(fn, rotations, self.reps, self.stream)


def first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]


def short_kernel(kernel) -> str:
    """The config label (manifest `name`) and tile, e.g. 'decode 128x16x128 swap'."""
    cfg = getattr(kernel.spec, "config", None)
    label = getattr(getattr(kernel.spec, "origin", None), "config", None)
    if cfg is None or not hasattr(cfg, "tile"):
        return kernel.name
    text = "x".join(map(str, cfg.tile)) + (" swap" if getattr(cfg, "swap_ab", False) else "")
    if getattr(cfg, "intermediate", "fp32") != "fp32":
        text += f" c={cfg.intermediate}"
    return f"{label} {text}" if label else text


def rel_mismatch(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.float(), ref.float()
    if not torch.isfinite(got).all():
        return math.inf
    return ((got - ref).abs() / ref.abs().clamp_min(1e-6 * ref.abs().max().item() + 1e-30)).max().item()


# ---------------------------------------------------------------- one point
def bench_point(dtype, name, model, tokens, routing, weights, kernels, ctx) -> dict:
    counts = routing_counts(model, tokens, routing, name)
    m, e, n, k = sum(counts), model.experts, model.n, model.k
    active = sum(1 for c in counts if c)
    active_bytes = int(active * n * k * weight_bytes(dtype))  # what gemmgen reads (int4: N·K/2 each)
    rotations = max(1, min(MAX_ROTATIONS, (2 * ctx["l2"]) // (active_bytes + m * k) + 1))
    inp = make_inputs(model, dtype, counts, rotations)
    row = {"dtype": dtype, "model": name, "tokens": tokens, "routing": routing, "m": m, "active": active,
           "rotations": rotations, "notes": [], "kernel_us": {},
           "floor": (active_bytes + active * n * 4 * (k // GROUP if SCALES[dtype] == "group" else 1))
           / ctx["bandwidth"] * 1e6}
    timer = ctx["timer"]
    label = f"{dtype} {name} T={tokens} {routing}"

    # the q_scales to check, once the row's timings are done, against the reference: the torch
    # per-expert pipeline's (int8, a8w4; for e4m3 it is checked too) or gemmgen.reference in
    # float64 (e4m3, a8w4g), computed after the timings (computed first, its float64 GEMMs left
    # the impl timed right after them up to 10% slower than the same kernel forced later in the
    # row: held-out models, H200, session 43; likely the clocks, not profiled)
    to_check, ref = {}, None
    # (column, fn) of every timing, re-timed in reverse order once the row's first pass is done,
    # each column keeping the better of its two: the impl timed first after the torch pipelines
    # ran 5-9% slow (Mixtral-8x22B fp8, H200, session 47; the first pass alone had favoured
    # --rules-from's pick and the forced kernels over the dispatched one)
    retimed = []
    aliases = {}  # a column whose kernel another column times: it takes that column's time
    try:
        if SCALES[dtype] != "group":  # per group: no torch pipeline (said once, in the report)
            fn = per_expert_fn(dtype, weights, inp)
            if dtype in FLOAT64_CHECKED:
                to_check["torch per-expert"] = (fn(0)[1].clone(), None)  # reported, not bounded
            else:
                ref = fn(0)[1].clone()
            row["per_expert"], how = timer(fn, rotations)
            retimed.append(("per_expert", fn))
            if how != "graph":
                row["notes"].append(f"per-expert {how}")
    except Exception as exc:  # noqa: BLE001
        row["per_expert_error"] = first_line(exc)
        row["notes"].append(f"torch per-expert n/a: {row['per_expert_error']}")
    try:
        fn = grouped_fn(dtype, weights, inp)
        to_check["torch grouped"] = (fn(0)[1].clone(), GROUPED_RTOL[dtype])
        row["grouped"], how = timer(fn, rotations)
        retimed.append(("grouped", fn))
        if how != "graph":
            row["notes"].append(f"grouped {how}")
    except Exception as exc:  # noqa: BLE001 - e.g. torch._scaled_grouped_mm absent on this build
        row["grouped_error"] = first_line(exc)
        row["notes"].append(f"torch grouped n/a: {row['grouped_error']}")
    # gemmgen: check against the per-expert pipeline, then dispatch as shipped and every kernel
    problem = dict(x_dtype=DTYPES[dtype], m=m, experts=e, n=n, k=k, weight_bits=WEIGHT_BITS[dtype],
                   per_group=SCALES[dtype] == "group")
    dispatched = rules = None
    try:
        dispatched = gemmgen.dispatch.lookup(OP, **problem)
        row["dispatched"] = short_kernel(dispatched)
        rules = gemmgen.dispatch.lookup(OP, tuned=False, **problem)  # the manifest's rules alone
        row["rules_kernel"] = short_kernel(rules)
    except Exception as exc:  # noqa: BLE001
        row.setdefault("dispatched", f"? ({first_line(exc)})")
        row["notes"].append(f"dispatch: {first_line(exc)}")
    other = None
    if ctx.get("rules_from") is not None:  # --rules-from: that manifest's rules, from its text
        try:
            other = gemmgen.dispatch.choose(OP, tuned=False, source="manifests",
                                            manifests=[ctx["rules_from"]], **problem).kernel
            row["rules_from_kernel"] = short_kernel(other)
        except Exception as exc:  # noqa: BLE001
            row["notes"].append(f"--rules-from: {first_line(exc)}")
    try:
        _, s = gemmgen.grouped_matmul_swiglu_quant(inp.x[0], weights.packed[0], None, inp.x_scale[0],
                                                   inp.group_list, check=True)
        to_check["gemmgen"] = (s.clone(), CHECK_RTOL[dtype])
        fn = gemmgen_fn(weights.packed, inp)
        row["gemmgen"], how = timer(fn, rotations)
        retimed.append(("gemmgen", fn))
        if how != "graph":
            row["notes"].append(f"gemmgen {how}")
    except Exception as exc:  # noqa: BLE001 - a gemmgen bug: said loudly, the run goes on
        row["gemmgen"] = None
        row["notes"].append(f"gemmgen ERROR {type(exc).__name__}: {first_line(exc)}")
        print(f"  !!! {label}: gemmgen raised {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    if rules is not None and row.get("gemmgen") is not None:
        # rules only: the kernel the rules pick, forced (the dispatched one when no table serves)
        try:
            if rules.name == dispatched.name:
                aliases["rules"] = "gemmgen"
            else:
                fn = gemmgen_fn(weights.packed, inp, rules.name)
                row["rules"] = timer(fn, rotations)[0]
                retimed.append(("rules", fn))
        except Exception as exc:  # noqa: BLE001
            row["notes"].append(f"rules only ({short_kernel(rules)}): {first_line(exc)}")
    if other is not None and row.get("gemmgen") is not None:
        # the other manifest's pick: a time already taken when it names the same kernel
        timed_as = {kern.name: column for kern, column in ((rules, "rules"), (dispatched, "gemmgen"))
                    if kern is not None and (column in row or column in aliases)}
        try:
            if other.name in timed_as:
                aliases["rules_from"] = timed_as[other.name]
            else:
                fn = gemmgen_fn(weights.packed, inp, other.name)
                row["rules_from"] = timer(fn, rotations)[0]
                retimed.append(("rules_from", fn))
        except Exception as exc:  # noqa: BLE001 - e.g. a config the built library lacks
            row["notes"].append(f"--rules-from ({short_kernel(other)}): {first_line(exc)}")
    if dtype in A8W4_ROWS and ctx["time_a8w8"]:
        # no int8 rows in this run: gemmgen's A8W8 op on the same values (int4 held as int8), same x
        try:
            fn = gemmgen_fn(weights.held, inp)
            row["a8w8"], how = timer(fn, rotations)
            retimed.append(("a8w8", fn))
            row["a8w8_from"] = "timed here"
            if how != "graph":
                row["notes"].append(f"A8W8 {how}")
        except NoKernelError as exc:  # a library of A8W4 kernels only (an A/B's probe library)
            row["a8w8"] = None
            ctx["time_a8w8"] = False  # the same for every later row: said once, not timed again
            print(f"  (A8W8 not timed in this run: {first_line(exc)})", flush=True)
        except Exception as exc:  # noqa: BLE001
            row["a8w8"] = None
            row["notes"].append(f"gemmgen A8W8 ERROR {type(exc).__name__}: {first_line(exc)}")
    kinds = {}
    for kernel in kernels:
        fn = gemmgen_fn(weights.packed, inp, kernel.name)
        try:
            us, _ = timer(fn, rotations)
        except Exception as exc:  # noqa: BLE001
            row["notes"].append(f"{short_kernel(kernel)}: {first_line(exc)}")
            continue
        row["kernel_us"][short_kernel(kernel)] = us
        kinds[short_kernel(kernel)] = "fused" if kernel.spec.config.fused else "unfused"
        retimed.append((short_kernel(kernel), fn))
    for column, fn in reversed(retimed):  # the second pass
        try:
            us = timer(fn, rotations)[0]
        except Exception as exc:  # noqa: BLE001 - timed once already: keep that time
            row["notes"].append(f"{column} (second pass): {first_line(exc)}")
            continue
        if column in row["kernel_us"]:
            row["kernel_us"][column] = min(row["kernel_us"][column], us)
        else:
            row[column] = min(row[column], us)
    for column, source in aliases.items():  # "rules" before "rules_from", which may name it
        row[column] = row[source]
    for label_, us in row["kernel_us"].items():
        if us < row.get("best", math.inf):
            row["best"], row["best_kernel"] = us, label_
        kind = kinds[label_]
        if us < row.get(kind, math.inf):
            row[kind], row[kind + "_kernel"] = us, label_
    if dtype in FLOAT64_CHECKED and to_check:
        try:
            w, w_scale = weights.logical[0]
            ref = gemmgen.reference.grouped_matmul_swiglu_quant(
                inp.x[0], w.transpose(1, 2), w_scale, inp.x_scale[0], inp.group_list,
                weight_bits=WEIGHT_BITS[dtype])[1]
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory at the largest points
            row["notes"].append(f"reference n/a (no q_scale check): {first_line(exc)}")
            torch.cuda.empty_cache()
    for what, (q_scale, rtol) in to_check.items() if ref is not None else ():
        err = rel_mismatch(q_scale, ref)
        kept_as = {"gemmgen": "check", "torch per-expert": "check_torch"}.get(what)
        if kept_as:
            row[kept_as] = err
        if rtol is not None and not err <= rtol:
            print(f"  WARNING {label}: {what} q_scale differs from the check's reference by up to "
                  f"{err:.2e} (relative; rtol {rtol})", flush=True)
    del inp
    return row


def attach_a8w8(rows: list[dict], row: dict) -> None:
    """An a8w4 row's A8W8 µs: the gemmgen time of the int8 row of the same (model, T, routing)
    when int8 rows ran (before it: main runs int8 first), else the one bench_point timed."""
    if row["dtype"] not in A8W4_ROWS:
        return
    key = (row["model"], row["tokens"], row["routing"])
    for r in rows:
        if r["dtype"] == "int8" and (r["model"], r["tokens"], r["routing"]) == key:
            row["a8w8"], row["a8w8_from"] = r["gemmgen"], "int8 row"
            return


# ---------------------------------------------------------------- report
def fmt(value, digits=1, suffix="") -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}{suffix}"


def ratio(a, b):
    return a / b if a is not None and b is not None and b > 0 else None


def fused_gain(r: dict):
    """unfused best µs / fused best µs (None without a fused or an unfused kernel)."""
    return ratio(r.get("unfused"), r.get("fused"))


def rules_from_moved(rows: list[dict]) -> str:
    """The rows whose --rules-from kernel differs from the library's rules' pick: how many, and
    the geomean of rules µs / --rules-from µs over them."""
    moved = [r for r in rows if r.get("rules_from_kernel") not in (None, r.get("rules_kernel"))
             and r.get("rules") is not None and r.get("rules_from") is not None]
    if not moved:
        return "no row"
    return (f"geomean {geomean(ratio(r['rules'], r['rules_from']) for r in moved):.3f} over {len(moved)} "
            f"row{'s' if len(moved) > 1 else ''} (< 1: the library's rules faster)")


def tokens_per_expert(r: dict) -> int:
    """ceil(M / E), as dispatch defines it."""
    return -(-r["m"] // MODELS[r["model"]].experts)


def a8w8_ratio(r: dict):
    """A8W8 µs / A8W4 µs of an a8w4 row (None when either is missing)."""
    return ratio(r.get("a8w8"), r["gemmgen"]) if r["dtype"] in A8W4_ROWS else None


HELD = "†"  # marks the a8w4 rows' torch per-expert time: the int8 pipeline on int4 values held as int8


def table(rows: list[dict]) -> str:
    lines = ["| dtype | model | T | routing | M | active E | torch per-expert µs | torch grouped µs | "
             "gemmgen µs | rules only µs | gemmgen best µs | kernel (dispatched; best) | unfused best µs | "
             "fused best µs | unfused / fused | floor µs | x per-expert | x grouped | gemmgen / floor | "
             "A8W8 / A8W4 |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        kernel = r.get("dispatched", "?")
        if r.get("best_kernel") and r["best_kernel"] != kernel:
            kernel += f"; {r['best_kernel']}"
        grouped = fmt(r.get("grouped")) if "grouped" in r else "n/a"
        per_expert = fmt(r.get("per_expert")) + (HELD if r["dtype"] == "a8w4" else "")
        a8w8 = fmt(a8w8_ratio(r), 2, "x") if r["dtype"] in A8W4_ROWS else "-"
        lines.append(
            f"| {r['dtype']} | {r['model']} | {r['tokens']} | {r['routing']} | {r['m']} | {r['active']} | "
            f"{per_expert} | {grouped} | {fmt(r['gemmgen'])} | {fmt(r.get('rules'))} | {fmt(r.get('best'))} | {kernel} | "
            f"{fmt(r.get('unfused'))} | {fmt(r.get('fused'))} | {fmt(fused_gain(r), 2, 'x')} | "
            f"{fmt(r['floor'])} | {fmt(ratio(r.get('per_expert'), r['gemmgen']), 2, 'x')} | "
            f"{fmt(ratio(r.get('grouped'), r['gemmgen']), 2, 'x')} | {fmt(ratio(r['gemmgen'], r['floor']), 2)} | "
            f"{a8w8} |")
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets: PASS/FAIL counts and the worst case of each."""
    def label(r):
        return f"{r['dtype']} {r['model']} T={r['tokens']} {r['routing']}"
    a8w8 = [r for r in rows if r["dtype"] in ("int8", "e4m3")]   # the A8W8 targets: 8-bit weights
    a8w4 = [r for r in rows if r["dtype"] in A8W4_ROWS]
    checks = [  # (rows it applies to, value, pass test, worst = min or max, how the value reads)
        ([r for r in a8w8 if r["tokens"] >= 256 and r.get("per_expert")],
         lambda r: ratio(r["per_expert"], r["gemmgen"]), lambda v: v >= 2.5, min, "x per-expert"),
        ([r for r in a8w8 if r["dtype"] == "e4m3" and r.get("grouped")],
         lambda r: ratio(r["grouped"], r["gemmgen"]), lambda v: v > 1.0, min, "x fp8 grouped"),
        ([r for r in a8w8 if r["tokens"] <= 1024],
         lambda r: ratio(r["gemmgen"], r["floor"]), lambda v: v <= 1.5, max, "x floor"),
        ([r for r in a8w4 if r["tokens"] <= 256],  # A8W8 missing (gemmgen raised): a failure
         a8w8_ratio, lambda v: v >= 1.5, min, "x A8W8 (A8W8 µs / A8W4 µs)"),
        ([r for r in a8w4 if r["tokens"] <= 256],
         lambda r: ratio(r["gemmgen"], r["floor"]), lambda v: v <= 1.5, max, "x int4 floor"),
        ([r for r in a8w8 if tokens_per_expert(r) >= 128 and r.get("unfused")],
         fused_gain, lambda v: v >= 1.15, min, "x (unfused / fused)"),
    ]
    out = []
    for title, (sel, value, ok, worst, unit) in zip(TARGETS, checks):
        if not sel:
            out.append(f"- {title}: not evaluated (no rows)")
            continue
        failed = 0.0 if worst is min else math.inf  # gemmgen raised: counts as a failure
        values = [(failed if value(r) is None else value(r), r) for r in sel]
        passed = sum(1 for v, _ in values if ok(v))
        v, r = worst(values, key=lambda t: t[0])
        out.append(f"- {title}: {'PASS' if passed == len(sel) else 'FAIL'} ({passed} of {len(sel)} pass, "
                   f"{len(sel) - passed} fail); worst {fmt(v, 2)} {unit} at {label(r)}")
    for dtype in DTYPES:
        checked = [r for r in rows if "check" in r and r["dtype"] == dtype]
        if checked:
            bad = sum(1 for r in checked if not r["check"] <= CHECK_RTOL[dtype])
            versus = {"a8w4": "torch per-expert on the int4 values held as int8"}.get(
                dtype, "gemmgen.reference (float64)" if dtype in FLOAT64_CHECKED else "torch per-expert")
            torch_errors = [r["check_torch"] for r in checked if "check_torch" in r]
            beside = (f"; torch's per-expert pipeline: max {max(torch_errors):.1e}" if torch_errors else "")
            out.append(f"- q_scale check ({dtype}), gemmgen vs {versus}: max relative difference "
                       f"{max(r['check'] for r in checked):.1e} ({bad} of {len(checked)} rows over rtol "
                       f"{CHECK_RTOL[dtype]}){beside}")
    sources = sorted({r.get("a8w8_from", "missing") for r in rows if r["dtype"] in A8W4_ROWS})
    if sources:
        how = {"int8 row": "the int8 row's gemmgen µs of the same (model, T, routing)",
               "timed here": "gemmgen's int8 op timed in the a8w4 row on the int4 values held as int8 (same x, "
                             "no int8 rows in this run)",
               "missing": "missing (no A8W8 time: counted as a failure)"}
        out.append("- A8W8 µs of the A8W8 / A8W4 ratio: " + "; ".join(how[source] for source in sources))
    skipped = [r for r in rows if r["dtype"] == "e4m3" and not r.get("grouped")]
    if skipped:
        out.append(f"- torch fp8 grouped n/a at {len(skipped)} e4m3 rows: {skipped[0].get('grouped_error', '?')}")
    return out


def report(rows: list[dict], args, meta: dict) -> str:
    lines = [f"## MoE grouped_matmul_swiglu_quant on {meta['device']}", "",
             f"{meta['date']}; torch {torch.__version__}; `{meta['command']}`; copy bandwidth "
             f"{meta['bandwidth'] / 1e12:.2f} TB/s (read + write), L2 {meta['l2'] / 2**20:.0f} MiB; "
             f"{meta['seconds']:.0f} s.", "",
             "µs per call: CUDA graph of R rotated calls (weights and x copies beyond 2x L2), median "
             f"of {args.reps} batches after warm-up; every column of a row timed twice, in order and "
             "then in reverse, the better kept. torch per-expert: loop over non-empty experts "
             "(`_int_mm`, rows padded to 17 when <= 16 / `_scaled_mm` row-wise, bf16 out) + dequant + "
             f"SwiGLU + per-row quant; {HELD} a8w4 rows: the int8 `_int_mm` pipeline on the int4 values "
             "held as int8 (torch has no int4 x int8 GEMM; 2x the int4 weight bytes, the same math); "
             "a8w4g rows: n/a (no torch int8 GEMM applies per-group weight scales). q_scale checked "
             "against the per-expert pipeline's (int8, a8w4) or gemmgen.reference in float64 (e4m3, "
             "a8w4g). "
             "torch grouped: int8 and a8w4 rows = bf16 `_grouped_mm` on dequantized x and W (2x int8 "
             "weight bytes); e4m3 rows = `_scaled_grouped_mm` (row-wise, bf16 out); both + torch SwiGLU "
             "+ quant. gemmgen: dispatch as shipped (a8w4: int4 weights packed two per byte, bits=4); "
             "rules only: the kernel the manifest's rules pick, forced (the tuned table aside); "
             "best: fastest forced kernel of the row's (x, w) types. floor: active experts' weights + "
             "scales at the copy bandwidth (a8w4: int4, N·K/2 bytes per expert). x = torch µs / gemmgen "
             "µs. A8W8 / A8W4 = gemmgen's int8 A8W8 µs / its A8W4 µs, same (model, T, routing).", "",
             table(rows), "", "Targets:", "", *targets(rows)]
    for dtype in args.dtypes:
        sel = [r for r in rows if r["dtype"] == dtype]
        if sel:
            per_expert = [ratio(r.get('per_expert'), r['gemmgen']) for r in sel]
            per_expert_text = (f"{geomean(per_expert):.2f}x per-expert" if any(v is not None for v in per_expert)
                               else "per-expert n/a")
            lines.append(f"- {dtype} geomean: {per_expert_text}, "
                         f"{geomean(ratio(r.get('grouped'), r['gemmgen']) for r in sel):.2f}x grouped, "
                         f"{geomean(ratio(r['gemmgen'], r['floor']) for r in sel):.2f} x floor"
                         + (f", {geomean(a8w8_ratio(r) for r in sel):.2f}x A8W8" if dtype in A8W4_ROWS else "")
                         + (f"; rules only / gemmgen {geomean(ratio(r.get('rules'), r['gemmgen']) for r in sel):.3f}"
                            if any(r.get("rules") is not None for r in sel) else "")
                         + (f"; rules only µs / --rules-from's µs where they pick differently: "
                            f"{rules_from_moved(sel)}"
                            if any(r.get("rules_from") is not None for r in sel) else ""))
    notes = [f"{r['dtype']} {r['model']} T={r['tokens']} {r['routing']}: {'; '.join(r['notes'])}"
             for r in rows if r["notes"]]
    if notes:
        lines += ["", "Notes:", "", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_moe: a CUDA GPU (sm90) and a built gemmgen library are needed", file=sys.stderr)
        return 1
    started = time.perf_counter()
    torch.manual_seed(0)
    device = torch.cuda.get_device_name()
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 50 * 2**20)
    bandwidth = copy_bandwidth()
    torch.cuda.empty_cache()
    print(f"{device}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write), L2 {l2 / 2**20:.0f} MiB; "
          f"torch {torch.__version__}", flush=True)
    all_kernels = [kern for kern in gemmgen.list_kernels() if kern.spec.family == "moe"]
    # a8w4 rows' A8W8 / A8W4 ratio: from the int8 rows, or timed in the a8w4 rows without them
    ctx = {"l2": l2, "bandwidth": bandwidth, "timer": Timer(args.reps), "time_a8w8": "int8" not in args.dtypes,
           "rules_from": args.rules_from}
    rows = []
    for dtype in args.dtypes:
        # best: only the kernels of the row's (x, w) types (forcing another one is refused)
        kernels = [] if args.no_best else [kern for kern in all_kernels
                                           if (kern.spec.x, kern.spec.w, kern.spec.scales)
                                           == (X_TYPE[dtype], W_TYPE[dtype], SCALES[dtype])
                                           and (not args.kernels or re.search(args.kernels, kern.name))]
        if not args.no_best and not kernels:
            print(f"  no built moe kernels for {dtype} (x {X_TYPE[dtype]}, w {W_TYPE[dtype]}): gemmgen best skipped")
        for name in args.models:
            model = MODELS[name]
            # weight copies: enough that the fewest experts a point can touch (top-k) exceed 2x L2
            # in the bytes gemmgen reads (int4: half), within --mem-gib (the bf16 copies of the
            # int8 / a8w4 grouped baseline and a8w4's int8-held values count too)
            per_copy = int(model.experts * model.n * model.k * bytes_per_copy(dtype))
            copies = min(int((2 * l2) // (model.topk * model.n * model.k * weight_bytes(dtype))) + 1,
                         max(1, int(args.mem_gib * 2**30) // per_copy))
            weights = make_weights(model, dtype, copies)
            print(f"{dtype} {name}: E={model.experts} K={model.k} N={model.n} top-{model.topk}, "
                  f"{copies} weight cop{'y' if copies == 1 else 'ies'}"
                  + (f" ({HELD} per-expert: int8 _int_mm on the int4 values held as int8)" if dtype == "a8w4" else ""),
                  flush=True)
            for tokens in args.tokens:
                for routing in args.routing:
                    r = bench_point(dtype, name, model, tokens, routing, weights, kernels, ctx)
                    attach_a8w8(rows, r)
                    rows.append(r)
                    held = HELD if dtype == "a8w4" else ""
                    a8w8 = (f"  A8W8/A8W4 {fmt(a8w8_ratio(r), 2, 'x')} (A8W8 {fmt(r.get('a8w8'))} µs)"
                            if dtype in A8W4_ROWS else "")
                    print(f"  T={tokens:5d} {routing:7s} M={r['m']:6d} act={r['active']:3d} R={r['rotations']}  "
                          f"per-expert{held} {fmt(r.get('per_expert')):>8s}  grouped {fmt(r.get('grouped')):>8s}  "
                          f"gemmgen {fmt(r['gemmgen']):>7s} [{r['dispatched']}]  "
                          + (f"rules {fmt(r.get('rules')):>7s} [{r['rules_kernel']}]  "
                             if r.get("rules_kernel") not in (None, r["dispatched"]) else "")
                          + (f"rules-from {fmt(r.get('rules_from')):>7s} [{r['rules_from_kernel']}]  "
                             if "rules_from_kernel" in r else "")
                          + f"best {fmt(r.get('best')):>7s} "
                          f"[{r.get('best_kernel', '-')}]  unfused/fused {fmt(fused_gain(r), 2, 'x')}  "
                          f"floor {fmt(r['floor']):>7s} µs{a8w8}"
                          + (f"  ({'; '.join(r['notes'])})" if r["notes"] else ""), flush=True)
                    if args.show_kernels:
                        for kernel, us in sorted(r["kernel_us"].items(), key=lambda item: item[1]):
                            print(f"      {fmt(us):>8s} µs  {kernel}", flush=True)
            del weights
            torch.cuda.empty_cache()
    meta = {"device": device, "bandwidth": bandwidth, "l2": l2, "seconds": time.perf_counter() - started,
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "command": shlex.join(["python", *sys.argv])}
    text = report(rows, args, meta)
    print("\n" + text)
    if args.markdown:
        with open(args.markdown, "a") as handle:
            handle.write("\n" + text)
        print(f"appended to {args.markdown}")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
        print(f"rows written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
