"""How the tuner measures the MoE family: the classes it tunes, seeded inputs for one point (an
expert layer's weights and two routed batches of the same rows), one timed call of a candidate,
and its knobs.

A point's m is the rows M of x (the `rows` dispatch variable; tables bucket over it), its (n, k)
the layer's weight shape; the layer's experts and top-k come from the shape file (`experts`,
`top_k`, manifests/shapes/moe_*.yaml). The batch is T = max(1, m // top_k) tokens (T · top_k rows),
routed twice, as bench_moe.py routes its batches (the same odds, not the same draws): each token
to top-k distinct experts drawn uniformly, and drawn with Zipf-skewed odds (a few hot experts, as
trained routers give). A candidate's time is the mean of the two batches' times, so a table's
kernel holds up on both kinds of batch (measured on uniform batches alone, the session 15 tables
lost to the rules on skewed ones). The scales keep C, the dequantized GEMM, of order one, as a
model's pre-activations are: the fused kernels' time depends on the values (session 47). The
store's file name carries MEASURE_METHOD, so a store timed another way (on uniform batches alone,
or on the earlier scales) is not resumed as one of these.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from ...errors import GemmgenError
from ...tuning.measure import Candidate, graph_time_us
from ...tuning.shapes import MOE_M_GRID as MOE_ROWS
from . import ops
from .packing import pack_moe_weights

TORCH_DTYPES = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn}
GROUP_SIZE = 128  # per-group A8W4: the checkpoints' common group
ROUTINGS = ("uniform", "skewed")  # the batches a point is timed on
MEASURE_METHOD = "uniform+skewed-unitc"  # in the store's file name (gemmgen/tuning/tune.py: store_path)
# The standard deviation of full-range random values of each kind (int8 -128..127, int4 -8..7, e4m3
# from a unit normal): scales of U(0.5, 1.5) / (std · K^¼) on both sides give C a standard
# deviation of order one.
VALUE_STD = {"int8": 74.0, "e4m3": 1.0, "int4": 4.64}


def unit_output_scales(shape: tuple[int, ...], k: int, kind: str, *,
                       generator: torch.Generator | None = None, device: str = "cuda") -> torch.Tensor:
    """float32 scales for `kind` values (x's or the weights') that, with the other side's, keep C
    = Σ_K x·w·sx·sw of order one. The first tables' scales, U(0.005, 0.015) on both sides, gave
    int8 layers C of ±10^2 and more (Mixtral-8x7B: a row's max |S| near 13000), on which the
    fused 64x256 int8 kernel ran 18-21% slower than on C of order one (the same int8 x and weights,
    only the scales differing: 366 against 302 µs at 512 rows, H200, benchmarks/RESULTS.md session
    47); the tuner picked the unfused tile where the fused one is 10% faster."""
    u = torch.rand(shape, device=device, generator=generator)
    return (u + 0.5) / (VALUE_STD[kind] * k ** 0.25)


@dataclass
class Problem:
    """Weight copies and routed batches to rotate through, and the outputs."""

    pool: list[tuple]  # (x, x_scale, weight, weight_scale): weights shared between items
    group_lists: dict[str, torch.Tensor]  # by routing (ROUTINGS): the same rows, other experts
    weight_bits: int
    q: torch.Tensor
    q_scale: torch.Tensor


def tokens_for(m: int, top_k: int) -> int:
    """The tokens of the batch measured for m rows: the most whole tokens whose rows fit, and
    one token (top-k rows) below that."""
    return max(1, m // top_k)


def routing_counts(tokens: int, experts: int, top_k: int, seed: int,
                   routing: str = "uniform") -> list[int]:
    """Rows per expert: each token picks top_k distinct experts (seeded), all equally likely
    (`uniform`) or expert i with odds 1 / (i + 1) (`skewed`, Zipf)."""
    if routing not in ROUTINGS:
        raise ValueError(f"routing: expected one of {', '.join(ROUTINGS)}, got {routing!r}")
    gen = torch.Generator().manual_seed(seed)
    odds = (torch.ones(experts) if routing == "uniform"
            else 1.0 / torch.arange(1, experts + 1, dtype=torch.float32))
    picks = torch.multinomial(odds.repeat(tokens, 1), top_k, replacement=False, generator=gen)
    return torch.bincount(picks.flatten(), minlength=experts).tolist()


def accepts_shape(shape) -> bool:
    """Expert layers only (their shape files name experts and top_k)."""
    return shape.experts > 0


M_GRID = MOE_ROWS  # a tune's rows grid without --m: every point dispatch rounds rows to


def check_m_grid(m_grid) -> str | None:
    """Dispatch rounds rows up to the family's row grid (`rows_key`) before it reads a table, so
    a table's buckets must end on that grid's points: a point off it (4, say, between 2 and 6)
    would make a bucket that rows 3-4 never reach (they look up 6)."""
    from . import rows_key
    off = [m for m in m_grid if rows_key(m) != m]
    if not off:
        return None
    return (f"the MoE family's dispatch rounds rows up to its grid ({', '.join(map(str, MOE_ROWS))}, "
            f"then multiples of {MOE_ROWS[-1]}), so a table's row buckets must end on it; "
            f"{', '.join(map(str, off))} {'is' if len(off) == 1 else 'are'} not on it "
            f"(rounded: {', '.join(str(rows_key(m)) for m in off)})")


def grid_for(shape, m_grid) -> list[int]:
    """The grid's row counts a batch of the layer can have: one token's top-k rows at least."""
    return [m for m in m_grid if m >= shape.top_k]


# `--dtypes` names of one class each, as bench_moe.py names its rows: (x, w, scales)
CLASS_NAMES = {"a8w8": ("int8", "int8", "channel"), "a8w4": ("int8", "int4", "channel"),
               "a8w4g": ("int8", "int4", "group")}


def classes(built: set[tuple[str, ...]], options) -> list[tuple[str, ...]]:
    """Every built (op, x, w, scales) class, filtered by `--dtypes`: an x dtype (int8, e4m3)
    selects every class of that x; a8w8, a8w4, a8w4g one class (e.g. after adding per-channel
    A8W4 configs, re-tune that class alone)."""
    if not options.dtypes:
        return sorted(built)
    named = {CLASS_NAMES[d] for d in options.dtypes if d in CLASS_NAMES}
    return sorted(c for c in built if c[1] in options.dtypes or tuple(c[1:4]) in named)


def make_problem(cls: tuple[str, ...], m: int, n: int, k: int, *, seed: int = 0,
                 l2_bytes: int | None = None, shape=None) -> Problem:
    """Full-range random weights (int8 -128..127, int4 -8..7, e4m3 from a normal), scales that
    keep C of order one (unit_output_scales; per group of 128 for a per-group class); one batch
    of rows a pool item, with a group list for each routing, and enough weight copies (up to 16)
    that one pass over the pool reads more than twice the L2 under either routing (as
    bench_moe.py: a decode step's few experts would otherwise stay in the L2)."""
    _, x_name, w_name, scales = cls
    experts, top_k = (shape.experts, shape.top_k) if shape is not None else (0, 0)
    if experts < 1:
        raise GemmgenError(f"the shape {getattr(shape, 'name', '?')} ({getattr(shape, 'origin', '?')}) "
                           "names no experts and top_k: the MoE tuner needs an expert layer's "
                           "(manifests/shapes/moe_*.yaml)")
    if scales == "group" and (k % GROUP_SIZE or k // GROUP_SIZE < 2):
        raise GemmgenError(f"per-group scales of {GROUP_SIZE} need K a multiple of {GROUP_SIZE} "
                           f"with two groups or more; got K = {k}")
    l2 = l2_bytes or torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    bits = 4 if w_name == "int4" else 8
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{seed}:{cls}:{m}:{n}:{k}".encode()))
    tokens = tokens_for(m, top_k)
    counts = {routing: routing_counts(tokens, experts, top_k,
                                      zlib.crc32(f"{seed}:{tokens}:{experts}".encode()), routing)
              for routing in ROUTINGS}
    rows = tokens * top_k
    # weight copies: a call reads its active experts' weights only (a decode step: top-k of
    # them), so enough copies that rotating through them reads more than twice the L2
    active = min(sum(1 for c in per_expert if c) for per_expert in counts.values())
    copies = max(1, min(16, math.ceil(2 * l2 / (active * n * k * bits // 8))))
    weights = []
    for _ in range(copies):
        if w_name == "int4":
            w = torch.randint(-8, 8, (experts, k, n), dtype=torch.int8, device="cuda", generator=gen)
        elif w_name == "int8":
            w = torch.randint(-128, 128, (experts, k, n), dtype=torch.int8, device="cuda", generator=gen)
        else:
            w = torch.randn(experts, k, n, dtype=torch.bfloat16, device="cuda",
                            generator=gen).to(torch.float8_e4m3fn)
        groups = (k // GROUP_SIZE,) if scales == "group" else ()
        s = unit_output_scales((experts, *groups, n), k, w_name, generator=gen)
        packed = pack_moe_weights(w, s, weight_bits=bits)
        del w
        weights.append((packed.weight, packed.scale))
    pool = []
    for i in range(max(2, copies)):
        if x_name == "int8":
            x = torch.randint(-128, 128, (rows, k), dtype=torch.int8, device="cuda", generator=gen)
        else:
            x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda",
                            generator=gen).to(torch.float8_e4m3fn)
        x_scale = unit_output_scales((rows,), k, x_name, generator=gen)
        pool.append((x, x_scale, *weights[i % copies]))
    group_lists = {routing: torch.tensor(c, dtype=torch.int64, device="cuda")
                   for routing, c in counts.items()}
    q = torch.empty(rows, n // 2, dtype=TORCH_DTYPES[x_name], device="cuda")
    q_scale = torch.empty(rows, dtype=torch.float32, device="cuda")
    return Problem(pool, group_lists, bits, q, q_scale)


def time_candidate(candidate: Candidate, problem: Problem) -> float:
    """µs per call, the mean over the routings' batches, the pool's calls replayed from a CUDA
    graph as bench_moe.py times them (and as engines run decode): a decode step's three launches
    cost what they cost in a graph."""
    p = problem
    knobs = candidate.knobs
    times = []
    for group_list in p.group_lists.values():
        def call(i: int, group_list=group_list) -> None:
            x, x_scale, w, w_scale = p.pool[i]
            ops._gmm_swiglu_quant_out_impl(p.q, p.q_scale, x, w, w_scale, x_scale, group_list,
                                           "count", p.weight_bits, False, candidate.kernel, knobs)
        us, how = graph_time_us(call, len(p.pool))
        if how != "graph":  # the op is capturable: a failure is not a time to compare with others
            raise GemmgenError(f"{candidate.kernel}: its calls could not be captured in a CUDA "
                               f"graph ({how})")
        times.append(us)
    return sum(times) / len(times)


def retime_window(m: int) -> float | None:
    """Every candidate within 15% of the fastest is re-timed side by side, at any row count (the
    default window is 6%): one pass times a point's candidates one after another, up to a
    millisecond a call at thousands of rows, and a first-pass time drifts with the GPU's state.
    The first H200 table's e4m3 Mixtral-8x7B point at 2048 rows had `small` at 897.9 µs in its
    first pass, 10% behind `mid`; re-timed side by side it is still behind (824.2 vs 778.7), where
    bench_moe.py times it ahead (721.5 / 762.9 µs uniform / skewed against 731.8 / 865.0): the
    swap-AB pingpong e4m3 kernel slows by up to 12% while the GPU stays busy, which a minutes-long
    tune sees and a benchmark row does not (benchmarks/RESULTS.md, session 20)."""
    return 0.15


def knob_variants(kernel) -> list[Candidate]:
    """The manifest's knobs first; for a CUTLASS config that is not swap-AB, also the raster order
    it does not default to (schema.py: along M walks an expert's token tiles first, CUTLASS's
    heuristic along N; which one wins depends on the layer and the kernel). Swizzle is not tried:
    with its problem sizes on the device, CUTLASS's grouped scheduler sizes its swizzle from a
    host-side grid of the SM count by the cluster's N, so it does not swizzle unless the cluster
    spans N (no shipped config's does)."""
    default = Candidate.of(kernel)
    config = kernel.spec.config
    if config.is_own or config.swap_ab:
        return [default]
    other = "heuristic" if default.raster == "along_m" else "along_m"
    return [default, Candidate(kernel.name, other, default.swizzle, default.split_k)]


def knobs_worth_trying(kernel, m: int, n: int, sm_count: int) -> bool:
    """The tile order only matters when there are tiles to order: more than one wave of them."""
    tile_m, tile_n = kernel.spec.config.tile[0], kernel.spec.config.tile[1]
    return math.ceil(m / tile_m) * math.ceil(n / tile_n) > sm_count
