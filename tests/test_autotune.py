"""Tuning at first use (gemmgen/tuning/autotune.py), without a GPU: when it is on, the cache
file (records, pending problems, several writers, damaged lines), dispatch reading the cache,
when dispatch asks for a timing and when not, and `gemmgen tune --from-cache`'s shapes."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os

import pytest

import gemmgen
from gemmgen import dispatch, settings
from gemmgen.generator.kernel_config import RuntimeKnobs
from gemmgen.tuning import autotune
from gemmgen.tuning import tune as tuning

from test_cost_model import _install, _model_table
from test_tuning_dispatch import GPU, _choose, _library, _name, use  # noqa: F401  (fixture)

KEY = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")


@pytest.fixture
def build_dir(tmp_path):
    with settings.using_build_dir(tmp_path / "build") as root:
        autotune.clear()
        yield root
    autotune.clear()


def test_on_by_context_or_environment(monkeypatch):
    monkeypatch.delenv(autotune.ENV, raising=False)
    assert not autotune.enabled()
    with gemmgen.autotune():
        assert autotune.enabled()
        with gemmgen.autotune(False):
            assert not autotune.enabled()
        assert autotune.enabled()
    monkeypatch.setenv(autotune.ENV, "1")
    assert not autotune.enabled()  # read at import and reload, not per call
    gemmgen.reload()
    assert autotune.enabled()
    with gemmgen.autotune(False):
        assert not autotune.enabled()
    monkeypatch.setenv(autotune.ENV, "0")
    gemmgen.reload()
    assert not autotune.enabled()


def test_m_buckets_are_the_tuners_grid():
    assert [autotune.m_bucket(m) for m in (1, 3, 16, 17, 300, 16384, 99999)] == [
        1, 4, 16, 24, 320, 16384, 16384]


def _winner(m=300, kernel="k_a", us=10.0, n=1280, k=8192, kernel_set="", key=KEY):
    return autotune.Entry(key, n, k, autotune.m_bucket(m), m, kernel, RuntimeKnobs("along_m", 2), us,
                          kernel_set=kernel_set)


def test_cache_round_trip_pending_then_winner(build_dir):
    cache = autotune.cache_for("demo", GPU)
    assert cache.path == build_dir / "demo" / "autotune" / "h200-132sm.jsonl"
    cache.add(autotune.Entry(KEY, 1280, 8192, 320, 300, why="CUDA graph capture"))
    cache.add(_winner())
    again = autotune.Cache(cache.path).load()
    entry = again.winner(KEY, 1280, 8192, 257)  # same bucket (257..320)
    assert (entry.kernel, entry.knobs, entry.us, entry.m) == ("k_a", RuntimeKnobs("along_m", 2), 10.0, 300)
    assert again.winner(KEY, 1280, 8192, 321) is None and not again.pending
    assert again.shapes() == {KEY: {(1280, 8192)}}


def test_a_damaged_line_is_skipped_and_the_later_record_wins(build_dir):
    cache = autotune.cache_for("demo", GPU)
    cache.add(_winner(kernel="k_a"))
    with open(cache.path, "a") as handle:
        handle.write('{"class": ["scaled_mm", "int8"], "n": 12')  # a writer killed mid-line
        handle.write("\n")
    cache.add(_winner(kernel="k_b", us=9.0))
    assert autotune.Cache(cache.path).load().winner(KEY, 1280, 8192, 300).kernel == "k_b"


def _append_many(path: str, worker: int) -> None:
    cache = autotune.Cache(__import__("pathlib").Path(path))
    for i in range(200):
        cache.add(_winner(m=1 + (i % 50), kernel=f"w{worker}_{i}", n=4096 + 16 * worker))


def test_several_processes_append_whole_lines(build_dir):
    path = autotune.cache_path("demo", GPU)
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_many, args=(str(path), w)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
        assert p.exitcode == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 800 and all(json.loads(line)["class"] == list(KEY) for line in lines)


# ------------------------------------------------------------------------ dispatch

def test_dispatch_takes_the_recorded_winner_first(case, use, build_dir):
    library = use(_library(case))
    small, large = _name(library, "small"), _name(library, "large")
    autotune.cache_for("demo", GPU).add(_winner(m=300, kernel=small, n=4096, k=4096,
                                                kernel_set=library.kernel_set))
    dispatch.cache_clear()
    choice = _choose(300)
    assert choice.source == "autotune" and choice.kernel.name == small and choice.settled
    assert choice.knobs == RuntimeKnobs("along_m", 2) and "tuned at first use" in choice.reason
    assert _choose(400).kernel.name == large  # another bucket: the rules
    assert _choose(300, tuned=False).source == "rule"  # tuned=False skips it, like the table
    # ignored: a record naming a kernel this library does not have, one of another kernel set
    # (the manifest changed since), one naming another class's kernel
    other_class = next(k.name for k in library.kernels.values() if k.spec.dispatch_class != KEY)
    cache = autotune.cache_for("demo", GPU)
    cache.add(_winner(m=1000, kernel="gone", n=4096, k=4096, kernel_set=library.kernel_set))
    cache.add(_winner(m=2000, kernel=small, n=4096, k=4096, kernel_set="0" * 16))
    cache.add(_winner(m=3000, kernel=other_class, n=4096, k=4096, kernel_set=library.kernel_set))
    dispatch.cache_clear()
    assert [_choose(m).source for m in (1000, 2000, 3000)] == ["rule"] * 3


@pytest.mark.parametrize("damage", [
    lambda r: {**r, "n": 1e400}, lambda r: {**r, "raster": "diagonal"}, lambda r: {**r, "split_k": 0},
    lambda r: {**r, "us": -1}, lambda r: {**r, "n": True}, lambda r: {**r, "class": 5},
])
def test_a_damaged_record_is_skipped_not_fatal(case, use, build_dir, damage):
    library = use(_library(case))
    path = autotune.cache_path("demo", GPU)
    path.parent.mkdir(parents=True)
    good = {"class": list(KEY), "n": 4096, "k": 4096, "m_bucket": 320, "m": 300, "kernel_set": library.kernel_set,
            "kernel": _name(library, "small"), "raster": "along_m", "swizzle": 2, "split_k": 1, "us": 3.0}
    path.write_text(json.dumps(damage(good)) + "\n")
    dispatch.cache_clear()
    assert _choose(300).source == "rule"
    path.write_text(json.dumps(good) + "\n")
    autotune.clear()
    dispatch.cache_clear()
    assert _choose(300).source == "autotune"


def test_an_unreadable_cache_is_warned_and_not_used(case, use, build_dir, caplog):
    use(_library(case))
    autotune.cache_path("demo", GPU).mkdir(parents=True)  # a folder where the file should be
    with caplog.at_level(logging.WARNING, logger="gemmgen.dispatch"):
        assert _choose(300).source == "rule"
    assert any("cannot read the autotune cache" in r.getMessage() for r in caplog.records)


def test_first_use_times_only_unmeasured_problems(case, use, build_dir, tmp_path, monkeypatch):
    base = _library(case)
    library = use(_install(base, _model_table(base, tmp_path)))
    small = _name(library, "small")
    calls = []

    def fake_tune_point(lib, key, m, n, k, gpu, device):
        calls.append((key, m, n, k))
        entry = autotune.Entry(tuple(key), n, k, autotune.m_bucket(m), m, small, RuntimeKnobs(), 5.0,
                               kernel_set=lib.kernel_set)
        autotune.cache_for(lib.name, gpu).add(entry)
        return entry

    monkeypatch.setattr(autotune, "tune_point", fake_tune_point)
    monkeypatch.setattr(dispatch, "_device_index", lambda device: 0)
    choose = lambda m, n, k: dispatch.choose_class(KEY, (m, n, k))  # noqa: E731
    assert choose(300, 1280, 8192).source == "table"        # off: the cost model, no timing
    with gemmgen.autotune():
        first = choose(300, 1280, 8192)                     # unlisted shape: timed now
        again = choose(290, 1280, 8192)                     # same bucket: recorded
        listed = choose(4, 4096, 4096)                      # the table lists it: not timed
    assert calls == [(KEY, 300, 1280, 8192)]
    assert first.source == again.source == "autotune" and first.kernel.name == small
    assert listed.source == "table" and listed.settled
    assert choose(300, 1280, 8192).source == "autotune"     # later (and in later processes)


def test_no_timing_under_capture_records_the_problem_as_pending(case, build_dir, monkeypatch):
    library = _library(case)
    monkeypatch.setattr(autotune, "not_now_reason", lambda: "CUDA graph capture")
    monkeypatch.setattr(tuning, "measure", lambda *a, **k: pytest.fail("timed during capture"))
    assert autotune.tune_point(library, KEY, 300, 1280, 8192, GPU, 0) is None
    assert autotune.tune_point(library, KEY, 310, 1280, 8192, GPU, 0) is None  # once per bucket
    cache = autotune.Cache(autotune.cache_path("demo", GPU)).load()
    assert list(cache.pending) == [(KEY, 1280, 8192, 320)] and not cache.winners
    assert len(cache.path.read_text().splitlines()) == 1
    assert cache.pending[(KEY, 1280, 8192, 320)].why == "CUDA graph capture"


def test_tune_from_cache_adds_the_recorded_shapes(case, build_dir, monkeypatch, capsys):
    library = _library(case)
    cache = autotune.cache_for("demo", GPU)
    cache.add(_winner(n=1280, k=8192))
    cache.add(autotune.Entry(KEY, 7168, 8192, 64, 50, why="torch.compile tracing"))
    monkeypatch.setattr(tuning, "gpu_identity", lambda: GPU)
    known = [tuning.WeightShape("o", 7168, 8192, "m", "f:1")]
    shapes = tuning.cached_shapes(library, known)
    assert [(s.n, s.k, s.model) for s in shapes] == [(1280, 8192, "autotune cache")]
    assert "1 shape(s) from the autotune cache" in capsys.readouterr().out


def test_tune_needs_shapes_or_the_cache(capsys):
    from gemmgen.cli import main
    assert main(["tune"]) == 1
    assert "give --shapes, --from-cache, or both" in capsys.readouterr().err


def test_reload_forgets_the_caches_read(build_dir):
    cache = autotune.cache_for("demo", GPU)
    assert autotune.cache_for("demo", GPU) is cache
    gemmgen.reload()
    assert autotune.cache_for("demo", GPU) is not cache
    assert os.path.dirname(cache.path).endswith("autotune")


def test_the_ops_memo_follows_new_records(case, use, build_dir, monkeypatch):
    """Off: the rules' choice is memoized; on: the problem is timed, and from then on (on or off)
    the record serves; a choice made under capture is not memoized."""
    from gemmgen.bindings import launch
    library = use(_library(case))
    small, large = _name(library, "small"), _name(library, "large")
    launch.clear_caches()
    times = []

    def fake_tune_point(lib, key, m, n, k, gpu, device):
        if autotune.not_now_reason() is not None:
            return None
        times.append(m)
        entry = autotune.Entry(tuple(key), n, k, autotune.m_bucket(m), m, large, RuntimeKnobs(), 5.0,
                               kernel_set=lib.kernel_set)
        autotune.cache_for(lib.name, gpu).add(entry)
        return entry

    monkeypatch.setattr(autotune, "tune_point", fake_tune_point)
    chosen = lambda m: launch.choice("scaled_mm", 0, ("sm90a",), KEY, (m, 4096, 4096))[0].name  # noqa: E731
    assert chosen(40) == small                         # off: the rules (m <= 64: small)
    monkeypatch.setattr(autotune, "not_now_reason", lambda: "CUDA graph capture")
    with gemmgen.autotune():
        assert chosen(40) == small and times == []     # under capture: nothing timed, not kept
    monkeypatch.setattr(autotune, "not_now_reason", lambda: None)
    with gemmgen.autotune():
        assert chosen(40) == large and times == [40]   # outside: timed once, the record serves
        assert chosen(40) == large and times == [40]
    assert chosen(40) == large                         # and with tuning off again
    launch.clear_caches()


def test_how_long_a_choice_holds_and_the_plans_made_from_it(case, use, build_dir, monkeypatch):
    """launch.choice says how long its answer holds (the ops memoize what they derive from it by
    that): the rules' choice until tuning at first use is on (False), a choice under capture not
    at all (None), a timed one for good (True); plan memos are emptied with the choices and never
    keep a provisional plan."""
    from gemmgen.bindings import launch
    library = use(_library(case))
    large = _name(library, "large")
    launch.clear_caches()

    def fake_tune_point(lib, key, m, n, k, gpu, device):
        if autotune.not_now_reason() is not None:
            return None
        entry = autotune.Entry(tuple(key), n, k, autotune.m_bucket(m), m, large, RuntimeKnobs(), 5.0,
                               kernel_set=lib.kernel_set)
        autotune.cache_for(lib.name, gpu).add(entry)
        return entry

    monkeypatch.setattr(autotune, "tune_point", fake_tune_point)
    lasting = lambda: launch.choice("scaled_mm", 0, ("sm90a",), KEY, (40, 4096, 4096))[2]  # noqa: E731
    assert lasting() is False
    monkeypatch.setattr(autotune, "not_now_reason", lambda: "CUDA graph capture")
    with gemmgen.autotune():
        assert lasting() is None
    monkeypatch.setattr(autotune, "not_now_reason", lambda: None)
    with gemmgen.autotune():
        assert lasting() is True
    memo = launch.plan_memo()
    launch.store_plan(memo, ("provisional",), ("plan", None))
    launch.store_plan(memo, ("unsettled",), ("plan", False))
    launch.store_plan(memo, ("settled",), ("plan", True))
    assert memo == {("unsettled",): ("plan", False), ("settled",): ("plan", True)}
    assert launch.memoized_plan(memo, ("unsettled",)) == ("plan", False)
    with gemmgen.autotune():  # now tuning at first use would time the unsettled one
        assert launch.memoized_plan(memo, ("unsettled",)) is None
        assert launch.memoized_plan(memo, ("settled",)) == ("plan", True)
    assert launch.memoized_plan(memo, None) is None
    assert launch.memoized_plan(memo, (["unhashable"],)) is None
    launch.forget_choices()
    assert memo == {}
    launch.store_plan(memo, ("settled",), ("plan", True))
    launch.clear_caches()
    assert memo == {}


def test_a_plans_first_call_asks_the_workspace_size_once(monkeypatch):
    """launch_plan: a plan without its workspace size asks the kernel, launches with it and keeps
    the completed plan; the kept plan launches without asking; no key, nothing kept."""
    from gemmgen.bindings import launch
    asked, launched = [], []

    class Kernel:
        name = "demo"

        def workspace_size(self, buffer):
            asked.append(buffer)
            return 256

    kernel = Kernel()
    monkeypatch.setattr(launch, "launch", lambda k, buffer, device, workspace: launched.append(workspace) or 0)
    memo = launch.plan_memo()
    launch.launch_plan(memo, ("k",), (kernel, "raster", None, True), "buffer", 0)
    assert asked == ["buffer"] and launched == [256] and memo == {("k",): (kernel, "raster", 256, True)}
    launch.launch_plan(memo, ("k",), memo[("k",)], "buffer", 0)
    assert asked == ["buffer"] and launched == [256, 256]
    launch.launch_plan(memo, None, (kernel, "other", None, True), "buffer", 0)
    assert len(asked) == 2 and len(memo) == 1
    launch.clear_caches()


def test_an_own_table_listing_the_shape_comes_before_a_record(case, use, build_dir, tmp_path):
    base = _library(case)
    library = use(_install(base, _model_table(base, tmp_path)))
    small = _name(library, "small")
    autotune.cache_for("demo", GPU).add(_winner(m=4, kernel=small, n=4096, k=4096,
                                                kernel_set=library.kernel_set))
    autotune.cache_for("demo", GPU).add(_winner(m=4, kernel=small, n=8192, k=4096,
                                                kernel_set=library.kernel_set))
    dispatch.cache_clear()
    assert _choose(4).source == "table"                # the table lists (4096, 4096)
    assert _choose(4, n=8192).source == "autotune"     # it does not list (8192, 4096)
