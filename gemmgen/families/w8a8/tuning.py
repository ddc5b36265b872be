"""How the tuner measures the W8A8 family: the problem classes it tunes, seeded inputs for one
problem, one timed call of a candidate, and which run-time knobs are worth trying."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from ...errors import GemmgenError
from ...generator.kernel_config import RASTER_ORDERS, SWIZZLES
from ...tuning.measure import Candidate, gpu_time_us
from . import ops

TORCH_DTYPES = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16,
                "fp16": torch.float16}
SPLIT_K_SLICES = (1, 2, 4, 8)


@dataclass
class Problem:
    """One problem's inputs: a pool of operand pairs to rotate through, shared scales/bias/out."""

    pool: list[tuple[torch.Tensor, torch.Tensor]]
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    bias: torch.Tensor | None
    out: torch.Tensor


def classes(built: set[tuple[str, ...]], options) -> list[tuple[str, ...]]:
    """The dispatch classes to measure: one epilogue and output dtype (`--epilogue`,
    `--out-dtype`) per input dtype (`--dtypes`, default every one built); the others use the
    same configs' kernels."""
    dtypes = options.dtypes or sorted({key[1] for key in built})
    wanted = [("scaled_mm", a, options.out_dtype, options.epilogue) for a in dtypes]
    missing = [c[1:] for c in wanted if c not in built]
    if missing:
        raise GemmgenError(f"builds no kernel for {missing}; it builds "
                           f"{sorted(key[1:] for key in built)}")
    return wanted


def autotune_options(key: tuple[str, ...]):
    """Tune options that measure exactly dispatch class `key` (tuning at first use)."""
    from ...tuning.tune import TuneOptions
    _, a, d, epilogue = key
    return TuneOptions(shapes=[], m_grid=(), dtypes=(a,), out_dtype=d, epilogue=epilogue)


def make_problem(cls: tuple[str, ...], m: int, n: int, k: int, *, seed: int = 0,
                 l2_bytes: int | None = None, shape=None) -> Problem:
    """Seeded inputs for (m, n, k): per-token scale_a, per-channel scale_b, a bias if the
    epilogue takes one; enough operand pairs to exceed twice the L2 (2..64 pairs); full-range
    random data (int8 uniform over [-128, 127], e4m3 from a normal)."""
    _, a, d, epilogue = cls
    l2 = l2_bytes or torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    per_pair = m * k + n * k
    count = max(2, min(64, math.ceil(2 * l2 / per_pair) + 1))
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{seed}:{a}:{m}:{n}:{k}".encode()))
    dtype = TORCH_DTYPES[a]
    pool = []
    for _ in range(count):
        if dtype == torch.int8:
            x = torch.randint(-128, 128, (m, k), dtype=dtype, device="cuda", generator=gen)
            w = torch.randint(-128, 128, (n, k), dtype=dtype, device="cuda", generator=gen)
        else:
            x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
            w = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
        pool.append((x, w.t()))
    out_dtype = TORCH_DTYPES[d]
    scale_a = torch.rand(m, 1, device="cuda", generator=gen) * 1e-2 + 1e-3
    scale_b = torch.rand(1, n, device="cuda", generator=gen) * 1e-2 + 1e-3
    bias = (torch.randn(n, device="cuda", generator=gen).to(out_dtype)
            if epilogue == "ScaledEpilogueBias" else None)
    return Problem(pool, scale_a, scale_b, bias, torch.empty(m, n, dtype=out_dtype, device="cuda"))


def time_candidate(candidate: Candidate, problem: Problem) -> float:
    """GPU µs per call of one candidate on one problem; raises KernelLaunchError if it cannot
    implement the problem."""
    p = problem
    knobs = candidate.knobs

    def call(i: int) -> None:
        a, b = p.pool[i]
        ops._scaled_mm_out_impl(p.out, a, b, p.scale_a, p.scale_b, p.bias, None, None,
                                candidate.kernel, None, knobs.split_k_slices, knobs)
    return gpu_time_us(call, len(p.pool))


def knob_variants(kernel) -> list[Candidate]:
    """Every run-time knob setting worth trying for a kernel, its manifest default first.

    sm90: raster order × swizzle size. sm80 with split-K: the K slice counts. Otherwise none.
    """
    default = Candidate.of(kernel)
    variants = [default]
    if kernel.spec.arch == "sm90a":
        variants += [Candidate(kernel.name, r, s) for r in RASTER_ORDERS for s in SWIZZLES]
    elif kernel.spec.split_k:
        variants += [Candidate(kernel.name, split_k=s) for s in SPLIT_K_SLICES]
    seen: set[Candidate] = set()
    return [c for c in variants if not (c in seen or seen.add(c))]


def output_tiles(kernel, m: int, n: int) -> int:
    """CTA tiles of the output (swap-AB kernels tile Dᵀ)."""
    tile_m, tile_n = kernel.config.tile[0], kernel.config.tile[1]
    rows, cols = (n, m) if kernel.config.swap_ab else (m, n)
    return math.ceil(rows / tile_m) * math.ceil(cols / tile_n)


def knobs_worth_trying(kernel, m: int, n: int, sm_count: int) -> bool:
    """Raster order and swizzle only matter past one wave of tiles; split-K only pays while the
    tiles leave SMs idle."""
    many_waves = output_tiles(kernel, m, n) > sm_count
    return many_waves if kernel.spec.arch == "sm90a" else not many_waves
