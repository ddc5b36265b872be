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
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import __version__, settings
from ..generator.kernel_config import RASTER_ORDERS, SWIZZLES, RuntimeKnobs
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
    kernel_set: str = ""  # the library's kernel set when it was timed (winners of another are ignored)


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
        try:
            text = self.path.read_text(errors="replace")
        except OSError as exc:  # unreadable: as if empty, said once
            _warn_once(f"gemmgen: cannot read the autotune cache {self.path} ({exc}); it is not used")
            return self
        winners: dict[tuple, Entry] = {}
        pending: dict[tuple, Entry] = {}
        for number, line in enumerate(text.splitlines(), 1):
            try:
                entry = _entry(json.loads(line), number)
            except Exception:  # a line cut short, damaged, or written by another version
                continue
            _keep(winners, pending, entry)
        with _lock:
            self.winners, self.pending, self._state = winners, pending, state
        return self

    def winner(self, key: tuple[str, ...], n: int, k: int, m: int) -> Entry | None:
        with _lock:
            return self.winners.get((tuple(key), n, k, m_bucket(m)))

    def add(self, entry: Entry) -> None:
        """Append one record (one write on an O_APPEND descriptor: whole lines, also with other
        processes appending) and keep it."""
        record = {"class": list(entry.key), "n": entry.n, "k": entry.k, "m_bucket": entry.bucket,
                  "m": entry.m, "kernel_set": entry.kernel_set, "gemmgen": __version__,
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
            written = 0
            while written < len(data):  # a short write (e.g. a signal) writes the rest
                written += os.write(fd, data[written:])
        finally:
            os.close(fd)
        with _lock:
            _keep(self.winners, self.pending, entry)

    def shapes(self) -> dict[tuple[str, ...], set[tuple[int, int]]]:
        """Every (N, K) the cache holds per dispatch class, measured or pending."""
        found: dict[tuple[str, ...], set[tuple[int, int]]] = {}
        with _lock:
            problems = [*self.winners, *self.pending]
        for key, n, k, _ in problems:
            found.setdefault(key, set()).add((n, k))
        return found


def _keep(winners: dict, pending: dict, entry: Entry) -> None:
    """File a record: a winner replaces the problem's pending record and any earlier winner."""
    where = (entry.key, entry.n, entry.k, entry.bucket)
    if entry.kernel is None:
        if where not in winners:
            pending[where] = entry
    else:
        winners[where] = entry
        pending.pop(where, None)


def _entry(record: dict, line: int) -> Entry:
    """A record read back; ValueError for anything but what `Cache.add` writes."""
    key = tuple(str(v) for v in record["class"])
    n, k, bucket, m = (record[f] for f in ("n", "k", "m_bucket", "m"))
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v < 2**31 for v in (n, k, bucket, m)):
        raise ValueError("sizes must be ints in [1, 2^31)")
    kernel_set = str(record.get("kernel_set", ""))
    if record.get("pending"):
        return Entry(key, n, k, bucket, m, why=str(record.get("why", "")), line=line, kernel_set=kernel_set)
    knobs = RuntimeKnobs(str(record["raster"]), record["swizzle"], record["split_k"])
    us = float(record["us"])
    if (knobs.raster not in RASTER_ORDERS or knobs.swizzle not in SWIZZLES or not isinstance(knobs.split_k_slices, int)
            or not 1 <= knobs.split_k_slices <= 64 or not 0 < us < float("inf")):
        raise ValueError("knobs or time out of range")
    return Entry(key, n, k, bucket, m, str(record["kernel"]), knobs, us, line=line, kernel_set=kernel_set)


_caches: dict[Path, Cache] = {}


def _warn_once(message: str) -> None:
    """Dispatch's once-per-message WARNING (forgotten by gemmgen.reload(), like dispatch's own)."""
    from ..dispatch import _warn_once as warn
    warn(message)


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


_tuning = threading.Lock()  # one first-use tuning at a time in a process (timings would collide)


def times_path(library, gpu: tuple[str, int]) -> Path:
    """The measurement store of tuning at first use (timings taken inside an application are kept
    apart from `gemmgen tune`'s, which re-times what it adds from the cache)."""
    return (settings.build_dir() / library.name / "autotune"
            / f"{gpu_slug(gpu[0])}-{gpu[1]}sm-{library.kernel_set}.times.jsonl")


def tune_point(library, key: tuple[str, ...], m: int, n: int, k: int, gpu: tuple[str, int],
               device: int) -> Entry | None:
    """Time every kernel of `library` for class `key` at (m, n, k) as `gemmgen tune` does, record
    the winner (or, when no timing may happen now, the problem as pending). None when no winner
    was recorded; a failure (out of memory, a read-only build folder, ...) is warned once and
    the call goes on with the current choice."""
    try:
        return _tune_point(library, key, m, n, k, gpu, device)
    except Exception as exc:  # never break the user's call
        _warn_once(f"gemmgen: tuning at first use failed for {' '.join(key)} (n={n}, k={k}, m={m}): "
                   f"{type(exc).__name__}: {exc}; dispatch keeps its choice")
        return None


def _tune_point(library, key, m, n, k, gpu, device) -> Entry | None:
    cache = cache_for(library.name, gpu)
    where = (tuple(key), n, k, m_bucket(m))
    reason = not_now_reason()
    if reason is not None:
        if where not in cache.pending:
            cache.add(Entry(tuple(key), n, k, m_bucket(m), m, why=reason, kernel_set=library.kernel_set))
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
    with _tuning:
        done = cache.load().winner(key, n, k, m)  # another thread may have tuned it meanwhile
        if done is not None and done.kernel_set == library.kernel_set:
            return done
        options.shapes = [WeightShape("autotune", n, k, "autotune", f"{cache.path}")]
        options.m_grid = (m,)
        options.library = library.name
        store = Store(times_path(library, gpu))
        with torch.cuda.device(device):
            started = time.perf_counter()
            tuning.measure(library, store, options, options.shapes, progress=False)
            spent = time.perf_counter() - started
        row = store.times(key, [(n, k)]).get((n, k, m), {})
        try:
            best = selection.pick(row, tuning.candidate_rank(library),
                                  tuning.tie_tolerance(store, key, n, k, m, row, options))
        except ValueError:  # no candidate implements it
            return None
        entry = Entry(tuple(key), n, k, m_bucket(m), m, best.kernel, best.knobs, row[best],
                      kernel_set=library.kernel_set)
        cache.add(entry)
    logging.getLogger("gemmgen.dispatch").info(
        "gemmgen: autotuned %s (n=%d, k=%d, m=%d; bucket m <= %d) in %.2f s: %s (%.1f µs)",
        " ".join(key), n, k, m, entry.bucket, spent, best.label(), entry.us)
    return entry
