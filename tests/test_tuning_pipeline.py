"""`gemmgen tune` end to end on synthetic timings (no GPU): measure → store → table → select.

The GPU timing is replaced by a deterministic model of each kernel's time (plus noise below the
tie tolerance), so what is checked is the orchestration: candidates and knobs, resume, table
contents and determinism, and the pruned manifest + table that `--select` writes.
"""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest

from gemmgen.bindings.library import Kernel, Library
from gemmgen.generator.expand import expand
from gemmgen.families.w8a8.configs import RuntimeKnobs, Sm80TileConfig
from gemmgen.families.w8a8.tuning import knob_variants, output_tiles
from gemmgen.generator.manifest import load_manifest
from gemmgen.tuning import tune as tuning
from gemmgen.tuning.measure import Candidate, Record, Store
from gemmgen.tuning.shapes import WeightShape
from gemmgen.tuning.table import kernel_set_hash, load_table, table_path_for

GPU = ("NVIDIA H200", 132)
CLS = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")
SHAPES = [WeightShape("o", 4096, 4096, "test", "x:1"), WeightShape("up", 28672, 4096, "test", "x:2")]
GRID = (1, 16, 64, 256, 4096)
THIRD_CONFIG = """      - name: mid
        tile: [64, 128, 128]
        cluster: [1, 1, 1]
        schedule: pingpong
"""


def _model_us(kernel: Kernel, knobs, m: int, n: int, k: int) -> float:
    """small wins at m <= 64, mid never (pruned), large beyond; along_n + swizzle 4 helps large."""
    base = 5.0 + 2 * m * n * k / 1.4e9
    factor = {"small": 0.8 if m <= 64 else 1.6, "mid": 1.25, "large": 1.3 if m <= 64 else 1.0}
    speedup = 0.9 if (knobs.raster, knobs.swizzle) == ("along_n", 4) else 1.0
    return base * factor[kernel.spec.origin.config] * speedup


@pytest.fixture
def library(case, monkeypatch):
    case.replace("    dispatch:\n", THIRD_CONFIG + "    dispatch:\n")
    specs = case.expand()
    lib = Library("demo", "sm90a", Path("."), "f" * 16, None, {}, {}, None)
    lib.kernels.update({s.name: Kernel(s, lib, None, None) for s in specs})
    calls = []

    def fake_time(candidate, problem):
        m, n, k, noise = problem
        calls.append((candidate, (m, n, k)))
        return _model_us(lib.kernels[candidate.kernel], candidate.knobs, m, n, k) * (1 + noise.uniform(-0.004, 0.004))

    noise = random.Random(0)
    monkeypatch.setattr(tuning, "libraries", lambda: (lib,))
    monkeypatch.setattr(tuning, "gpu_identity", lambda: GPU)
    monkeypatch.setattr(tuning.torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tuning.torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(tuning, "make_problem", lambda cls, m, shape, seed=0: (m, shape.n, shape.k, noise))
    monkeypatch.setattr(tuning, "time_candidate", lambda c, p, cls: fake_time(c, p))
    return lib, calls


def _options(tmp_path, **kw) -> tuning.TuneOptions:
    fields = dict(shapes=SHAPES, m_grid=GRID, dtypes=("int8",), knob_top=2, out=str(tmp_path / "out.tuned.yaml"),
                  select_dir=str(tmp_path / "pruned"))
    return tuning.TuneOptions(**{**fields, **kw})


def test_measure_store_resume_and_table(library, tmp_path):
    library, calls = library
    options = _options(tmp_path)
    store = Store(tmp_path / "m.jsonl")
    tuning.measure(library, store, options, SHAPES)
    first_calls = len(calls)
    # 3 kernels at every point with their manifest knobs; other knobs only for the 2 fastest, and
    # only where the output has more tiles than the GPU has SMs
    with_default_knobs = [c for c, _ in calls if Candidate.of(library.kernels[c.kernel]) == c]
    assert len(with_default_knobs) == 3 * len(SHAPES) * len(GRID)
    knobbed = {(c.kernel, p) for c, p in calls if Candidate.of(library.kernels[c.kernel]) != c}
    assert knobbed and all(output_tiles(library.kernels[kernel], m, n) > GPU[1] for kernel, (m, n, k) in knobbed)
    assert len({kernel for kernel, p in knobbed if p == (4096, 28672, 4096)}) == 2
    tuning.measure(library, Store(tmp_path / "m.jsonl"), options, SHAPES)  # resume: nothing new
    assert len(calls) == first_calls
    path = tuning.write_table(library, Store(tmp_path / "m.jsonl"), options)
    table = load_table(path, known_kernels=library.kernels)
    assert table.mismatch(gpu=GPU, kernel_set=kernel_set_hash(library.kernels)) is None
    ctable = table.classes[("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")]
    by_config = {}
    for shape in ctable.shapes:
        for m in GRID:
            bucket = shape.bucket_for(m)
            by_config[(shape.n, m)] = (library.kernels[bucket.kernel].spec.origin.config, bucket.knobs)
    assert by_config[(4096, 16)][0] == "small" and by_config[(28672, 64)][0] == "small"
    config, knobs = by_config[(28672, 4096)]
    assert config == "large" and (knobs.raster, knobs.swizzle) == ("along_n", 4)


def test_a_family_can_ask_for_a_kernels_knobs_whatever_its_rank(library, tmp_path, monkeypatch):
    """`knobs_always_tried` (an optional tuner hook): the knob settings of the kernels it names
    are timed even where their first pass is not among the fastest (`mid` never is)."""
    from gemmgen.families.w8a8 import tuning as w8a8_hooks
    library, calls = library

    def knobbed_at(point, run: str) -> set[str]:
        calls.clear()
        options = _options(tmp_path / run)
        options.knob_top = 1
        tuning.measure(library, Store(tmp_path / f"{run}.jsonl"), options, SHAPES)
        return {library.kernels[c.kernel].spec.origin.config for c, p in calls
                if p == point and Candidate.of(library.kernels[c.kernel]) != c}

    assert knobbed_at((4096, 28672, 4096), "plain") == {"large"}  # the fastest only
    asked = []

    def always(kernel, m, n, sms) -> bool:
        asked.append((kernel.spec.origin.config, m, n, sms))
        return kernel.spec.origin.config == "mid"

    monkeypatch.setattr(w8a8_hooks, "knobs_always_tried", always, raising=False)
    assert knobbed_at((4096, 28672, 4096), "asked") == {"large", "mid"}
    # asked about the kernels past the top one, with the point's M and N and the GPU's SMs
    assert ("mid", 4096, 28672, GPU[1]) in asked and all(c != "large" for c, *_ in asked
                                                            if _ == [4096, 28672, GPU[1]])


def test_two_tunes_write_the_same_table(library, tmp_path):
    library, _ = library
    texts = []
    for run in range(2):
        options = _options(tmp_path / str(run))
        store = Store(tmp_path / f"run{run}.jsonl")
        tuning.measure(library, store, options, SHAPES)
        options.out = str(tmp_path / "table.tuned.yaml")
        texts.append(Path(tuning.write_table(library, store, options)).read_text())
    # the winners and their buckets are the same; the cost model section carries the raw times
    # of each run (noise), so it is compared apart
    winners = [re.sub(r"    model:\n(      .*\n)*", "", text) for text in texts]
    assert winners[0] == winners[1] and winners[0] != texts[0]
    classes = load_table(tmp_path / "table.tuned.yaml").classes.values()
    assert classes and all(c.model is not None and c.model.coef and c.model.times for c in classes)


def test_select_writes_a_pruned_manifest_and_its_table(library, tmp_path, case):
    library, _ = library
    options = _options(tmp_path, select=True)
    store = Store(tmp_path / "m.jsonl")
    tuning.measure(library, store, options, SHAPES)
    report = tuning.select_and_write(library, store, options)
    assert "kept 2 of 3 configs (small, large)" in report
    pruned = tmp_path / "pruned" / case.write().name
    manifest = load_manifest(pruned)
    (family,) = manifest.families
    assert [c.name for c in family.configs] == ["small", "large"]
    names = {s.name for s in expand(manifest)}
    assert len(names) == 2 * len(library.kernels) // 3
    table = load_table(table_path_for(pruned, tuning.gpu_identity()[0]), known_kernels=names)
    assert table.metadata["kernel_set"] == kernel_set_hash(names)
    rules = [(r.condition.source, family.configs[r.config_index].name) for r in family.dispatch]
    assert rules == [("m <= 64", "small"), ("true", "large")]


def test_extend_adds_shapes_to_a_table_without_its_store(library, tmp_path):
    """`gemmgen tune --extend TABLE`: only the new shapes are timed (the first tune's store is
    gone, as on a machine that was handed back); the table keeps its buckets and stored times,
    gains the new shapes' buckets exactly as a tune of them alone picks, and its cost model is
    fitted to the times of both."""
    from gemmgen.errors import GemmgenError
    library, calls = library
    first = _options(tmp_path, shapes=[SHAPES[0]], command="gemmgen tune --shapes first")
    first.out = str(tmp_path / "table.tuned.yaml")
    tuning.measure(library, Store(tmp_path / "first.jsonl"), first, first.shapes)
    before_text = Path(tuning.write_table(library, Store(tmp_path / "first.jsonl"), first)).read_text()
    before = load_table(first.out)
    alone = _options(tmp_path, shapes=[SHAPES[1]], out=str(tmp_path / "alone.tuned.yaml"))
    tuning.measure(library, Store(tmp_path / "second.jsonl"), alone, alone.shapes)
    alone_table = load_table(tuning.write_table(library, Store(tmp_path / "second.jsonl"), alone))

    calls.clear()
    options = _options(tmp_path, extend=first.out, command="gemmgen tune --shapes both --extend t")
    options.m_grid = ()  # the table's grid is taken
    options.out = None   # rewritten in place
    extending = tuning.table_to_extend(library, options)
    assert [s.name for s in options.shapes] == ["up"] and options.m_grid == GRID
    tuning.measure(library, Store(tmp_path / "second.jsonl"), options, options.shapes)
    assert calls == []  # resumed from the store of the second shape: nothing timed again
    path = tuning.write_table(library, Store(tmp_path / "second.jsonl"), options, extending)
    assert path == Path(first.out)
    text = path.read_text()
    assert "# Command: gemmgen tune --shapes first" in text and "# Extended by: gemmgen tune --shapes both" in text
    after = load_table(path, known_kernels=library.kernels)
    (key,) = after.classes
    def plain(buckets):
        return [(b.m_max, b.kernel, b.knobs) for b in buckets]

    got = {(s.n, s.k): plain(s.buckets) for s in after.classes[key].shapes}
    assert got[(4096, 4096)] == plain(before.classes[key].shapes[0].buckets)
    assert got[(28672, 4096)] == plain(alone_table.classes[key].shapes[0].buckets)
    model = after.classes[key].model
    assert {(n, k) for n, k, _ in model.times} == {(4096, 4096), (28672, 4096)}
    assert all(model.times[p] == before.classes[key].model.times[p] for p in before.classes[key].model.times)
    refit = tuning.model_from_times(library, key, {p: dict(r) for p, r in model.times.items()})
    assert set(model.coef) == set(refit.coef) == {k.name for k in tuning.kernels_of(library, key)}
    assert all(max(abs(a - b) for a, b in zip(model.coef[n], refit.coef[n])) < 1e-3 * max(1.0, *map(abs, refit.coef[n]))
               for n in model.coef)
    assert model.coef != before.classes[key].model.coef  # fitted again, to both shapes' times
    assert "# Extended by" not in before_text

    def refused(**changes) -> str:
        opts = _options(tmp_path, extend=first.out)
        for name, value in changes.items():
            setattr(opts, name, value)
        with pytest.raises(GemmgenError) as err:
            tuning.table_to_extend(library, opts)
        return str(err.value)

    assert "--m" in refused(m_grid=(1, 16))
    assert "nothing to add" in refused(shapes=[SHAPES[0], SHAPES[1]])
    assert "no such table" in refused(extend=str(tmp_path / "missing.yaml"))
    other_gpu = tmp_path / "h100.tuned.yaml"
    other_gpu.write_text(text.replace("gpu: NVIDIA H200", "gpu: NVIDIA H100 80GB HBM3"))
    assert "measured on NVIDIA H100 80GB HBM3" in refused(extend=str(other_gpu))
    other_set = tmp_path / "other.tuned.yaml"
    other_set.write_text(text.replace(f"kernel_set: {library.kernel_set}", "kernel_set: 0123456789abcdef"))
    assert "kernel set 0123456789abcdef" in refused(extend=str(other_set))


def test_store_parts_resume_and_retry_failures(tmp_path):
    """Per-GPU part files load together; a failed measurement is tried again on resume."""
    path = tmp_path / "lib-abc-H200-132sm-seed0.jsonl"
    good = Record(CLS, 4096, 4096, 16, "k1", "heuristic", 1, 1, 12.5)
    failed = Record(CLS, 4096, 4096, 16, "k2", "heuristic", 1, 1, None,
                    "out of memory")
    Store(path, part="gpu0").put(good)
    Store(path, part="gpu1").put(failed)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "lib-abc-H200-132sm-seed0.gpu0.jsonl", "lib-abc-H200-132sm-seed0.gpu1.jsonl"]
    with open(tmp_path / "lib-abc-H200-132sm-seed0.gpu0.jsonl", "a") as handle:
        handle.write('{"cls": ["scaled_mm", "int8", "bf1')  # a line cut short by a killed run
    reopened = Store(path)
    assert reopened.get(CLS, 4096, 4096, 16, good.candidate) == good
    assert reopened.get(CLS, 4096, 4096, 16, failed.candidate) is None
    assert reopened.times(CLS) == {(4096, 4096, 16): {good.candidate: 12.5}}


def test_a_gzipped_store_is_read_and_not_extended(tmp_path):
    """benchmarks/data/ keeps stores gzipped: they read as the plain file does; adding to one is
    refused with what to do (gunzip), and nothing is written."""
    import gzip
    from gemmgen.errors import GemmgenError
    plain = tmp_path / "s.jsonl"
    Store(plain).put(Record(CLS, 4096, 4096, 16, "k1", "heuristic", 1, 1, 12.5))
    zipped = tmp_path / "s.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    store = Store(zipped)
    assert store.times(CLS) == Store(plain).times(CLS) == {(4096, 4096, 16): {Candidate("k1"): 12.5}}
    before = zipped.read_bytes()
    with pytest.raises(GemmgenError, match="read-only; gunzip it"):
        store.put(Record(CLS, 4096, 4096, 32, "k1", "heuristic", 1, 1, 13.0))
    assert zipped.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "s.jsonl.gz"]


def test_knob_variants_per_arch(library):
    """sm90: every raster order x swizzle (the manifest's first); sm80 split-K: slice counts."""
    library, _ = library
    sm90 = next(iter(library.kernels.values()))
    variants = knob_variants(sm90)
    assert variants[0] == Candidate.of(sm90) and len(variants) == len(set(variants)) == 12
    config = Sm80TileConfig((64, 128, 128), (64, 64, 64), (16, 8, 32), 5, 1, "parallel")
    split = Kernel(dataclasses.replace(sm90.spec, arch="sm80", config=config,
                                       knobs=RuntimeKnobs(split_k_slices=4)), None, None, None)
    assert [c.split_k for c in knob_variants(split)] == [4, 1, 2, 8]
    plain = Kernel(dataclasses.replace(split.spec, config=dataclasses.replace(config, split_k="none"),
                                       knobs=RuntimeKnobs()), None, None, None)
    assert knob_variants(plain) == [Candidate.of(plain)]


_FP8_FAMILY = """\
library: demo
arch: sm90a
kernels_per_file: 4
families:
  - name: fp8
    op: scaled_mm
    dtypes:
      - a: e4m3
        d: bf16
    epilogues: [ScaledEpilogueBias]
    configs:
      - name: {name}
        tile: {tile}
        cluster: [1, 1, 1]
        schedule: {schedule}
    dispatch:
      - when: "true"
        use: {name}
"""


def _add_fp8_kernels(library, tmp_path, name, tile, schedule) -> set[str]:
    """Add an fp8 family's kernels (one config) to the synthetic library; their names."""
    path = tmp_path / f"fp8_{name}.yaml"
    path.write_text(_FP8_FAMILY.format(name=name, tile=tile, schedule=schedule))
    specs = expand(load_manifest(path))
    library.kernels.update({s.name: Kernel(s, library, None, None) for s in specs})
    return {s.name for s in specs}


def test_update_retunes_the_measured_classes_and_keeps_the_others(library, tmp_path):
    """`gemmgen tune --dtypes e4m3 --update TABLE` after fp8 configs were added: only the e4m3
    class is timed; the table keeps its int8 class as tuned, gets the new e4m3 class, and names
    the library's kernel set (so it is whole, not partial). Refused: a tune that leaves a class
    with new kernels unmeasured, and one that keeps a class naming a kernel the library lost."""
    from gemmgen.errors import GemmgenError
    library, calls = library
    _add_fp8_kernels(library, tmp_path, "large", "[128, 128, 128]", "pingpong")
    first = _options(tmp_path, dtypes=("int8", "e4m3"), command="gemmgen tune --dtypes int8 e4m3",
                     out=str(tmp_path / "table.tuned.yaml"))
    tuning.measure(library, Store(tmp_path / "first.jsonl"), first, first.shapes)
    before = load_table(tuning.write_table(library, Store(tmp_path / "first.jsonl"), first))
    int8_key, fp8_key = sorted(before.classes, key=lambda c: c[1] != "int8")
    assert (int8_key[1], fp8_key[1]) == ("int8", "e4m3")
    added = _add_fp8_kernels(library, tmp_path, "small", "[64, 64, 128]", "warpspecialized")
    assert added and before.metadata["kernel_set"] != library.kernel_set

    def refused(**changes) -> str:
        opts = _options(tmp_path, **{"update": first.out, **changes})
        with pytest.raises(GemmgenError) as err:
            tuning.table_to_update(library, opts)
        return str(err.value)

    message = refused(dtypes=("int8",))
    assert "classes this tune does not measure" in message and "e4m3" in message
    assert f"({len(added)} new)" in message and "--dtypes" in message
    assert "--m" in refused(dtypes=("e4m3",), m_grid=(1, 16))
    dropped = refused(dtypes=("e4m3",), shapes=[SHAPES[0]])  # the table lists both shapes
    assert "lists 28672x4096 for" in dropped and "would drop" in dropped
    assert "no such table" in refused(dtypes=("e4m3",), update=str(tmp_path / "missing.yaml"))

    # a history line written by hand (a merge of two tables) is kept like the tool's own
    first_text = Path(first.out).read_text().replace(
        "# Command: gemmgen tune --dtypes int8 e4m3\n",
        "# Command: gemmgen tune --dtypes int8 e4m3\n# Merged: by hand, for the test\n", 1)
    assert "# Merged: by hand" in first_text
    Path(first.out).write_text(first_text)
    options = _options(tmp_path, dtypes=("e4m3",), update=first.out, out=None,
                       command="gemmgen tune --dtypes e4m3 --update t")
    options.m_grid = ()  # the table's grid is taken
    updating = tuning.table_to_update(library, options)
    assert options.m_grid == GRID
    calls.clear()
    tuning.measure(library, Store(tmp_path / "second.jsonl"), options, options.shapes)
    assert calls and {library.kernels[c.kernel].spec.dispatch_class for c, _ in calls} == {fp8_key}
    assert added <= {c.kernel for c, _ in calls}  # the new kernels were timed
    path = tuning.write_table(library, Store(tmp_path / "second.jsonl"), options, None, updating)
    assert path == Path(first.out)
    text = path.read_text()
    assert "# Command: gemmgen tune --dtypes int8 e4m3" in text
    assert "# Updated by: gemmgen tune --dtypes e4m3 --update t (re-tuned: " in text
    assert text.index("# Merged: by hand, for the test") < text.index("# Updated by:")
    after = load_table(path, known_kernels=library.kernels)
    assert after.metadata["kernel_set"] == library.kernel_set
    assert set(after.metadata["kernels"]) == set(library.kernels)

    def plain(table, key):
        return {(s.n, s.k): [(b.m_max, b.kernel, b.knobs) for b in s.buckets] for s in table.classes[key].shapes}

    assert plain(after, int8_key) == plain(before, int8_key)  # kept as tuned
    assert after.classes[int8_key].model.times == before.classes[int8_key].model.times
    fp8_kernels = {b.kernel for s in after.classes[fp8_key].shapes for b in s.buckets}
    assert fp8_kernels and all(library.kernels[k].spec.dispatch_class == fp8_key for k in fp8_kernels)
    assert set(after.classes[fp8_key].model.coef) == {k.name for k in tuning.kernels_of(library, fp8_key)}
    assert added <= set(after.classes[fp8_key].model.coef)  # the new kernels are in its model

    # a kept class naming a kernel the library no longer has: refused
    gone = sorted(k for k, v in library.kernels.items() if v.spec.origin.config == "mid"
                  and v.spec.dispatch_class == int8_key)
    assert gone
    for name in gone:
        del library.kernels[name]
    message = refused(dtypes=("e4m3",))
    assert "no longer has" in message and gone[0] in message


def test_retune_rewrites_the_chosen_points_and_keeps_the_others(library, tmp_path, monkeypatch):
    """`gemmgen tune --retune TABLE --m 256,4096 --shapes <one shape>`: only those points are
    timed, afresh (a store of their own, not the full tune's), the table's pick among them even
    where the knob pass leaves its knobs out, and re-timed side by side with the fastest; where
    the new times name a clearly faster winner the shape's buckets change there alone, a winner
    within the tie tolerance of the old pick does not move it, every other point and shape keeps
    its pick, the cost model's times at the re-timed points are the new ones. Without --shapes
    every shape the table lists is re-timed. Refused: an M off the table's grid, a shape it does
    not list, another kernel set, and --retune with --update."""
    import sys
    from gemmgen.errors import GemmgenError
    library, calls = library
    first = _options(tmp_path, command="gemmgen tune --shapes both", out=str(tmp_path / "table.tuned.yaml"))
    tuning.measure(library, Store(tmp_path / "first.jsonl"), first, first.shapes)
    before = load_table(tuning.write_table(library, Store(tmp_path / "first.jsonl"), first))
    (key,) = before.classes
    plain_model = _model_us

    def remeasured(kernel, knobs, m, n, k):
        """What a new measurement finds: `mid` far ahead at m = 256; at 4096 `large` with its
        default knobs 1% ahead of the old pick (`large` along N, swizzle 4): a tie."""
        us = plain_model(kernel, knobs, m, n, k)
        if m == 256 and kernel.spec.origin.config == "mid":
            return us * 0.5
        if m == 4096 and kernel.spec.origin.config == "large" and knobs == kernel.spec.knobs:
            return us * 0.9 * 0.99
        return us
    monkeypatch.setattr(sys.modules[__name__], "_model_us", remeasured)

    def picks(table, n):
        entry = next(s for s in table.classes[key].shapes if s.n == n)
        return {m: (entry.bucket_for(m).kernel, entry.bucket_for(m).knobs) for m in GRID}

    options = _options(tmp_path, shapes=[SHAPES[1]], m_grid=(256, 4096), retune=first.out, out=None,
                       knob_top=0, settled_tolerance=0.02, command="gemmgen tune --m 256,4096 --retune t")
    retuning = tuning.table_to_retune(library, options)
    assert options.m_grid == (256, 4096) and [s.name for s in options.shapes] == ["up"]
    assert tuning.store_path(library, options).name.endswith("-seed0-retune.jsonl")
    calls.clear()
    store = Store(tmp_path / "retune.jsonl")
    tuning.measure(library, store, options, options.shapes)
    assert {p for _, p in calls} == {(256, 28672, 4096), (4096, 28672, 4096)}
    old_pick = retuning.classes[key].lookup(4096, 28672, 4096).bucket
    assert (old_pick.knobs.raster, old_pick.knobs.swizzle) == ("along_n", 4)
    assert any(c.kernel == old_pick.kernel and c.knobs == old_pick.knobs and p[0] == 4096
               for c, p in calls)  # timed though --knob-top 0 times no knob variant
    # the old pick at 256, far behind `mid` in the first pass, was re-timed side by side with it
    pick_256 = tuning._candidate_of(retuning.classes[key].lookup(256, 28672, 4096).bucket)
    assert store.get(key, 28672, 4096, 256, pick_256).settled
    row = store.times(key, {(28672, 4096)})[(28672, 4096, 4096)]
    plain_pick = tuning.selection.pick(row, tuning.candidate_rank(library), 0.02)
    assert plain_pick.kernel == old_pick.kernel and plain_pick.knobs != old_pick.knobs  # a tie the rank alone would move
    path, changed = tuning.retune_table(library, store, options, retuning)
    assert path == Path(first.out)
    after = load_table(path, known_kernels=library.kernels)
    old_up, new_up = picks(before, 28672), picks(after, 28672)
    assert library.kernels[new_up[256][0]].spec.origin.config == "mid" != \
        library.kernels[old_up[256][0]].spec.origin.config
    assert {m: p for m, p in new_up.items() if m != 256} == {m: p for m, p in old_up.items() if m != 256}
    assert picks(after, 4096) == picks(before, 4096)  # the shape not re-timed
    assert len(changed) == 1 and "n=28672 k=4096 m=256" in changed[0] and "-> " + new_up[256][0] in changed[0]
    old_times, new_times = before.classes[key].model.times, after.classes[key].model.times
    assert set(new_times) == set(old_times)
    assert {p for p in old_times if new_times[p] != old_times[p]} == {(28672, 4096, 256), (28672, 4096, 4096)}
    mid = next(k for k in new_times[(28672, 4096, 256)] if library.kernels[k].spec.origin.config == "mid")
    assert new_times[(28672, 4096, 256)][mid] < 0.6 * old_times[(28672, 4096, 256)][mid]
    text = path.read_text()
    assert "# Command: gemmgen tune --shapes both" in text
    assert "# Re-tuned by: gemmgen tune --m 256,4096 --retune t (M 256,4096; 2 points re-timed, 1 picks changed" in text
    assert after.metadata["kernel_set"] == before.metadata["kernel_set"]

    every = _options(tmp_path, shapes=[], m_grid=(), retune=first.out)
    tuning.table_to_retune(library, every)
    assert every.m_grid == GRID and {(s.n, s.k) for s in every.shapes} == {(s.n, s.k) for s in SHAPES}

    def refused(**changes) -> str:
        opts = _options(tmp_path, **{"retune": first.out, **changes})
        with pytest.raises(GemmgenError) as err:
            tuning.table_to_retune(library, opts)
        return str(err.value)

    assert "--m 300 is not on the table's M grid" in refused(m_grid=(256, 300))
    assert "does not list 1024x4096" in refused(shapes=[WeightShape("x", 1024, 4096, "test", "x:3")])
    other_set = tmp_path / "other.tuned.yaml"
    other_set.write_text(text.replace(f"kernel_set: {library.kernel_set}", "kernel_set: 0123456789abcdef"))
    assert "kernel set 0123456789abcdef" in refused(retune=str(other_set))
    monkeypatch.setattr(tuning.torch.cuda, "is_available", lambda: True)
    with pytest.raises(GemmgenError, match=r"one at a time \(given: --update, --retune\)"):
        tuning.tune(_options(tmp_path, library="demo", retune=first.out, update=first.out))
