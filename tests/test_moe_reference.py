"""CPU tests of the MoE groundwork: the group-list handling (gemmgen/families/moe/grouping.py) and
the plain torch reference of grouped_matmul_swiglu_quant (gemmgen/reference.py): a hand-computed
case element by element, count vs cumsum, stacked vs list weights, empty experts, zero rows, the
rounding tie rule, fp8, A8W4 per-channel and per-group, the assist matrix, argument errors, and
hypothesis properties against an independent pure-Python loop and on clamped (bad) group lists.

The independent loop (`loop_reference`) uses Python floats (float64) and rounds to float32 with
struct: a float32 division a / b of float32 values computed in float64 and rounded once is the
IEEE float32 division (53 >= 2 * 24 + 2), and Python's round() is half to even like torch.round.
Scales in the property test have few significant bits, so every C is exact in float64 whatever
the order of operations, and the comparison with the reference can be exact.
"""

from __future__ import annotations

import math
import re
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gemmgen import reference
from gemmgen.families.moe import grouping
from gemmgen.families.moe.grouping import check_group_list, group_offsets, stack_weights
from gemmgen.reference import (grouped_matmul_dequant, grouped_matmul_swiglu_quant,
                               swiglu_quant_reference)

FP8 = torch.float8_e4m3fn
OP = "gemmgen.reference.grouped_matmul_swiglu_quant"


def f32(v: float) -> float:
    """v rounded to the nearest float32 (ties to even), as a Python float."""
    return struct.unpack("f", struct.pack("f", v))[0]


def swish(v: float) -> float:
    return v / (1 + math.exp(-v)) if v > -700 else 0.0 * v


def quant_row(s: list[float], qmax: int = 127) -> tuple[list[int], float]:
    """The quant rule on one row of float32 S values, int8: (q, q_scale)."""
    q_scale = f32(max(abs(v) for v in s) / qmax)
    if q_scale == 0:
        return [0] * len(s), 0.0
    return [max(-qmax, min(qmax, round(f32(v / q_scale)))) for v in s], q_scale


def loop_reference(x, w, ws, xs, counts):
    """Independent pure-Python definition (int8 / A8W4): x [M][K], w [E][K][N], ws [E][N] or
    [E][G][N] (nested lists), xs [M], counts [E] (valid) -> (q [M][N/2], q_scale [M], C)."""
    m, k, n = len(x), len(x[0]) if x else len(w[0]), len(w[0][0])
    expert_of = []
    for i, c in enumerate(counts):
        expert_of += [i] * c
    expert_of += [None] * (m - len(expert_of))
    q_out, s_out, c_out = [], [], []
    for r in range(m):
        i = expert_of[r]
        if i is None:
            q_out.append([0] * (n // 2))
            s_out.append(0.0)
            c_out.append([0.0] * n)
            continue
        scales = ws[i] if isinstance(ws[i][0], list) else [ws[i]]
        gs = k // len(scales)
        row = []
        for col in range(n):
            total = 0.0
            for g, sc in enumerate(scales):
                acc = sum(x[r][kk] * w[i][kk][col] for kk in range(g * gs, (g + 1) * gs))
                total += acc * sc[col]
            row.append(f32(total * xs[r]))
        c_out.append(row)
        h = n // 2
        s = [f32(swish(row[j]) * row[h + j]) for j in range(h)]
        q, q_scale = quant_row(s)
        q_out.append(q)
        s_out.append(q_scale)
    return q_out, s_out, c_out


def counts_to_cumsum(counts: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(counts, 0)


# ------------------------------------------------------------------- hand-computed tiny case


def tiny_case():
    """E=2, M=5 (counts [2, 2]: row 4 is past the last group), K=4, N=4.

    W0 = I; W1 = 2 * the permutation (k0->n1, k1->n0, k2->n3, k3->n2).
    C = (X·W) ⊙ x_scale ⊙ weight_scale, by hand:
      row 0 (e0): [50, 0, 2, -3]·I ⊙ [1, .5, 2, 1] ⊙ 1       = [50, 0, 4, -3]
      row 1 (e0): [-60, 40, 1, 1]·I ⊙ [1, .5, 2, 1] ⊙ .5     = [-30, 10, 1, .5]
      row 2 (e1): 2·[127, 127, 1, 2] ⊙ [.5, .5, 1, .25] ⊙ 1  = [127, 127, 2, 1]
      row 3 (e1): 2·[-6, 80, -1, 2] ⊙ [.5, .5, 1, .25] ⊙ .5  = [-3, 40, -1, .5]
      row 4: past the last group                              = 0
    """
    x = torch.tensor([[50, 0, 2, -3], [-60, 40, 1, 1], [127, 127, 2, 1], [80, -6, 2, -1],
                      [1, 2, 3, 4]], dtype=torch.int8)
    w0 = torch.eye(4, dtype=torch.int8)
    w1 = torch.zeros(4, 4, dtype=torch.int8)
    for kk, nn in ((0, 1), (1, 0), (2, 3), (3, 2)):
        w1[kk, nn] = 2
    weight = torch.stack((w0, w1))
    weight_scale = torch.tensor([[1, 0.5, 2, 1], [0.5, 0.5, 1, 0.25]], dtype=torch.float32)
    x_scale = torch.tensor([1, 0.5, 1, 0.5, 1], dtype=torch.float32)
    group_list = torch.tensor([2, 2], dtype=torch.int64)
    return x, weight, weight_scale, x_scale, group_list


def test_tiny_case_by_hand():
    x, weight, weight_scale, x_scale, group_list = tiny_case()
    c = grouped_matmul_dequant(x, weight, weight_scale, x_scale, group_list)
    expected_c = torch.tensor([[50, 0, 4, -3], [-30, 10, 1, 0.5], [127, 127, 2, 1],
                               [-3, 40, -1, 0.5], [0, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(c, expected_c)

    q, q_scale = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list)
    assert q.dtype == torch.int8 and q.shape == (5, 2)
    assert q_scale.dtype == torch.float32 and q_scale.shape == (5,)
    # S by hand: swish(v) = v / (1 + e^-v); swish(50), swish(127), swish(40) are exact in
    # float64 (e^-v < 2^-54), swish(0) = 0.
    s = [[200.0, -0.0],                                            # [50·4, 0·(-3)]
         [f32(swish(-30.0)), f32(swish(10.0) * 0.5)],              # [-2.8e-12, 4.99977]
         [254.0, 127.0],                                           # [127·2, 127·1]
         [f32(swish(-3.0) * -1.0), 20.0]]                          # [0.142278, 40·0.5]
    assert s[1][0] == pytest.approx(-2.807e-12, rel=1e-3)
    assert s[3][0] == pytest.approx(0.1422776, rel=1e-6)
    expected_scale = [f32(200 / 127), f32(s[1][1] / 127), 2.0, f32(20 / 127), 0.0]
    # row 2: S / q_scale = [127, 63.5] and 63.5 rounds half to even: 64
    # row 3: 0.142278 / (20 / 127) = 0.9035 -> 1
    expected_q = [[127, 0], [0, 127], [127, 64], [1, 127], [0, 0]]
    for r in range(5):
        assert q_scale[r].item() == expected_scale[r], r
        for j in range(2):
            assert q[r, j].item() == expected_q[r][j], (r, j)
    # the same through the independent loop
    lq, ls, lc = loop_reference(x.tolist(), weight.tolist(), weight_scale.tolist(),
                                x_scale.tolist(), [2, 2])
    assert lq == expected_q and ls == expected_scale and lc == expected_c.tolist()
    # and through the unfused path: C, then SwiGLU + quant
    q2, s2 = swiglu_quant_reference(c)
    assert torch.equal(q2, q) and torch.equal(s2, q_scale)


def test_count_and_cumsum_agree():
    x, weight, weight_scale, x_scale, group_list = tiny_case()
    a = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list, "count")
    b = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale,
                                    counts_to_cumsum(group_list), "cumsum")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    starts, ends = group_offsets(torch.tensor([2, 0, 3]), "count", 6)
    assert starts.tolist() == [0, 2, 2] and ends.tolist() == [2, 2, 5]
    starts2, ends2 = group_offsets(torch.tensor([2, 2, 5]), "cumsum", 6)
    assert torch.equal(starts, starts2) and torch.equal(ends, ends2)


def test_stacked_and_list_weights_agree():
    x, weight, weight_scale, x_scale, group_list = tiny_case()
    a = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list)
    b = grouped_matmul_swiglu_quant(x, list(weight.unbind(0)), list(weight_scale.unbind(0)),
                                    x_scale, group_list)
    c = grouped_matmul_swiglu_quant(x, tuple(weight.unbind(0)), weight_scale, x_scale,
                                    group_list)
    for other in (b, c):
        assert torch.equal(a[0], other[0]) and torch.equal(a[1], other[1])
    assert stack_weights(weight) is weight
    assert torch.equal(stack_weights(list(weight.unbind(0))), weight)


def test_empty_experts_and_unused_weights():
    gen = torch.Generator().manual_seed(1)
    e, m, k, n = 4, 6, 5, 4
    x = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(-128, 128, (e, k, n), generator=gen, dtype=torch.int8)
    weight_scale = torch.randint(1, 8, (e, n), generator=gen).float() / 64
    x_scale = torch.randint(1, 8, (m,), generator=gen).float() / 16
    counts = torch.tensor([0, 3, 0, 2])                     # row 5 past the last group
    q, s = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, counts)
    lq, ls, _ = loop_reference(x.tolist(), weight.tolist(), weight_scale.tolist(),
                               x_scale.tolist(), counts.tolist())
    assert q.tolist() == lq and s.tolist() == ls
    assert q[5].tolist() == [0, 0] and s[5].item() == 0
    # the weights of empty experts are never read
    other = weight.clone()
    other[0], other[2] = 7, -7
    q2, s2 = grouped_matmul_swiglu_quant(x, other, weight_scale, x_scale, counts)
    assert torch.equal(q, q2) and torch.equal(s, s2)
    # every expert empty: every row is past the last group
    q3, s3 = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale,
                                         torch.zeros(4, dtype=torch.int64))
    assert not q3.any() and not s3.any()
    # M = 0
    q4, s4 = grouped_matmul_swiglu_quant(x[:0], weight, weight_scale, x_scale[:0],
                                         torch.zeros(4, dtype=torch.int64), "cumsum")
    assert q4.shape == (0, 2) and s4.shape == (0,)


def test_all_zero_rows_give_zero_not_nan():
    x, weight, weight_scale, x_scale, group_list = tiny_case()
    x = x.clone()
    x[0] = 0                                # C row 0 all zero
    x_scale = x_scale.clone()
    x_scale[2] = 0                          # C row 2 all zero through its scale
    x[3] = torch.tensor([0, 0, -6, 2])      # act = 0 (X·W1 puts x1, x0 in the act half): S = 0
    c = grouped_matmul_dequant(x, weight, weight_scale, x_scale, group_list)
    assert not c[3, :2].any() and c[3, 2:].all()
    q, s = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list)
    assert torch.isfinite(s).all()
    for r in (0, 2, 3, 4):
        assert q[r].tolist() == [0, 0] and s[r].item() == 0.0, r
    assert q[1].tolist() == [0, 127]
    for dtype in (torch.int8, FP8):
        zq, zs = swiglu_quant_reference(torch.zeros(3, 6), dtype)
        assert zq.dtype == dtype and not zq.float().isnan().any() and not zq.float().any()
        assert torch.equal(zs, torch.zeros(3))
    # max|S| / 127 underflowing to 0 counts as a zero row too
    tiny = torch.tensor([[1.0, 2.0 ** -147]])    # S = 3 * 2^-149 (subnormal); / 127 -> 0
    zq, zs = swiglu_quant_reference(tiny)
    assert zq.tolist() == [[0]] and zs.tolist() == [0.0]


def test_tie_rule_half_to_even():
    # act = 128: swish(128) = 128 exactly in float64, so S = 128 * gate exactly
    targets = [127, 0.5, 1.5, 2.5, -0.5, -2.5, 3.5, -3.5, 4.5, 63.5]
    c = torch.tensor([[128.0] * len(targets) + [t / 128 for t in targets]])
    q, s = swiglu_quant_reference(c)
    assert s.tolist() == [1.0]
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, 4, -4, 4, 64]]
    # fp8: act = 64, q_scale = 448 / 448 = 1; e4m3 steps are 1 in [8, 16), 1/32 in [1/4, 1/2)
    targets = [448, 13.5, 12.5, -13.5, 0.3, 9.5]
    c = torch.tensor([[64.0] * len(targets) + [t / 64 for t in targets]])
    q, s = swiglu_quant_reference(c, FP8)
    assert q.dtype == FP8 and s.tolist() == [1.0]
    assert q.float().tolist() == [[448, 14, 12, -14, 0.3125, 10]]


def test_fp8_tiny_case():
    """E=2, M=3 (counts [1, 1]), K=2, N=4, all values exact in e4m3:
    row 0: [2, .5]·W0 = [64, 8, 7, .5] -> S = [448, swish(8)·.5 = 3.99866] -> q_scale 1,
           q = [448, 4]
    row 1: 2·([-1, 3]·W1) = 2·[32, 12, 13.5, -.5] = [64, 24, 27, -1] -> S = [1728, -24.0]
           -> q_scale 1728/448, q = [448, -6.22 -> -6] (e4m3 step .5 in [4, 8))
    row 2: past the last group."""
    x = torch.tensor([[2, 0.5], [-1, 3], [1, 1]]).to(FP8)
    weight = torch.tensor([[[32, 0, 3.5, 0], [0, 16, 0, 1]],
                           [[-32, 0, 0, 0.5], [0, 4, 4.5, 0]]]).to(FP8)
    weight_scale = torch.ones(2, 4)
    x_scale = torch.tensor([1.0, 2.0, 1.0])
    group_list = torch.tensor([1, 1])
    c = grouped_matmul_dequant(x, weight, weight_scale, x_scale, group_list)
    assert c.tolist() == [[64, 8, 7, 0.5], [64, 24, 27, -1], [0, 0, 0, 0]]
    q, s = grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list)
    assert q.dtype == FP8 and q.shape == (3, 2)
    assert f32(swish(8.0) * 0.5) == pytest.approx(3.99866, rel=1e-5)
    assert s.tolist() == [1.0, f32(1728 / 448), 0.0]
    assert q.float().tolist() == [[448, 4], [448, -6], [0, 0]]
    with pytest.raises(ValueError, match=re.escape(f"{OP}: argument 'weight_bits'")):
        grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list, weight_bits=4)
    with pytest.raises(ValueError, match=re.escape(f"{OP}: argument 'weight'")):
        grouped_matmul_swiglu_quant(x, weight.view(torch.int8), weight_scale, x_scale,
                                    group_list)


# -------------------------------------------------------------------------------- A8W4


def a8w4_case(seed, e=3, m=9, k=8, n=6, groups=2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(-8, 8, (e, k, n), generator=gen, dtype=torch.int8)
    scale_pg = torch.rand(e, groups, n, generator=gen) / 16 + 0.001
    x_scale = torch.rand(m, generator=gen) / 4 + 0.01
    counts = torch.tensor([3, 0, 4])
    return x, weight, scale_pg, x_scale, counts


def test_a8w4_per_channel_equals_a8w8():
    x, weight, scale_pg, x_scale, counts = a8w4_case(2)
    ws = scale_pg[:, 0]                                       # [E, N] per-channel
    a = grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts)               # A8W8
    b = grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_bits=4)
    c = grouped_matmul_swiglu_quant(x, weight, ws.unsqueeze(1), x_scale, counts)  # [E, 1, N]
    d = grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_bits=8)
    for other in (b, c, d):
        assert torch.equal(a[0], other[0]) and torch.equal(a[1], other[1])
    assert a[0].abs().max() == 127


def test_a8w4_per_group_against_float64():
    x, weight, scale_pg, x_scale, counts = a8w4_case(3)
    e, k, n = weight.shape
    groups = scale_pg.shape[1]
    gs = k // groups
    direct = torch.zeros(x.shape[0], n, dtype=torch.float64)
    start = 0
    for i, count in enumerate(counts.tolist()):
        for r in range(start, start + count):
            for col in range(n):
                total = 0.0
                for g in range(groups):
                    part = sum(int(x[r, kk]) * int(weight[i, kk, col])
                               for kk in range(g * gs, (g + 1) * gs))
                    total += part * float(scale_pg[i, g, col])
                direct[r, col] = total * float(x_scale[r])
        start += count
    c = grouped_matmul_dequant(x, weight, scale_pg, x_scale, counts)      # 3-D: A8W4 inferred
    assert torch.equal(c, direct.to(torch.float32))
    q, s = grouped_matmul_swiglu_quant(x, weight, scale_pg, x_scale, counts, weight_bits=4)
    q2, s2 = swiglu_quant_reference(direct.to(torch.float32))
    assert torch.equal(q, q2) and torch.equal(s, s2)
    # per-group differs from using the first group's scales per-channel
    c1 = grouped_matmul_dequant(x, weight, scale_pg[:, 0], x_scale, counts)
    assert not torch.equal(c, c1)
    # int4 range is checked
    bad = weight.clone()
    bad[1, 2, 3] = 8
    with pytest.raises(ValueError, match=re.escape("int4 values -8..7 (weight_bits=4); "
                                                   "got values in -8..8")):
        grouped_matmul_swiglu_quant(x, bad, scale_pg, x_scale, counts)
    with pytest.raises(ValueError, match="per-group scales .* are A8W4's"):
        grouped_matmul_swiglu_quant(x, weight, scale_pg, x_scale, counts, weight_bits=8)
    with pytest.raises(ValueError, match=re.escape("argument 'weight_scale'")):
        grouped_matmul_swiglu_quant(x, weight, torch.ones(e, 3, n), x_scale, counts)  # 3 ∤ 8


def test_weight_assist_matrix():
    x, weight, scale_pg, x_scale, counts = a8w4_case(4)
    ws = scale_pg[:, 0]
    # per-channel: computed in float64 then rounded: the same float32 value as in float32
    wam = (8 * ws.double() * weight.double().sum(1)).float()
    plain = grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_bits=4)
    given_ = grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_bits=4,
                                         weight_assist_matrix=wam)
    assert torch.equal(plain[0], given_[0]) and torch.equal(plain[1], given_[1])
    grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_bits=4,
                                weight_assist_matrix=list(wam.unbind(0)))
    off = wam.clone()
    off[2, 1] = torch.nextafter(off[2, 1], torch.tensor(float("inf")))
    with pytest.raises(ValueError, match=re.escape("weight_assist_matrix[2, 1] =")):
        grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_bits=4,
                                    weight_assist_matrix=off)
    with pytest.raises(ValueError, match=re.escape("argument 'weight_assist_matrix': expected "
                                                   "None or a torch.float32 tensor [E=3, N=6]")):
        grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_bits=4,
                                    weight_assist_matrix=wam[:, :4])
    with pytest.raises(ValueError, match=re.escape("expected None: the assist matrix is A8W4's")):
        grouped_matmul_swiglu_quant(x, weight, ws, x_scale, counts, weight_assist_matrix=wam)
    # per-group: summed in float32 in some order, accepted; a wrong value refused
    e, k, n = weight.shape
    per_k = scale_pg.repeat_interleave(k // scale_pg.shape[1], dim=1)      # [E, K, N]
    wam_pg = 8 * (weight.float() * per_k).flip(1).cumsum(1)[:, -1]
    grouped_matmul_swiglu_quant(x, weight, scale_pg, x_scale, counts,
                                weight_assist_matrix=wam_pg)
    with pytest.raises(ValueError, match=re.escape("weight_assist_matrix[0, 0] =")):
        grouped_matmul_swiglu_quant(x, weight, scale_pg, x_scale, counts,
                                    weight_assist_matrix=wam_pg + 0.5)


# --------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize("values, typ, m, got", [
    ([2, -1, 3], "count", 9, "got group_list[1] = -1"),
    ([2, 3, 4, 1], "count", 9, "got a running total of 10 at group_list[3] = 1"),
    ([-2, 3], "cumsum", 9, "got group_list[0] = -2"),
    ([2, 5, 4, 9], "cumsum", 9, "got group_list[2] = 4 < group_list[1] = 5"),
    ([2, 5, 10, 12], "cumsum", 9, "got group_list[2] = 10"),
    ([1, 2, -1, 20], "count", 9, "got group_list[2] = -1"),   # the first bad entry
])
def test_group_list_errors_name_the_entry(values, typ, m, got):
    gl = torch.tensor(values, dtype=torch.int64)
    with pytest.raises(ValueError, match=re.escape(got)) as info:
        check_group_list(gl, typ, m)
    assert str(info.value).startswith("gemmgen.check_group_list: argument 'group_list': expected")
    with pytest.raises(ValueError, match=re.escape(got)):
        group_offsets(gl, typ, m)
    e = len(values)
    with pytest.raises(ValueError, match=re.escape(f"{OP}: argument 'group_list'") + ".*"
                       + re.escape(got)):
        grouped_matmul_swiglu_quant(torch.zeros(m, 2, dtype=torch.int8),
                                    torch.zeros(e, 2, 4, dtype=torch.int8), torch.ones(e, 4),
                                    torch.ones(m), gl, typ)
    group_offsets(gl, typ, m, check=False)          # no value check: clamped, no error


@pytest.mark.parametrize("gl, expected", [
    (torch.tensor([1, 2], dtype=torch.int32), "a 1-D torch.int64 tensor [E]"),
    (torch.tensor([[1, 2]]), "a 1-D torch.int64 tensor [E]"),
    (torch.tensor([], dtype=torch.int64), "E >= 1"),
    ([1, 2], "a 1-D torch.int64 tensor [E]"),
])
def test_group_list_metadata_errors(gl, expected):
    for check in (True, False):
        with pytest.raises(ValueError, match=re.escape(expected)):
            group_offsets(gl, "count", 4, check=check)
    with pytest.raises(ValueError, match=re.escape("gemmgen.check_group_list: argument "
                                                   "'group_list'")):
        check_group_list(gl, "count", 4)


def test_other_grouping_errors():
    gl = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=re.escape("argument 'group_list_type': expected "
                                                   "'count' or 'cumsum'; got 'counts'")):
        group_offsets(gl, "counts", 4)
    with pytest.raises(ValueError, match=re.escape("argument 'm'")):
        group_offsets(gl, "count", -1)
    x, weight, weight_scale, x_scale, group_list = tiny_case()
    with pytest.raises(ValueError, match=re.escape("argument 'group_list': expected E=2 "
                                                   "entries")):
        grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, torch.tensor([1, 1, 1]))


def test_stack_weights_errors_name_the_index():
    w = [torch.zeros(4, 6, dtype=torch.int8) for _ in range(3)]
    for bad, what in ((torch.zeros(4, 6, dtype=torch.int16), "torch.int16"),
                      (torch.zeros(4, 5, dtype=torch.int8), "shape (4, 5)"),
                      ("w", "str")):
        with pytest.raises(ValueError, match=re.escape("gemmgen.stack_weights: argument "
                                                       "'weight[2]': expected a torch.int8 "
                                                       "tensor of shape (4, 6) on cpu like "
                                                       "weight[0]; got ") + ".*" + re.escape(what)):
            stack_weights(w[:2] + [bad])
    for empty in ([], (), None, 3):
        with pytest.raises(ValueError, match=re.escape("argument 'weight'")):
            stack_weights(empty)
    with pytest.raises(ValueError, match=re.escape("argument 'weight_scale[1]'")):
        stack_weights([torch.ones(6), torch.ones(6, dtype=torch.float64)],
                      argument="weight_scale")
    x, weight, weight_scale, x_scale, group_list = tiny_case()
    with pytest.raises(ValueError, match=re.escape(f"{OP}: argument 'weight_scale[1]'")):
        grouped_matmul_swiglu_quant(x, weight, [weight_scale[0], weight_scale[1, :2]], x_scale,
                                    group_list)
    with pytest.raises(ValueError, match=re.escape(f"{OP}: argument 'weight[1]'")):
        grouped_matmul_swiglu_quant(x, [weight[0], weight[1].float()], weight_scale, x_scale,
                                    group_list)


def test_reference_argument_errors():
    x, weight, weight_scale, x_scale, group_list = tiny_case()
    cases = [
        ("x", dict(x=x.float())),
        ("weight", dict(weight=weight[:, :3])),
        ("weight", dict(weight=weight[:, :, :3])),               # N odd
        ("weight_scale", dict(weight_scale=weight_scale.double())),
        ("weight_scale", dict(weight_scale=weight_scale[:, :2])),
        ("x_scale", dict(x_scale=x_scale[:4])),
        ("x_scale", dict(x_scale=x_scale.double())),
        ("weight_bits", dict(weight_bits=16)),
        ("group_list_type", dict(group_list_type="offsets")),
    ]
    args = dict(x=x, weight=weight, weight_scale=weight_scale, x_scale=x_scale,
                group_list=group_list)
    for argument, change in cases:
        kwargs = {**args, **change}
        with pytest.raises(ValueError, match=re.escape(f"{OP}: argument '{argument}'")):
            grouped_matmul_swiglu_quant(**kwargs)
    bad = x_scale.clone()
    bad[1] = float("nan")
    with pytest.raises(ValueError, match=re.escape("argument 'x_scale': expected finite")):
        grouped_matmul_swiglu_quant(x, weight, weight_scale, bad, group_list)
    with pytest.raises(ValueError, match=re.escape("gemmgen.reference.swiglu_quant_reference: "
                                                   "argument 'c'")):
        swiglu_quant_reference(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=re.escape("argument 'dtype'")):
        swiglu_quant_reference(torch.zeros(2, 4), torch.float16)
    with pytest.raises(ValueError, match=re.escape("argument 'c': expected finite")):
        swiglu_quant_reference(torch.tensor([[float("inf"), 1.0]]))


# ------------------------------------------------------------------------ hypothesis properties


@st.composite
def moe_cases(draw):
    e = draw(st.integers(1, 4))
    m = draw(st.integers(0, 7))
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    k = groups * draw(st.integers(1, 3))
    n = 2 * draw(st.integers(1, 3))
    ends = sorted(draw(st.lists(st.integers(0, m), min_size=e, max_size=e)))
    counts = [b - a for a, b in zip([0] + ends[:-1], ends)]
    bits = 4 if groups > 1 else draw(st.sampled_from([8, 4]))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    gen = torch.Generator().manual_seed(seed)
    lo, hi = (-8, 8) if bits == 4 else (-128, 128)
    x = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(lo, hi, (e, k, n), generator=gen, dtype=torch.int8)

    def few_bit(shape, low):   # (low..15) * 2^(-6..2): exact products in float64
        mant = torch.randint(low, 16, shape, generator=gen).double()
        return (mant * 2.0 ** torch.randint(-6, 3, shape, generator=gen).double()).float()

    scale_shape = (e, groups, n) if (groups > 1 or draw(st.booleans())) and bits == 4 else (e, n)
    weight_scale = few_bit(scale_shape, 1)
    x_scale = few_bit((m,), 0)                      # 0 gives all-zero rows
    return dict(x=x, weight=weight, weight_scale=weight_scale, x_scale=x_scale, counts=counts,
                bits=bits, as_list=draw(st.booleans()), typ=draw(st.sampled_from(["count",
                                                                                  "cumsum"])))


@settings(max_examples=150, deadline=None)
@given(case=moe_cases())
def test_reference_equals_independent_loop(case):
    counts = torch.tensor(case["counts"], dtype=torch.int64)
    group_list = counts if case["typ"] == "count" else counts_to_cumsum(counts)
    weight = list(case["weight"].unbind(0)) if case["as_list"] else case["weight"]
    q, s = grouped_matmul_swiglu_quant(case["x"], weight, case["weight_scale"], case["x_scale"],
                                       group_list, case["typ"], weight_bits=case["bits"])
    lq, ls, lc = loop_reference(case["x"].tolist(), case["weight"].tolist(),
                                case["weight_scale"].tolist(), case["x_scale"].tolist(),
                                case["counts"])
    c = grouped_matmul_dequant(case["x"], weight, case["weight_scale"], case["x_scale"],
                               group_list, case["typ"], weight_bits=case["bits"])
    assert c.tolist() == lc
    assert q.tolist() == lq
    assert s.tolist() == ls
    assert torch.isfinite(s).all()


def _python_offsets(values, typ, m):
    ends = []
    total = 0
    for v in values:
        total = total + v if typ == "count" else v
        ends.append(total)
    return [0] + ends[:-1], ends


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.integers(-6, 25), st.integers(-2 ** 63, 2 ** 63 - 1)),
                       min_size=1, max_size=8),
       m=st.integers(0, 20), typ=st.sampled_from(["count", "cumsum"]))
def test_unchecked_offsets_stay_in_bounds(values, m, typ):
    gl = torch.tensor(values, dtype=torch.int64)
    starts, ends = group_offsets(gl, typ, m, check=False)
    assert starts.dtype == ends.dtype == torch.int64 and starts.shape == ends.shape == gl.shape
    s, e = starts.tolist(), ends.tolist()
    assert s[0] == 0
    assert all(0 <= a <= b <= m for a, b in zip(s, e))
    assert s[1:] == e[:-1]                          # contiguous, in order, no overlap
    try:
        check_group_list(gl, typ, m)
    except ValueError:
        return
    # a valid list: the clamps change nothing
    assert (s, e) == tuple(_python_offsets(values, typ, m))
    checked = group_offsets(gl, typ, m)
    assert torch.equal(checked[0], starts) and torch.equal(checked[1], ends)


def test_unchecked_offsets_need_no_values():
    """check=False reads no value (no host sync): it runs on meta tensors, where .item() or
    .tolist() would raise."""
    gl = torch.empty(5, dtype=torch.int64, device="meta")
    for typ in ("count", "cumsum"):
        starts, ends = group_offsets(gl, typ, 100, check=False)
        assert starts.device.type == ends.device.type == "meta"
        assert starts.shape == ends.shape == (5,) and starts.dtype == torch.int64
    with pytest.raises(NotImplementedError, match="meta tensor; no data"):  # a value is read
        group_offsets(gl, "count", 100, check=True)


def test_group_list_types_and_quant_max():
    assert grouping.GROUP_LIST_TYPES == ("count", "cumsum")
    assert reference.QUANT_MAX == {torch.int8: 127, FP8: 448}
