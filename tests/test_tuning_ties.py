"""Near-ties are re-timed side by side before a winner is picked (gemmgen tune): the tuner's
determinism guarantee is "the second tune's choice is within the tolerance of the first's when
both are timed side by side", and clock drift between one-pass measurements must not break it."""

from __future__ import annotations

import itertools

from gemmgen.tuning import select
from gemmgen.tuning.measure import Candidate, Record, Store
from gemmgen.tuning.tune import TIE_WINDOW, near_ties, retime_side_by_side

CLS = ("scaled_mm", "int8", "bf16", "ScaledEpilogueBias")
A, B, C = Candidate("k_a"), Candidate("k_b"), Candidate("k_c")
BASE = {A: 10.0, B: 10.0, C: 10.1}  # A and B are truly equal; C is 1% slower: all one tie
RANK = {A: 0, B: 1, C: 2}.__getitem__  # manifest order


class DriftingGpu:
    """A GPU whose clock drifts by `drift` per timed call (power limit), as seen on the H100."""

    def __init__(self, drift: float):
        self.calls = itertools.count()
        self.drift = drift

    def time(self, c: Candidate) -> float:
        return BASE[c] * (1 + self.drift * next(self.calls))


def one_pass_pick(gpu: DriftingGpu, order) -> Candidate:
    times = {c: gpu.time(c) for c in order}
    return select.pick(times, RANK, tolerance=0.005)


def side_by_side_pick(gpu: DriftingGpu, order) -> Candidate:
    times = retime_side_by_side(list(order), gpu.time)
    return select.pick(times, RANK, tolerance=0.005)


def test_drift_breaks_one_pass_picks_and_side_by_side_fixes_them():
    # one pass: the measurement order decides the winner under drift (the defect) ...
    up, down = one_pass_pick(DriftingGpu(+0.01), [B, A, C]), one_pass_pick(DriftingGpu(-0.01), [B, A, C])
    assert up != down
    # ... interleaved rounds with a rotating order agree, and the tie goes to manifest order
    picks = {side_by_side_pick(DriftingGpu(d), order)
             for d in (+0.004, -0.004, 0.0) for order in ([A, B], [B, A])}
    assert picks == {A}


def test_retime_rotates_the_order_and_takes_medians():
    seen = []

    def time_one(c):
        seen.append(c)
        return {A: [3, 1, 2, 9, 2], B: [5, 5, 4, 6, 5]}[c][sum(1 for s in seen if s == c) - 1]

    medians = retime_side_by_side([A, B], time_one, rounds=5)
    assert medians == {A: 2, B: 5}
    assert seen[:4] == [A, B, B, A]  # round 2 starts with the other candidate


def test_near_ties_are_the_candidates_within_the_window(tmp_path):
    store = Store(tmp_path / "s.jsonl")
    tolerance = 0.02
    times = {A: 10.0, B: 10.0 * (1 + TIE_WINDOW * tolerance) - 1e-9, C: 10.0 * (1 + TIE_WINDOW * tolerance) + 0.01}
    for c, us in times.items():
        store.put(Record(CLS, 4096, 4096, 16, c.kernel, c.raster, c.swizzle, c.split_k, us))
    store.put(Record(CLS, 4096, 4096, 16, "k_fail", "heuristic", 1, 1, None, "cannot implement"))
    assert near_ties(store, CLS, 4096, 4096, 16, tolerance) == [A, B]
    assert near_ties(store, CLS, 4096, 4096, 32, tolerance) == []


def test_settled_records_survive_a_resume(tmp_path):
    path = tmp_path / "s.jsonl"
    Store(path).put(Record(CLS, 64, 64, 1, "k_a", "heuristic", 1, 1, 5.0, None, settled=True))
    with open(path, "a") as handle:  # a line written by the previous gemmgen (no `settled`)
        handle.write('{"cls": ["scaled_mm", "int8", "bf16", "ScaledEpilogueBias"], "n": 64, "k": 64, '
                     '"m": 1, "kernel": "k_b", "raster": "heuristic", "swizzle": 1, "split_k": 1, '
                     '"us": 6.0, "error": null}\n')
    reopened = Store(path)
    assert reopened.get(CLS, 64, 64, 1, A).settled
    assert reopened.get(CLS, 64, 64, 1, B).settled is False
