"""GPU timing of candidate kernels: candidates and their knobs, input pools, CUDA-event timing,
and the append-only measurement store that lets an interrupted tune resume.

How a time is taken (the same for every candidate of a problem):
- inputs: one pool of (a, b) pairs per problem, larger than twice the L2 cache and rotated call
  by call, so no candidate reads its operands from a warm L2; full-range random data (int8
  uniform over [-128, 127], e4m3 from a normal) seeded from the problem, so every candidate —
  and every run — sees the same data;
- host hidden: `torch.cuda._sleep` queues GPU work first, so all calls are enqueued while the
  GPU is busy and then run back to back; the events measure GPU time only;
- a warm-up batch, then `repeats` batches sized to ~300 µs of GPU time; the median per-call time;
- clocks are left as found (no locking): the tune measures what the application will see.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..bindings import ops
from ..bindings.library import Kernel
from ..generator.kernel_config import RASTER_ORDERS, SWIZZLES, RuntimeKnobs

TORCH_DTYPES = {"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16,
                "fp16": torch.float16}
SPLIT_K_SLICES = (1, 2, 4, 8)
_TARGET_SAMPLE_US = 300.0


@dataclass(frozen=True, order=True)
class Candidate:
    """A kernel with the run-time knobs to call it with."""

    kernel: str
    raster: str = "heuristic"
    swizzle: int = 1
    split_k: int = 1

    @property
    def knobs(self) -> RuntimeKnobs:
        return RuntimeKnobs(self.raster, self.swizzle, self.split_k)

    @staticmethod
    def of(kernel: Kernel, knobs: RuntimeKnobs | None = None) -> "Candidate":
        knobs = knobs or kernel.spec.knobs
        return Candidate(kernel.name, knobs.raster, knobs.swizzle, knobs.split_k_slices)

    def label(self) -> str:
        extra = f"/sk{self.split_k}" if self.split_k != 1 else ""
        return f"{self.kernel}[{self.raster},{self.swizzle}{extra}]"


def knob_variants(kernel: Kernel) -> list[Candidate]:
    """Every run-time knob setting worth trying for a kernel, its manifest default first.

    sm90: raster order × swizzle size. sm80 with split-K: the K slice counts. Otherwise none.
    """
    default = Candidate.of(kernel)
    variants = [default]
    if kernel.spec.arch == "sm90a":
        variants += [Candidate(kernel.name, r, s) for r in RASTER_ORDERS for s in SWIZZLES]
    elif getattr(kernel.config, "split_k", "none") != "none":
        variants += [Candidate(kernel.name, split_k=s) for s in SPLIT_K_SLICES]
    seen: set[Candidate] = set()
    return [c for c in variants if not (c in seen or seen.add(c))]


def output_tiles(kernel: Kernel, m: int, n: int) -> int:
    """CTA tiles of the output (swap-AB kernels tile Dᵀ)."""
    tile_m, tile_n = kernel.config.tile[0], kernel.config.tile[1]
    rows, cols = (n, m) if kernel.config.swap_ab else (m, n)
    return math.ceil(rows / tile_m) * math.ceil(cols / tile_n)


@dataclass
class Problem:
    """One problem's inputs: a pool of operand pairs to rotate through, shared scales/bias/out."""

    pool: list[tuple[torch.Tensor, torch.Tensor]]
    scale_a: torch.Tensor
    scale_b: torch.Tensor
    bias: torch.Tensor | None
    out: torch.Tensor


def make_problem(a: str, d: str, epilogue: str, m: int, n: int, k: int, *, seed: int = 0,
                 l2_bytes: int | None = None) -> Problem:
    """Seeded inputs for (m, n, k): per-token scale_a, per-channel scale_b, a bias if the
    epilogue takes one; enough operand pairs to exceed twice the L2 (2..64 pairs)."""
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


def gpu_time_us(call: Callable[[int], None], pool_size: int, repeats: int = 7) -> float:
    """Median per-call GPU time of `call(i)` (i rotates the input pool), host hidden.

    One spin kernel covers the host's enqueue time of everything that follows, so the GPU then
    runs a warm-up batch and `repeats` timed batches back to back, as in a model's forward pass
    (the first scheme, a spin before each short batch, measured the cooperative 128x256 kernel
    5-15% below its back-to-back speed in benchmarks/bench_scaled_mm.py).
    """
    host_start = time.perf_counter()
    for i in range(2):
        call(i % pool_size)
    host_us = (time.perf_counter() - host_start) * 1e6 / 2
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    call(2 % pool_size)
    end.record()
    end.synchronize()
    first_us = max(start.elapsed_time(end) * 1000.0, 1.0)
    batch = max(1, min(64, math.ceil(_TARGET_SAMPLE_US / first_us)))
    calls = batch * (repeats + 1)
    # spin for 1.5x the host's enqueue time of all calls (as measured on the warm-up; at most
    # 0.2 s), counted in cycles at ~2 GHz
    torch.cuda._sleep(int(min(calls * max(host_us, 10.0) * 1.5e-6, 0.2) * 2e9))
    events = [torch.cuda.Event(enable_timing=True) for _ in range(repeats + 1)]
    index = 0
    for r in range(-1, repeats):  # batch -1 warms up, untimed
        for _ in range(batch):
            call(index % pool_size)
            index += 1
        events[r + 1].record()
    torch.cuda.synchronize()
    return statistics.median(events[r].elapsed_time(events[r + 1]) * 1000.0 / batch
                             for r in range(repeats))


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


@dataclass(frozen=True)
class Record:
    """One stored measurement: `us` is None when the candidate could not run (`error` says why)."""

    a: str
    d: str
    epilogue: str
    n: int
    k: int
    m: int
    kernel: str
    raster: str
    swizzle: int
    split_k: int
    us: float | None
    error: str | None = None

    @property
    def key(self) -> tuple:
        return (self.a, self.d, self.epilogue, self.n, self.k, self.m, self.candidate)

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.kernel, self.raster, self.swizzle, self.split_k)


class Store:
    """Append-only JSON-lines measurements; reopening it resumes (what was measured is not re-run;
    what failed is tried again).

    Several processes (one per GPU) write their own files `<stem>.<part>.jsonl`; `load` reads
    them all.
    """

    def __init__(self, path: Path, part: str | None = None):
        self.path = Path(path)
        self.file = self.path if part is None else self.path.with_suffix(f".{part}.jsonl")
        self.records: dict[tuple, Record] = {}
        self.load()

    def siblings(self) -> list[Path]:
        return sorted({self.path, *self.path.parent.glob(self.path.stem + ".*.jsonl")})

    def load(self) -> None:
        for path in self.siblings():
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                try:
                    record = Record(**json.loads(line))
                except (ValueError, TypeError):
                    continue  # a line cut short by an interrupted run
                if record.us is not None:  # failures (e.g. out of memory) are retried on resume
                    self.records[record.key] = record

    def get(self, a: str, d: str, epilogue: str, n: int, k: int, m: int, c: Candidate) -> Record | None:
        return self.records.get((a, d, epilogue, n, k, m, c))

    def put(self, record: Record) -> None:
        self.records[record.key] = record
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a") as handle:
            handle.write(json.dumps(asdict(record)) + "\n")  # closed = flushed: survives a kill

    def times(self, a: str, d: str, epilogue: str,
              shapes: Iterable[tuple[int, int]] | None = None) -> dict[tuple, dict[Candidate, float]]:
        """{(n, k, m): {candidate: µs}} of one class (inf where a candidate could not run)."""
        wanted = set(shapes) if shapes is not None else None
        result: dict[tuple, dict[Candidate, float]] = {}
        for r in self.records.values():
            if (r.a, r.d, r.epilogue) == (a, d, epilogue) and (wanted is None or (r.n, r.k) in wanted):
                result.setdefault((r.n, r.k, r.m), {})[r.candidate] = math.inf if r.us is None else r.us
        return result
