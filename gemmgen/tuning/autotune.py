"""Tuning at first use: the first call of a problem no tuned table lists times the candidates
and records the winner for every later call and process.

Opt-in, with `gemmgen.autotune()` (a context manager) or GEMMGEN_AUTOTUNE=1 (read when gemmgen is
imported, and again by `gemmgen.reload()`). While on, the
first call of a new (dispatch class, N, K, M bucket) whose (N, K) the GPU's tuned table does not
list times every kernel of the class the way `gemmgen tune` does (same inputs, same method, same
store, so `gemmgen tune` later reuses the times) at that M, picks the winner with the tuner's
tie rule, and appends it to the library's cache for this GPU:

    <build dir>/<library>/autotune/<gpu>-<SMs>sm.jsonl

one JSON line per record, written with one append (O_APPEND, a few hundred bytes), so several
processes may share the file: a reader skips a line it cannot parse, and of two records of one
problem the later wins. Dispatch reads the cache whether or not autotuning is on (a later
process times nothing): its records come first in the lookup chain. M buckets are the tuner's
default M grid: a winner measured at m serves every m of its bucket (the grid point at or
above m).

Never during CUDA graph capture or torch.compile tracing: the call takes the current choice and
the problem is recorded as pending; `gemmgen tune --from-cache` turns every shape the cache
holds, measured or pending, into a full tuned table.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, settings
from ..generator.kernel_config import RuntimeKnobs
from .shapes import DEFAULT_M_GRID
from .table import gpu_slug

ENV = "GEMMGEN_AUTOTUNE"
_enabled: contextvars.ContextVar[bool | None] = contextvars.ContextVar("gemmgen_autotune", default=None)
_lock = threading.Lock()


@contextlib.contextmanager
def autotune(enabled: bool = True):
    """`with gemmgen.autotune():` — calls inside time new problems at first use (see the module
    docstring); `autotune(False)` turns it off inside, whatever GEMMGEN_AUTOTUNE says."""
    token = _enabled.set(bool(enabled))
    try:
        yield
    finally:
        _enabled.reset(token)


def enabled() -> bool:
    """Whether calls made now tune at first use: the innermost `autotune()` context, else
    GEMMGEN_AUTOTUNE=1 (read at import and by `gemmgen.reload()`)."""
    state = _enabled.get()
    return _from_environment if state is None else state


def _read_environment() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


# Read at import and by gemmgen.reload(), not per call: os.environ.get costs ~1 µs, on the path
# of every op call.
_from_environment = _read_environment()


def m_bucket(m: int) -> int:
    """The tuner's M grid point at or above m (the largest for m past the grid)."""
    return next((g for g in DEFAULT_M_GRID if g >= m), DEFAULT_M_GRID[-1])


def cache_path(library_name: str, gpu: tuple[str, int]) -> Path:
    return settings.build_dir() / library_name / "autotune" / f"{gpu_slug(gpu[0])}-{gpu[1]}sm.jsonl"


@dataclass(frozen=True)
class Entry:
    """One cache record: a winner (kernel, knobs, µs at `m`), or a pending problem (`kernel`
    None, `why` says why it was not timed)."""

    key: tuple[str, ...]
    n: int
    k: int
    bucket: int
    m: int
    kernel: str | None = None
    knobs: RuntimeKnobs = RuntimeKnobs()
    us: float | None = None
    why: str | None = None
    line: int = 0


class Cache:
    """A library's records for one GPU, read once (`load`) and appended to (`add`)."""

    def __init__(self, path: Path):
        self.path = path
        self.winners: dict[tuple, Entry] = {}
        self.pending: dict[tuple, Entry] = {}
        self._state = None

    def load(self) -> "Cache":
        """(Re)read the file when it changed since the last read."""
        try:
            st = self.path.stat()
        except OSError:
            return self
        state = (st.st_size, st.st_mtime_ns)
        if state == self._state:
            return self
        self.winners.clear()
        self.pending.clear()
        for number, text in enumerate(self.path.read_text(errors="replace").splitlines(), 1):
            try:
                entry = _entry(json.loads(text), number)
            except (ValueError, TypeError, KeyError):
                continue  # a line cut short, or written by another version
            self._keep(entry)
        self._state = state
        return self

    def _keep(self, entry: Entry) -> None:
        where = (entry.key, entry.n, entry.k, entry.bucket)
        if entry.kernel is None:
            if where not in self.winners:
                self.pending[where] = entry
        else:
            self.winners[where] = entry
            self.pending.pop(where, None)

    def winner(self, key: tuple[str, ...], n: int, k: int, m: int) -> Entry | None:
        return self.winners.get((tuple(key), n, k, m_bucket(m)))

    def add(self, entry: Entry) -> None:
        """Append one record (one write on an O_APPEND descriptor: whole lines, also with other
        processes appending) and keep it."""
        record = {"class": list(entry.key), "n": entry.n, "k": entry.k, "m_bucket": entry.bucket,
                  "m": entry.m, "gemmgen": __version__,
                  "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        if entry.kernel is None:
            record.update(pending=True, why=entry.why)
        else:
            record.update(kernel=entry.kernel, raster=entry.knobs.raster, swizzle=entry.knobs.swizzle,
                          split_k=entry.knobs.split_k_slices, us=entry.us)
        data = (json.dumps(record) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._keep(entry)

    def shapes(self) -> dict[tuple[str, ...], set[tuple[int, int]]]:
        """Every (N, K) the cache holds per dispatch class, measured or pending."""
        found: dict[tuple[str, ...], set[tuple[int, int]]] = {}
        for key, n, k, _ in [*self.winners, *self.pending]:
            found.setdefault(key, set()).add((n, k))
        return found


def _entry(record: dict, line: int) -> Entry:
    key = tuple(str(v) for v in record["class"])
    n, k, bucket, m = (int(record[f]) for f in ("n", "k", "m_bucket", "m"))
    if record.get("pending"):
        return Entry(key, n, k, bucket, m, why=str(record.get("why", "")), line=line)
    knobs = RuntimeKnobs(str(record["raster"]), int(record["swizzle"]), int(record["split_k"]))
    return Entry(key, n, k, bucket, m, str(record["kernel"]), knobs, float(record["us"]), line=line)


_caches: dict[Path, Cache] = {}


def cache_for(library_name: str, gpu: tuple[str, int]) -> Cache:
    """The (memoized, re-read when the file changed) cache of a library on a GPU."""
    path = cache_path(library_name, gpu)
    with _lock:
        cache = _caches.get(path)
        if cache is None:
            cache = _caches[path] = Cache(path)
        return cache.load()


def clear() -> None:
    """Forget the caches read and read GEMMGEN_AUTOTUNE again (gemmgen.reload() calls this)."""
    global _from_environment
    with _lock:
        _caches.clear()
        _from_environment = _read_environment()


def not_now_reason() -> str | None:
    """Why no timing may happen now (CUDA graph capture, torch.compile tracing), or None."""
    import torch
    if torch.compiler.is_compiling():
        return "torch.compile tracing"
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return "CUDA graph capture"
    return None


def tune_point(library, key: tuple[str, ...], m: int, n: int, k: int, gpu: tuple[str, int],
               device: int) -> Entry | None:
    """Time every kernel of `library` for class `key` at (m, n, k) as `gemmgen tune` does, record
    the winner (or, when no timing may happen now, the problem as pending). None when nothing
    could be recorded as a winner."""
    cache = cache_for(library.name, gpu)
    reason = not_now_reason()
    if reason is not None:
        if (tuple(key), n, k, m_bucket(m)) not in cache.pending:
            cache.add(Entry(tuple(key), n, k, m_bucket(m), m, why=reason))
        return None
    import torch

    from . import select as selection
    from . import tune as tuning
    from .measure import Store
    from .shapes import WeightShape

    hooks = tuning.hooks_of(key)
    options = hooks.autotune_options(key) if hasattr(hooks, "autotune_options") else None
    if options is None:
        return None
    options.shapes = [WeightShape("autotune", n, k, "autotune", f"{cache.path}")]
    options.m_grid = (m,)
    options.library = library.name
    store = Store(tuning.store_path(library, options))
    with torch.cuda.device(device):
        started = time.perf_counter()
        tuning.measure(library, store, options, options.shapes, progress=False)
        spent = time.perf_counter() - started
    row = store.times(key, [(n, k)]).get((n, k, m), {})
    try:
        best = selection.pick(row, tuning.candidate_rank(library), options.tolerance)
    except ValueError:  # no candidate implements it
        return None
    entry = Entry(tuple(key), n, k, m_bucket(m), m, best.kernel, best.knobs, row[best])
    cache.add(entry)
    import logging
    logging.getLogger("gemmgen.dispatch").info(
        "gemmgen: autotuned %s (n=%d, k=%d, m=%d; bucket m <= %d) in %.2f s: %s (%.1f µs)",
        " ".join(key), n, k, m, entry.bucket, spent, best.label(), entry.us)
    return entry
