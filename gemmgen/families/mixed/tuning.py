"""How the tuner measures the mixed-input family: the classes it tunes, seeded inputs for one
problem (a pool of random packed weights larger than twice the L2), one timed call of a
candidate, and which run-time knobs are worth trying."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from ...generator.kernel_config import RASTER_ORDERS, SWIZZLES
from ...tuning.measure import Candidate, gpu_time_us
from . import ops
from .configs import G32_GROUP, WEIGHT_TYPES_FOR_KERNEL, scheme_group_k, scheme_has_zero
from .packing import Sm90Layout

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# the plain weight type of each kernel class (int4, uint4, int8; the `_g32` schemes alike)
WEIGHT_TYPE_FOR = {key: types[0] for key, types in WEIGHT_TYPES_FOR_KERNEL.items()}
SPLIT_K_SLICES = (1, 2, 4, 8)
# the wgmma kernel's K split (its cluster size) forced, beside its launch-time choice (1): every
# size, since neighbours differ by up to 1.5x (H200, 32 tokens, session 18: 4096 x 14336 takes
# 19.7 us at 7, 29.3 at 4, 24.3 at the launch-time 3)
WGMMA_SPLITS = (2, 3, 4, 5, 6, 7, 8)
GROUP_SIZE = 128


@dataclass
class Problem:
    """A pool of (activations, packed weight tensors) to rotate through, and the output."""

    pool: list[tuple]
    weight_type: str
    group_size: int
    n: int
    k: int
    out: torch.Tensor


def classes(built: set[tuple[str, ...]], options) -> list[tuple[str, ...]]:
    """Every built (mixed_mm, a, w, scheme) class, filtered by `--dtypes` (activation dtypes)."""
    return sorted(c for c in built if not options.dtypes or c[1] in options.dtypes)


def make_problem(cls: tuple[str, ...], m: int, n: int, k: int, *, seed: int = 0,
                 l2_bytes: int | None = None, shape=None) -> Problem:
    """Full-range random packed weights (every nibble/byte value occurs), scales in
    [1e-3, 1e-2], zeros for the zero-point scheme; group size 128 (K if K < 128), or 32 for
    the `_g32` schemes."""
    _, a, w, scheme = cls
    dtype = TORCH_DTYPES[a]
    group = (G32_GROUP if scheme_group_k(scheme) == G32_GROUP
             else GROUP_SIZE if k % GROUP_SIZE == 0 else k)
    l2 = l2_bytes or torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    weight_bytes = n * k // (2 if w == "int4" else 1)
    per_item = weight_bytes + 2 * m * k
    count = max(2, min(64, math.ceil(2 * l2 / per_item) + 1))
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{seed}:{cls}:{m}:{n}:{k}".encode()))
    _, q_shape = Sm90Layout.qweight_spec(WEIGHT_TYPE_FOR[(w, scheme)], n, k)
    pool = []
    for _ in range(count):
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        if w == "int4":  # random bytes in the packed layout's shape: every nibble value occurs
            q = torch.randint(0, 256, q_shape, dtype=torch.uint8, device="cuda", generator=gen)
        else:
            q = torch.randint(-128, 128, q_shape, dtype=torch.int8, device="cuda", generator=gen)
        scales = (torch.rand(k // group, n, device="cuda", generator=gen) * 9e-3 + 1e-3).to(dtype)
        zeros = ((torch.rand(k // group, n, device="cuda", generator=gen) - 0.5) * 0.1).to(dtype) \
            if scheme_has_zero(scheme) else None
        pool.append((x, q, scales, zeros))
    out = torch.empty(m, n, dtype=dtype, device="cuda")
    return Problem(pool, WEIGHT_TYPE_FOR[(w, scheme)], group, n, k, out)


def time_candidate(candidate: Candidate, problem: Problem) -> float:
    p = problem
    knobs = candidate.knobs

    def call(i: int) -> None:
        x, q, scales, zeros = p.pool[i]
        ops._mixed_mm_out_impl(p.out, x, q, scales, zeros, None, p.weight_type, p.group_size,
                               p.n, p.k, candidate.kernel, knobs=knobs)
    return gpu_time_us(call, len(p.pool))


def knob_variants(kernel) -> list[Candidate]:
    """The manifest default first; raster × swizzle; split counts for stream-K kernels. The
    family's own kernels have no tile scheduler: the direct kernel its default only, the wgmma
    kernel its K split's cluster sizes too."""
    variants = [Candidate.of(kernel)]
    if kernel.spec.config.is_direct:
        return variants
    if kernel.spec.config.is_wgmma:
        return variants + [Candidate(kernel.name, split_k=s) for s in WGMMA_SPLITS]
    variants += [Candidate(kernel.name, r, s) for r in RASTER_ORDERS for s in SWIZZLES]
    if kernel.spec.split_k:
        variants += [Candidate(kernel.name, split_k=s) for s in SPLIT_K_SLICES]
    seen: set[Candidate] = set()
    return [c for c in variants if not (c in seen or seen.add(c))]


def knobs_always_tried(kernel, m: int, n: int, sm_count: int) -> bool:
    """Kernels whose knob settings are timed even when their first pass (launch-time knobs) is
    not among the fastest: the wgmma kernel up to four token tiles, whose launch-time K split is
    up to 1.5x off its best on some shapes (10240 x 8192 at 32 tokens: 38.2 us against 25.1 at
    a split of 3, where the direct kernel takes 36.6; H200, session 18)."""
    config = kernel.spec.config
    return config.is_wgmma and m <= 4 * config.tile[1]


def retime_window(m: int) -> float | None:
    """Up to 16 tokens, every candidate within 15% of the fastest is re-timed side by side: one
    pass times the candidates of a point one after another, and at few tokens the kernels are
    short and the first pass moved by more than the tie window. Session 19's tunes timed every
    kernel 4-12% slower (median) at one token than at four, where the benchmark times them level,
    and up to 1.39x for the direct kernel, so its tables sent 5120 x 25600 at one token (AWQ) to
    the wgmma kernel: 45.8 us in the benchmark against the rules' direct kernel at 35.2 (H100)."""
    return 0.15 if m <= 16 else None


def output_tiles(kernel, m: int, n: int) -> int:
    tile_m, tile_n = kernel.config.tile[0], kernel.config.tile[1]
    return math.ceil(n / tile_m) * math.ceil(m / tile_n)


def knobs_worth_trying(kernel, m: int, n: int, sm_count: int) -> bool:
    if kernel.spec.config.is_direct:
        return False  # no raster, swizzle or split knobs
    if kernel.spec.config.is_wgmma:
        return True  # the K split's cluster size
    return kernel.spec.split_k or output_tiles(kernel, m, n) > sm_count
