"""GPU timing of candidate kernels, generic over op families: candidates and their knobs,
CUDA-event timing, and the append-only measurement store that lets an interrupted tune resume.
Each family's tuner hooks (e.g. gemmgen/families/w8a8/tuning.py) build a problem's inputs and
call one candidate.

How a time is taken (the same for every candidate of a problem):
- inputs: the family builds one pool of operands per problem, larger than twice the L2 cache
  and rotated call by call, so no candidate reads its operands from a warm L2; full-range
  random data seeded from the problem, so every candidate — and every run — sees the same data;
- host hidden: `torch.cuda._sleep` queues GPU work first, so all calls are enqueued while the
  GPU is busy and then run back to back; the events measure GPU time only;
- a warm-up batch, then `repeats` batches sized to ~300 µs of GPU time; the median per-call time;
- clocks are left as found (no locking): the tune measures what the application will see.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..bindings.library import Kernel
from ..errors import GemmgenError
from ..generator.kernel_config import RuntimeKnobs

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


def graph_time_us(call: Callable[[int], None], pool_size: int, repeats: int = 7,
                  stream: torch.cuda.Stream | None = None) -> tuple[float, str]:
    """(median per-call GPU time of `call(0 .. pool_size - 1)` captured in one CUDA graph and
    replayed, "graph"), as an application that runs its decode steps in graphs sees it (the
    launches of a call's kernels and their programmatic dependent launch as replayed); eager
    `gpu_time_us` and "eager (<exception>)" when the calls cannot be captured (e.g. a host sync).
    """
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream (workspaces, attributes)
        for i in range(pool_size):
            call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, stream=stream):
            for i in range(pool_size):
                call(i)
    except Exception as exc:  # noqa: BLE001 - capture refused: time the calls eagerly
        torch.cuda.synchronize()
        return gpu_time_us(call, pool_size, repeats), f"eager ({type(exc).__name__})"
    # the graph (and its memory pool) is freed on return
    return gpu_time_us(lambda _: graph.replay(), 1, repeats) / pool_size, "graph"


@dataclass(frozen=True)
class Record:
    """One stored measurement: `us` is None when the candidate could not run (`error` says why)."""

    cls: tuple[str, ...]  # the dispatch class measured, e.g. (op, a, d, epilogue)
    n: int
    k: int
    m: int
    kernel: str
    raster: str
    swizzle: int
    split_k: int
    us: float | None
    error: str | None = None
    settled: bool = False  # re-timed side by side with the other near-ties of its point

    @property
    def key(self) -> tuple:
        return (self.cls, self.n, self.k, self.m, self.candidate)

    @property
    def candidate(self) -> Candidate:
        return Candidate(self.kernel, self.raster, self.swizzle, self.split_k)


class Store:
    """Append-only JSON-lines measurements; reopening it resumes (what was measured is not re-run;
    what failed is tried again).

    Several processes (one per GPU) write their own files `<stem>.<part>.jsonl`; `load` reads
    them all. A gzipped store (`.jsonl.gz`, as benchmarks/data/ keeps them) is read, not extended.
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
            text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
            for line in text.splitlines():
                try:
                    fields = json.loads(line)
                    record = Record(**{**fields, "cls": tuple(fields["cls"])})
                except (ValueError, TypeError, KeyError):
                    continue  # a line cut short by an interrupted run
                if record.us is not None:  # failures (e.g. out of memory) are retried on resume
                    self.records[record.key] = record

    def get(self, cls: tuple[str, ...], n: int, k: int, m: int, c: Candidate) -> Record | None:
        return self.records.get((tuple(cls), n, k, m, c))

    def put(self, record: Record) -> None:
        if self.file.suffix == ".gz":
            raise GemmgenError(f"{self.file}: a gzipped measurement store is read-only; gunzip it to add "
                               "measurements to it")
        self.records[record.key] = record
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a") as handle:
            handle.write(json.dumps(asdict(record)) + "\n")  # closed = flushed: survives a kill

    def times(self, cls: tuple[str, ...],
              shapes: Iterable[tuple[int, int]] | None = None) -> dict[tuple, dict[Candidate, float]]:
        """{(n, k, m): {candidate: µs}} of one class (inf where a candidate could not run)."""
        wanted = set(shapes) if shapes is not None else None
        cls = tuple(cls)
        result: dict[tuple, dict[Candidate, float]] = {}
        for r in self.records.values():
            if r.cls == cls and (wanted is None or (r.n, r.k) in wanted):
                result.setdefault((r.n, r.k, r.m), {})[r.candidate] = math.inf if r.us is None else r.us
        return result
