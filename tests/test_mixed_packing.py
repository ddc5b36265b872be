"""CPU tests of the mixed-input weight packing (gemmgen/families/mixed/packing.py) and of the plain
torch references (gemmgen/reference.py): pack -> unpack round trips for every weight type, the
layout byte by byte on hand-computed cases, the zero-point conversion proved exact over every
float16 / bfloat16 scale, dequantize against the formula, and every argument error."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gemmgen import reference
from gemmgen.families.mixed import packing
from gemmgen.families.mixed.packing import (ARCH_LAYOUTS, LAYOUT_VERSION, WEIGHT_TYPES, Sm90Layout,
                                            default_arch, dequantize, pack_weights, same_layout,
                                            unpack_weights)

SCALE_DTYPES = (torch.float16, torch.bfloat16)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
RANGE = {"int4": (-8, 7), "uint4b8": (0, 15), "uint4": (0, 15), "int8": (-128, 127),
         "uint8b128": (0, 255)}
OFFSET = {"int4": 0, "uint4b8": 8, "int8": 0, "uint8b128": 128}
Q_DTYPES = {  # integer dtypes that hold every logical value of the type
    "int4": (torch.int8, torch.int16, torch.int32, torch.int64),
    "uint4b8": (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64),
    "uint4": (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64),
    "int8": (torch.int8, torch.int16, torch.int32, torch.int64),
    "uint8b128": (torch.uint8, torch.int16, torch.int32, torch.int64),
}


def nibble(packed, n: int, k: int) -> int:
    """The 4-bit field holding element (n, k) of a packed 4-bit weight, located by the layout
    version 2 formula of packing.py's docstring (written out here, independently of the packer's
    reshapes): block [k // 64, n // 16], nibble 128 r0 + r1 + 4 k0 + 32 k1 + 2 k2 + 8 j."""
    rb, r = divmod(n, 16)
    r1, r0 = divmod(r, 8)
    kb, kk = divmod(k, 64)
    j, rest = divmod(kk, 16)
    k2, rest = divmod(rest, 8)
    k1, k0 = divmod(rest, 2)
    index = 128 * r0 + r1 + 4 * k0 + 32 * k1 + 2 * k2 + 8 * j
    byte = int(packed.qweight[kb, rb, index // 2])
    return (byte >> (4 * (index % 2))) & 0xF


def bits16(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a float16 / bfloat16 tensor (compare exactly, -0.0 included)."""
    return t.contiguous().view(torch.int16)


def random_case(weight_type, n, k, group, scale_dtype, q_dtype, seed, device="cpu"):
    """(q [N, K], scales [N, G], zeros [N, G] or None) with the type's extremes present."""
    gen = torch.Generator().manual_seed(seed)
    low, high = RANGE[weight_type]
    groups = k // group
    q = torch.randint(low, high + 1, (n, k), generator=gen, dtype=torch.int64)
    q[0, 0], q[-1, -1] = low, high
    magnitude = 10.0 ** (torch.rand(n, groups, generator=gen) * 6 - 4)       # 1e-4 .. 1e2
    scales = (torch.randn(n, groups, generator=gen) * magnitude).to(scale_dtype)
    zeros = None
    if weight_type == "uint4":
        scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        zeros = torch.randint(0, 16, (n, groups), generator=gen, dtype=torch.int64)
        zeros[0, 0], zeros[-1, -1] = 0, 15
    else:
        scales[0, 0] = 0                       # an all-zero group is legal without zero points
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(q.to(q_dtype)), to(scales), to(zeros)


@st.composite
def cases(draw):
    weight_type = draw(st.sampled_from(WEIGHT_TYPES))
    n = 8 * draw(st.integers(1, 12))
    k = 64 * draw(st.integers(1, 10))
    group = draw(st.sampled_from([g for g in (32, 64, 128, k) if k % g == 0]))
    return dict(weight_type=weight_type, n=n, k=k, group=group,
                scale_dtype=draw(st.sampled_from(SCALE_DTYPES)),
                q_dtype=draw(st.sampled_from(Q_DTYPES[weight_type])),
                seed=draw(st.integers(0, 2**31 - 1)),
                group_arg=draw(st.sampled_from(["value", "none"])) if group == k else "value",
                flat=draw(st.booleans()) if group == k else False,
                act_order=draw(st.booleans()) if group < k else False)


def act_order_g_idx(k: int, group: int, seed: int, device="cpu") -> torch.Tensor:
    """GPTQ desc_act's g_idx: groups numbered along a random quantization order of K."""
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = torch.arange(k, dtype=torch.int32) // group
    return g_idx.to(device)


def check_round_trip(c, device):
    q, scales, zeros = random_case(c["weight_type"], c["n"], c["k"], c["group"], c["scale_dtype"],
                                   c["q_dtype"], c["seed"], device)
    n, k, groups = c["n"], c["k"], c["k"] // c["group"]
    s_in, z_in = scales, zeros
    if c["flat"]:                                       # per-channel: [N] is accepted too
        s_in = scales.reshape(n)
        z_in = None if zeros is None else zeros.reshape(n)
    group_arg = None if c["group_arg"] == "none" else c["group"]
    g_idx = act_order_g_idx(k, c["group"], c["seed"], device) if c["act_order"] else None
    packed = pack_weights(q, s_in, z_in, weight_type=c["weight_type"], group_size=group_arg,
                          g_idx=g_idx)
    assert packed.act_order == c["act_order"]
    if g_idx is None:
        assert torch.equal(packed.g_idx, torch.arange(k, device=q.device) // c["group"])
    else:  # K stored in group order: kernel position j is feature k_perm[j], of group j // group
        assert torch.equal(packed.g_idx, g_idx.long())
        assert torch.equal(g_idx.long()[packed.k_perm], torch.arange(k, device=q.device) // c["group"])

    bits = 4 if "4" in c["weight_type"] else 8
    assert (packed.weight_type, packed.group_size, packed.k, packed.n) == \
        (c["weight_type"], c["group"], k, n)
    assert (packed.bits, packed.layout_version, packed.arch) == (bits, LAYOUT_VERSION, "sm90a")
    assert packed.device == q.device and packed.scale_dtype == c["scale_dtype"]
    want_q = (torch.uint8, (k // 64, -(-n // 16), 512)) if bits == 4 else (torch.int8, (n, k))
    assert (packed.qweight.dtype, tuple(packed.qweight.shape)) == want_q
    assert tuple(packed.scales.shape) == (groups, n) and packed.scales.is_contiguous()
    assert packed.qweight.is_contiguous()
    assert packed.has_zeros == (c["weight_type"] == "uint4")
    if packed.has_zeros:
        assert packed.zeros.dtype == c["scale_dtype"] and tuple(packed.zeros.shape) == (groups, n)
        assert packed.zeros.is_contiguous()

    q_out, s_out, z_out = unpack_weights(packed)
    assert q_out.dtype == torch.int32 and q_out.device == q.device
    assert torch.equal(q_out, q.to(torch.int32))
    assert s_out.dtype == c["scale_dtype"] and torch.equal(bits16(s_out), bits16(scales))
    if zeros is None:
        assert z_out is None
    else:
        assert z_out.dtype == torch.int32 and torch.equal(z_out, zeros.to(torch.int32))


@settings(max_examples=120, deadline=None)
@given(cases())
def test_round_trip_cpu(c):
    check_round_trip(c, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@settings(max_examples=40, deadline=None)
@given(cases())
def test_round_trip_cuda(c):
    check_round_trip(c, "cuda")


# ---------------------------------------------------------------- the layout, by hand

def test_fragment_order_uint4b8_by_hand():
    q = torch.full((8, 64), 8, dtype=torch.int32)      # stored 0 everywhere else
    q[0, :16] = torch.arange(16)
    q[3, 63] = 15
    packed = pack_weights(q, torch.ones(8, 1, dtype=torch.float16), weight_type="uint4b8",
                          group_size=64)
    assert tuple(packed.qweight.shape) == (1, 1, 512)  # one block: 16 rows (8 of them padding)
    # stored = q - 8 as two's-complement int4: q=0 -> 0x8, 1 -> 0x9, ..., 7 -> 0xF, 8 -> 0x0 ...
    # Lane 0 (row 0, k slots 0, 1, 8, 9 of each 16-k step) owns bytes 0-15; word 0 (bytes 0-3)
    # holds step 0: nibble i = fragment value [0, 2, 4, 6, 1, 3, 5, 7][i], value 2r + h the
    # register r's half h: nibble 0 = (row 0, k 0), 1 = (row 8, k 0), 2 = (row 0, k 8),
    # 3 = (row 8, k 8), 4 = (row 0, k 1), 5 = (row 8, k 1), 6 = (row 0, k 9), 7 = (row 8, k 9).
    assert packed.qweight[0, 0, :4].tolist() == [0x08, 0x00, 0x09, 0x01]
    # lane 1 (q = 1: k slots 2, 3, 10, 11) owns bytes 16-31
    assert packed.qweight[0, 0, 16:20].tolist() == [0x0A, 0x02, 0x0B, 0x03]
    # lanes 2 and 3: k 4, 5, 12, 13 and 6, 7, 14, 15
    assert packed.qweight[0, 0, 32:36].tolist() == [0x0C, 0x04, 0x0D, 0x05]
    assert packed.qweight[0, 0, 48:52].tolist() == [0x0E, 0x06, 0x0F, 0x07]
    # row 3, k 63: lane 4 * 3 + 3 = 15, step 3 (word 3: bytes 12-15), slot 15 = 2q + 9: nibble 6
    assert packed.qweight[0, 0, 15 * 16 + 12 + 3].item() == 0x07
    nonzero = {0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51, 15 * 16 + 15}
    assert all(packed.qweight[0, 0, i].item() == 0 for i in range(512) if i not in nonzero)


def test_fragment_order_int4_by_hand():
    q = torch.zeros(24, 128, dtype=torch.int8)
    q[0, :6] = torch.tensor([-8, 7, -1, 0, 3, -5])
    q[17, 64 + 16 + 9] = -3                   # block [1, 1]: row 1 of it, step 1, slot 9
    packed = pack_weights(q, torch.ones(24, dtype=torch.bfloat16), weight_type="int4",
                          group_size=None)
    assert packed.group_size == 128 and tuple(packed.qweight.shape) == (2, 2, 512)
    # k 0, 1 (lane 0: nibbles 0, 4), 2, 3 (lane 1), 4, 5 (lane 2)
    assert packed.qweight[0, 0, 0].item() == 0x08 and packed.qweight[0, 0, 2].item() == 0x07
    assert packed.qweight[0, 0, 16].item() == 0x0F and packed.qweight[0, 0, 18].item() == 0x00
    assert packed.qweight[0, 0, 32].item() == 0x03 and packed.qweight[0, 0, 34].item() == 0x0B
    # row 17 = block row 1 (r0 = 1, r1 = 0), k 89 = block k 25: step 1, slot 9 = 2q + 9 with
    # q = 0: lane 4, word 1, fragment value 5 (register 2, high half): nibble 6 of the word, the
    # low nibble of its byte 3
    assert packed.qweight[1, 1, 4 * 16 + 4 + 3].item() == 0x0D
    assert nibble(packed, 17, 89) == 0xD and nibble(packed, 0, 1) == 0x7
    # rows 24..31 of the second row block are padding: zero
    assert int(packed.qweight.count_nonzero()) == 6


def test_eight_bit_stored_values_by_hand():
    q = torch.zeros(8, 64, dtype=torch.int16)
    q[0, :4] = torch.tensor([0, 255, 128, 129])
    packed = pack_weights(q + torch.where(torch.arange(64) < 4, 0, 128).to(torch.int16),
                          torch.ones(8, 1, dtype=torch.float16), weight_type="uint8b128",
                          group_size=64)
    assert packed.qweight.dtype == torch.int8
    assert packed.qweight[0, :5].tolist() == [-128, 127, 0, 1, 0]
    q8 = torch.zeros(8, 64, dtype=torch.int8)
    q8[0, :2] = torch.tensor([-128, 127])
    assert pack_weights(q8, torch.ones(8, 1, dtype=torch.float16), weight_type="int8",
                        group_size=64).qweight[0, :3].tolist() == [-128, 127, 0]


def test_zero_points_by_hand_float16():
    """uint4: stored = q - 8, zp = scale * (8 - zero) in the scale dtype, [G, N] N fastest."""
    q = torch.zeros(8, 128, dtype=torch.uint8)
    q[0, 0], q[0, 1], q[1, 64] = 3, 12, 15
    scales = torch.ones(8, 2, dtype=torch.float16)
    zeros = torch.full((8, 2), 8, dtype=torch.int32)
    scales[0, 0], zeros[0, 0] = 0.5, 3          # zp = 0.5 * 5 = 2.5   = 0x4100
    scales[1, 0], zeros[1, 0] = 0.5, 12         # zp = 0.5 * -4 = -2.0 = 0xC000
    scales[1, 1], zeros[1, 1] = 2.0, 0          # zp = 2 * 8 = 16.0    = 0x4C00
    packed = pack_weights(q, scales, zeros, weight_type="uint4", group_size=64)
    zp = packed.zeros.view(torch.int16).to(torch.int32) & 0xFFFF
    assert zp[0, 0].item() == 0x4100            # group 0, n 0
    assert zp[0, 1].item() == 0xC000            # group 0, n 1
    assert zp[1, 1].item() == 0x4C00            # group 1, n 1
    assert zp[1, 0].item() == 0 and (zp[:, 2:] == 0).all()   # zero 8 -> zp 0
    assert packed.scales[0, 0].item() == 0.5 and packed.scales[1, 1].item() == 2.0
    # stored 3-8 = -5 -> 0xB, 12-8 = 4 -> 0x4; q = 0 -> 0x8; 15 -> 0x7
    assert (nibble(packed, 0, 0), nibble(packed, 0, 1), nibble(packed, 0, 2)) == (0xB, 0x4, 0x8)
    assert nibble(packed, 1, 64) == 0x7 and nibble(packed, 1, 65) == 0x8
    # what the kernel computes from the packed fields, stored * scale + zp, is scale * (q - zero)
    # here (no rounding): q 3 and 12 against zero 3 in group 0, row 0
    signed = lambda code: code - 16 if code >= 8 else code  # noqa: E731
    scale, zp = packed.scales[0, 0].item(), packed.zeros[0, 0].item()
    assert signed(nibble(packed, 0, 0)) * scale + zp == 0.5 * (3 - 3)
    assert signed(nibble(packed, 0, 1)) * scale + zp == 0.5 * (12 - 3)


def test_zero_point_rounding_by_hand_bfloat16():
    """zp rounds once to the scale dtype; the zero still comes back exactly."""
    s = 1 + 2**-7                                # bfloat16 0x3F81
    scales = torch.full((8, 1), s, dtype=torch.bfloat16)
    zeros = torch.full((8, 1), 1, dtype=torch.int32)
    packed = pack_weights(torch.ones(8, 64, dtype=torch.int32), scales, zeros, weight_type="uint4",
                          group_size=64)
    # 7 * (1 + 2^-7) = 7.0546875 is between bfloat16 7.03125 and 7.0625 (step 2^-5): 7.0625
    assert (packed.zeros.view(torch.int16)[0, 0].item() & 0xFFFF) == 0x40E2
    assert packed.zeros[0, 0].item() == 7.0625
    _, _, z = unpack_weights(packed)
    assert (z == 1).all()
    # the kernel's stored*scale + zp for q == zero is then 2^-7 instead of 0: the documented error
    stored = nibble(packed, 0, 0) - 16                     # q 1 is stored as 1 - 8 = -7 (0x9)
    assert stored == -7
    assert stored * packed.scales[0, 0].double().item() + packed.zeros[0, 0].double().item() == 2**-7


@pytest.mark.parametrize("dtype", SCALE_DTYPES)
def test_zero_point_recovery_is_exact_for_every_scale(dtype):
    """Every 16-bit pattern as the scale x every zero 0..15: whenever pack accepts the pair
    (finite non-zero scale, zp finite), round(8 - zp / scale) gives the zero back exactly."""
    scales = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    finite = torch.isfinite(scales) & (scales != 0)
    scales = scales[finite]
    assert scales.numel() > 60000                      # subnormals and extremes included
    for zero in range(16):
        z = torch.full(scales.shape, zero, dtype=torch.int32)
        zp = Sm90Layout.zp_from_zero(z, scales)
        ok = torch.isfinite(zp)
        if zero == 8:
            assert ok.all() and (zp == 0).all()
        back = Sm90Layout.zero_from_zp(zp[ok], scales[ok])
        assert torch.equal(back, z[ok]), f"zero {zero}: {scales[ok][back != z[ok]][:5]}"
        # zp is scale * (8 - zero) rounded once: within half a unit in the last place
        exact = scales[ok].double() * (8 - zero)
        rel = (zp[ok].double() - exact).abs() / exact.abs().clamp_min(1e-300)
        bound = 2.0**-11 if dtype == torch.float16 else 2.0**-8
        normal = exact.abs() >= torch.finfo(dtype).tiny
        assert (rel[normal] <= bound).all()


@pytest.mark.parametrize("dtype", SCALE_DTYPES)
def test_extreme_scales_through_the_public_api(dtype):
    info = torch.finfo(dtype)
    tiniest = torch.tensor(0, dtype=torch.int16).add(1).view(dtype).item()   # smallest subnormal
    largest_ok = (info.max / 8)                      # zp = scale * 8 for zero 0 still finite
    values = [tiniest, -tiniest, info.tiny, info.eps, 1.0, -3.0, largest_ok / 2, -largest_ok / 2]
    scales = torch.tensor(values, dtype=torch.float32).to(dtype).reshape(8, 1)
    zeros = torch.tensor([0, 15, 3, 7, 8, 9, 0, 15]).reshape(8, 1)
    packed = pack_weights(torch.zeros(8, 64, dtype=torch.uint8), scales, zeros,
                          weight_type="uint4", group_size=None)
    _, s, z = unpack_weights(packed)
    assert torch.equal(z, zeros.to(torch.int32)) and torch.equal(bits16(s), bits16(scales))
    # the largest scale with zero 8 is fine (zp = 0); with zero 0 its zp overflows: refused
    big = torch.full((8, 1), info.max, dtype=dtype)
    at_eight = pack_weights(torch.zeros(8, 64, dtype=torch.uint8), big, torch.full((8, 1), 8),
                            weight_type="uint4", group_size=64)
    assert (at_eight.zeros == 0).all()
    _, s8, z8 = unpack_weights(at_eight)
    assert (z8 == 8).all() and torch.equal(bits16(s8), bits16(big))
    with pytest.raises(ValueError, match=r"argument 'scales'.*overflows"):
        pack_weights(torch.zeros(8, 64, dtype=torch.uint8), big, torch.zeros(8, 1, dtype=torch.int32),
                     weight_type="uint4", group_size=64)


# ---------------------------------------------------------------- dequantize

@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("dtype", SCALE_DTYPES)
def test_dequantize_matches_the_formula(weight_type, dtype):
    n, k, group = 8, 192, 64
    q, scales, zeros = random_case(weight_type, n, k, group, dtype, torch.int32, seed=7)
    packed = pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group)
    w = dequantize(packed)
    assert w.dtype == torch.float32 and tuple(w.shape) == (k, n)
    for kk in range(k):
        for nn in range(n):
            g = kk // group
            sub = zeros[nn, g].item() if zeros is not None else OFFSET[weight_type]
            want = scales[nn, g].item() * (q[nn, kk].item() - sub)     # Python float64
            assert w[kk, nn].item() == want, (kk, nn)


# ---------------------------------------------------------------- PackedWeight

def small_packed(weight_type="uint4", dtype=torch.bfloat16, group=64):
    q, scales, zeros = random_case(weight_type, 16, 128, group, dtype, torch.int32, seed=1)
    return pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group)


def test_packed_weight_is_a_plain_object():
    p = small_packed()
    assert not isinstance(p, torch.Tensor)
    other = small_packed()                       # equal fields, another object: identity equality
    assert p != other and {p: 1}.get(other) is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.k = 3
    assert {p: 1}[p] == 1
    assert p.to("cpu") is p and p.to(torch.device("cpu")) is p
    text = p.describe()
    assert "\n" not in text
    for part in ("uint4", "N=16", "K=128", "group 64", "zero points", "bfloat16", "sm90a", "v2", "cpu"):
        assert part in text
    assert "per-channel" in small_packed("int8", torch.float16, 128).describe()
    assert small_packed("int8").bits == 8 and small_packed("int4").bits == 4
    assert small_packed("int4").num_groups == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_weight_to_cuda_and_back():
    p = small_packed()
    g = p.to("cuda")
    assert g.device.type == "cuda" and g.zeros.device.type == "cuda" and g.k == p.k
    back = [t.cpu() for t in unpack_weights(g)]
    for x, y in zip(back, unpack_weights(p)):
        assert torch.equal(x, y)


def test_packed_weight_checks_its_fields():
    p = small_packed()

    def broken(**changes):
        with pytest.raises(ValueError) as info:
            dataclasses.replace(p, **changes)
        return str(info.value)

    assert "argument 'weight_type'" in broken(weight_type="uint3")
    assert "argument 'arch'" in broken(arch="sm100")
    assert broken(arch=None).endswith("expected one of sm90a, sm80; got None")  # no default here
    assert "argument 'layout_version'" in broken(layout_version=1)
    assert "argument 'k'" in broken(k=96, group_size=96)   # the packed blocks are 64 k
    assert "argument 'k'" in broken(k=0)
    assert "argument 'group_size'" in broken(group_size=48)
    assert "argument 'qweight'" in broken(qweight=p.qweight.to(torch.int8))
    assert "argument 'qweight'" in broken(qweight=p.qweight[:, :-1])
    assert "argument 'scales'" in broken(scales=p.scales.float())
    assert "argument 'scales'" in broken(scales=p.scales.t())
    assert "argument 'zeros'" in broken(zeros=None)
    assert "argument 'zeros'" in broken(zeros=p.zeros.to(torch.float16))
    assert "argument 'zeros'" in broken(weight_type="uint4b8")
    assert "argument 'scales'" in broken(scales=p.scales.to("meta"))
    # act-order's k_perm: int32 [K] (the kernels' gather reads it), a permutation, on qweight's device
    perm = torch.randperm(128, dtype=torch.int32)
    assert dataclasses.replace(p, k_perm=perm).act_order
    assert "argument 'k_perm'" in broken(k_perm=perm.long())
    assert "argument 'k_perm'" in broken(k_perm=perm[:64])
    assert "argument 'k_perm'" in broken(k_perm=perm.to("meta"))
    assert "a permutation of 0..127" in broken(k_perm=perm.clone().fill_(3))
    assert "a permutation of 0..127" in broken(k_perm=perm + 1)
    # meta tensors of the right shapes pass (the checks read no data)
    meta = dataclasses.replace(p, qweight=p.qweight.to("meta"), scales=p.scales.to("meta"),
                               zeros=p.zeros.to("meta"), k_perm=perm.to("meta"))
    assert meta.device.type == "meta" and meta.act_order


def test_unpack_refuses_a_weight_of_another_layout_version():
    """An unpickled PackedWeight of layout version 1 (4-bit weights [N, K/2] K-major) skips the
    constructor's checks: unpacking it says to re-pack instead of misreading its bytes."""
    old = copy.copy(small_packed())
    object.__setattr__(old, "layout_version", 1)
    with pytest.raises(ValueError, match=r"argument 'packed'.*layout version 2.*re-pack.*layout version 1"):
        unpack_weights(old)
    with pytest.raises(ValueError, match=r"layout version 1"):
        dequantize(old)


def test_default_arch_and_arch_argument():
    assert default_arch() in ARCH_LAYOUTS and default_arch("cpu") == "sm90a"
    q = torch.zeros(8, 64, dtype=torch.int8)
    s = torch.ones(8, 1, dtype=torch.float16)
    assert pack_weights(q, s, weight_type="int8", group_size=64, arch=None).arch == "sm90a"
    assert pack_weights(q, s, weight_type="int8", group_size=64, arch="sm90a").arch == "sm90a"
    # sm80 names the same layout (the direct kernel reads it): same tensors, arch recorded
    on_sm80 = pack_weights(q, s, weight_type="int8", group_size=64, arch="sm80")
    on_sm90 = pack_weights(q, s, weight_type="int8", group_size=64, arch="sm90a")
    assert on_sm80.arch == "sm80" and torch.equal(on_sm80.qweight, on_sm90.qweight)
    assert same_layout("sm80", "sm90a") and not same_layout("sm70", "sm90a")


# ---------------------------------------------------------------- argument errors

def base(**changes):
    """Valid uint4 arguments (N=16, K=256, group 128), with some replaced."""
    args = dict(q=torch.randint(0, 16, (16, 256), dtype=torch.int32),
                scales=torch.rand(16, 2, dtype=torch.float32).add(0.5).to(torch.float16),
                zeros=torch.randint(0, 16, (16, 2)), weight_type="uint4", group_size=128)
    args.update(changes)
    return args


def call(args):
    q, scales, zeros = args.pop("q"), args.pop("scales"), args.pop("zeros")
    return pack_weights(q, scales, zeros, **args)


Q = torch.randint(0, 16, (16, 256), dtype=torch.int32)
ERRORS = [  # (changes, argument, a regex the message must contain)
    (dict(weight_type="uint3"), "weight_type", r"int4, uint4b8, uint4, int8, uint8b128.*'uint3'"),
    (dict(weight_type=None), "weight_type", r"one of"),
    (dict(q=[[1, 2]]), "q", r"2-D integer tensor \[N, K\].*got a list of 1 item"),
    (dict(q=Q[0]), "q", r"2-D.*shape \(256,\)"),
    (dict(q=Q.float()), "q", r"integer dtype.*torch.float32"),
    (dict(q=Q.bool()), "q", r"integer dtype.*torch.bool"),
    (dict(q=Q[:, :96], group_size=None, scales=torch.ones(16, dtype=torch.float16),
          zeros=torch.zeros(16)), "q", r"multiple of 64 \(the sm90a kernels' tile K\)"),
    (dict(q=Q[:12], scales=torch.ones(12, 2, dtype=torch.float16), zeros=torch.zeros(12, 2)), "q",
     r"multiple of 8 \(16-byte TMA alignment"),
    (dict(q=Q.clone().fill_(16)), "q", r"uint4 values in 0\.\.15; got values in 16\.\.16"),
    (dict(q=Q - 1, weight_type="uint4b8", zeros=None), "q", r"uint4b8 values in 0\.\.15; got values in -1\.\.14"),
    (dict(q=Q + 120, weight_type="int8", zeros=None), "q", r"int8 values in -128\.\.127; got values in 120\.\.135"),
    (dict(q=Q + 8, weight_type="int4", zeros=None), "q", r"int4 values in -8\.\.7; got values in 8\.\.23"),
    (dict(q=Q - 1, weight_type="uint8b128", zeros=None), "q", r"uint8b128 values in 0\.\.255; got values in -1\.\.14"),
    (dict(group_size=16, scales=torch.ones(16, 16, dtype=torch.float16), zeros=torch.zeros(16, 16)),
     "group_size", r"32, a multiple of 64 \(the sm90a kernels' tile K for 16-bit activations\) "
     r"that divides K=256, or K itself \(per-channel\); got 16"),
    (dict(group_size=192), "group_size", r"divides K=256.*got 192"),
    (dict(group_size=0), "group_size", r"got 0"),
    (dict(group_size=512), "group_size", r"got 512"),
    (dict(group_size=128.0), "group_size", r"got 128.0"),
    (dict(group_size=True), "group_size", r"got True"),
    (dict(scales=torch.ones(16, 2)), "scales", r"float16 or bfloat16.*torch.float32"),
    (dict(scales=None), "scales", r"float16 or bfloat16.*got None$"),
    (dict(scales=torch.ones(2, 16, dtype=torch.float16)), "scales", r"shape \[N=16, K/group_size=2\]; got .*\(2, 16\)"),
    (dict(scales=torch.ones(16, dtype=torch.float16)), "scales", r"shape \[N=16, K/group_size=2\]"),
    (dict(scales=torch.ones(16, 2, dtype=torch.float16, device="meta")), "scales", r"on cpu like q"),
    (dict(scales=torch.full((16, 2), float("nan"), dtype=torch.float16)), "scales", r"finite values; got NaN or Inf"),
    (dict(scales=torch.full((16, 2), float("inf"), dtype=torch.bfloat16), zeros=None,
          weight_type="int4", q=Q - 8), "scales", r"finite values"),
    (dict(scales=torch.zeros(16, 2, dtype=torch.float16)), "scales", r"non-zero values for uint4"),
    (dict(scales=torch.full((16, 2), 30000, dtype=torch.float16),
          zeros=torch.zeros(16, 2, dtype=torch.int32)), "scales", r"overflows"),
    (dict(zeros=None), "zeros", r"integer zero points \[N, K/group_size\] for uint4; got None"),
    (dict(zeros=torch.zeros(16, 2).half()), "zeros", r"an integer tensor.*torch.float16"),
    (dict(zeros=torch.zeros(2, 16, dtype=torch.int32)), "zeros", r"shape \[N=16, K/group_size=2\]"),
    (dict(zeros=torch.full((16, 2), 16)), "zeros", r"uint4 zero-point values in 0\.\.15; got values in 16\.\.16"),
    (dict(zeros=torch.full((16, 2), -1)), "zeros", r"0\.\.15; got values in -1\.\.-1"),
    (dict(zeros=torch.zeros(16, 2, dtype=torch.int32, device="meta")), "zeros", r"on cpu like q"),
    (dict(weight_type="uint4b8"), "zeros", r"None for uint4b8"),
    (dict(weight_type="int8", q=Q), "zeros", r"None for int8"),
    (dict(arch="sm70"), "arch", r"one of sm90a, sm80 or None; got 'sm70'"),
    (dict(g_idx=torch.zeros(256)), "g_idx", r"None or an integer tensor \[K=256\] .*torch.float32"),
    (dict(g_idx=torch.zeros(128, dtype=torch.int32)), "g_idx", r"\[K=256\].*\(128,\)"),
    (dict(g_idx=torch.zeros(256, dtype=torch.int32, device="meta")), "g_idx", r"on cpu like q"),
    (dict(g_idx=torch.arange(256) // 128 + 1), "g_idx", r"group index \(K/group_size=2 groups\) "
     r"values in 0\.\.1; got values in 1\.\.2"),
    (dict(g_idx=torch.arange(256) // 192), "g_idx", r"every group 0\.\.1 given exactly "
     r"group_size=128 input features.*got group 0 with 192"),
]


@pytest.mark.parametrize("changes,argument,pattern", ERRORS,
                         ids=[f"{a}-{i}" for i, (_, a, _) in enumerate(ERRORS)])
def test_pack_weights_errors_name_the_argument(changes, argument, pattern):
    with pytest.raises(ValueError) as info:
        call(base(**changes))
    message = str(info.value)
    assert message.startswith(f"gemmgen.pack_weights: argument '{argument}': expected "), message
    assert "; got " in message
    assert re.search(pattern, message), message


def test_the_valid_base_packs():
    assert call(base()).weight_type == "uint4"


@pytest.mark.parametrize("function", [unpack_weights, dequantize])
def test_unpack_and_dequantize_want_a_packed_weight(function):
    with pytest.raises(ValueError, match=rf"gemmgen.{function.__name__}: argument 'packed': "
                       r"expected a PackedWeight; got torch.float32 tensor"):
        function(torch.zeros(3))


def test_module_constants():
    assert WEIGHT_TYPES == ("int4", "uint4b8", "uint4", "int8", "uint8b128")
    assert LAYOUT_VERSION == 2 and ARCH_LAYOUTS == ("sm90a", "sm80")
    assert packing.q_range("uint8b128") == (0, 255) and packing.bits_of("uint4") == 4


def test_trivial_g_idx_stores_no_permutation():
    args = base()
    packed = call(dict(args, g_idx=torch.arange(256, dtype=torch.int32) // 128))
    assert not packed.act_order and packed.k_perm is None
    assert torch.equal(packed.qweight, call(args).qweight) and "act-order" not in packed.describe()


# ---------------------------------------------------------------- gemmgen.reference

@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
@pytest.mark.parametrize("act_order", [False, True], ids=["", "act_order"])
def test_reference_mixed_mm_against_float64(weight_type, act_order):
    n, k, group, m = 16, 256, 128, 5
    dtype = torch.bfloat16
    q, scales, zeros = random_case(weight_type, n, k, group, dtype, torch.int32, seed=3)
    g_idx = act_order_g_idx(k, group, seed=3) if act_order else torch.arange(k) // group
    packed = pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group,
                          g_idx=g_idx if act_order else None)
    assert packed.act_order == act_order
    a = torch.randn(m, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    sub = (zeros if zeros is not None else torch.full((n, k // group), OFFSET[weight_type]))
    g = g_idx.long()  # the group of each input feature k: column k's scale and zero
    w64 = ((q.double() - sub.double()[:, g]) * scales.double()[:, g]).t()
    want = a.double() @ w64
    for b in (None, bias):
        got = reference.mixed_mm(a, packed, b)
        assert got.dtype == torch.float32 and tuple(got.shape) == (m, n)
        ref = want if b is None else want + b.double()
        torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6 * ref.abs().max().item())
    with pytest.raises(ValueError, match=r"argument 'a'.*K=256"):
        reference.mixed_mm(a[:, :128], packed)
    with pytest.raises(ValueError, match=r"argument 'bias'"):
        reference.mixed_mm(a, packed, bias[:3])


def test_reference_scaled_mm_epilogues_by_hand():
    a = torch.tensor([[1, 2], [3, -4]], dtype=torch.int8)          # M=2, K=2
    b = torch.tensor([[5, 6, -1], [7, 8, 2]], dtype=torch.int8)    # K=2, N=3
    # A·B = [[19, 22, 3], [-13, -14, -11]]
    scale_a = torch.tensor([2.0, 0.5])                             # per-token
    scale_b = torch.tensor([0.25])                                 # per-tensor
    bias = torch.tensor([1.0, -1.0, 0.5], dtype=torch.bfloat16)
    azp_adj = torch.tensor([3, -2, 1], dtype=torch.int32)
    azp = torch.tensor([2, -1], dtype=torch.int32)

    def run(**kw):
        d = reference.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, **kw)
        assert d.dtype == torch.float64
        return d.tolist()

    # ScaledEpilogue: s_a[m] * s_b * acc
    assert run() == [[9.5, 11.0, 1.5], [-1.625, -1.75, -1.375]]
    # ScaledEpilogueBias: + bias[n]
    assert run(bias=bias) == [[10.5, 10.0, 2.0], [-0.625, -2.75, -0.875]]
    # ScaledEpilogueAzp: s_a * s_b * (acc - azp_adj[n]) + bias
    #   acc - adj = [[16, 24, 2], [-16, -12, -12]]
    assert run(azp_adj=azp_adj) == [[8.0, 12.0, 1.0], [-2.0, -1.5, -1.5]]
    assert run(azp_adj=azp_adj, bias=bias) == [[9.0, 11.0, 1.5], [-1.0, -2.5, -1.0]]
    # ScaledEpilogueAzpPerToken: s_a * s_b * (acc - azp[m] * azp_adj[n]) + bias
    #   azp ⊗ adj = [[6, -4, 2], [-3, 2, -1]]; acc - it = [[13, 26, 1], [-10, -16, -10]]
    assert run(azp_adj=azp_adj, azp=azp) == [[6.5, 13.0, 0.5], [-1.25, -2.0, -1.25]]
    assert run(azp_adj=azp_adj, azp=azp, bias=bias) == [[7.5, 12.0, 1.0], [-0.25, -3.0, -0.75]]
    # per-channel scale_b of shape [1, N]
    d = reference.scaled_mm(a, b, torch.tensor([[1.0]]), torch.tensor([[1.0, 2.0, 3.0]]),
                            torch.float16)
    assert d.tolist() == [[19.0, 44.0, 9.0], [-13.0, -28.0, -33.0]]
    with pytest.raises(ValueError, match=r"argument 'azp'.*None unless azp_adj"):
        reference.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, azp=azp)
    with pytest.raises(ValueError, match=r"argument 'scale_b'.*1 or N=3"):
        reference.scaled_mm(a, b, scale_a, torch.ones(2), torch.bfloat16)
    with pytest.raises(ValueError, match=r"argument 'out_dtype'"):
        reference.scaled_mm(a, b, scale_a, scale_b, torch.float32)


def test_reference_scaled_mm_fp8():
    a = torch.tensor([[1.5, -2.0]]).to(torch.float8_e4m3fn)
    b = torch.tensor([[0.5], [0.25]]).to(torch.float8_e4m3fn)
    d = reference.scaled_mm(a, b, torch.tensor([2.0]), torch.tensor([4.0]), torch.bfloat16)
    assert d.tolist() == [[2.0]]                   # 2 * 4 * (0.75 - 0.5)


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_act_order_kernel_view(weight_type):
    """What the kernels compute for an act-order weight, read from the packed tensors the way
    they read any weight (K position j in group j // group_size, zp = scale * (8 - zero) added
    to the stored value times the scale) on activations gathered by k_perm as the kernels' entry
    points do (out[:, j] = a[:, k_perm[j]], gather_k.cuh),
    equals a @ dequantize(packed) in input-feature order, and the checkpoint's own math."""
    n, k, group, m = 24, 384, 128, 3
    q, scales, zeros = random_case(weight_type, n, k, group, torch.bfloat16, torch.int32, seed=9)
    g_idx = act_order_g_idx(k, group, seed=9)
    packed = pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group, g_idx=g_idx)
    stored = packing.Sm90Layout.unpack_q(packed.qweight, weight_type, n) - packing.Sm90Layout.offset(weight_type)
    position_group = torch.arange(k) // group                      # the kernels' view of groups
    w_kernel = stored.double() * packed.scales.double().t()[:, position_group]
    if packed.zeros is not None:
        w_kernel = w_kernel + packed.zeros.double().t()[:, position_group]
    a = torch.randn(m, k, dtype=torch.float64)
    got = a.index_select(1, packed.k_perm) @ w_kernel.t()
    want = a @ dequantize(packed).double()
    # exact but for uint4's zp, rounded once to the scale dtype (relative 2^-8 in bf16)
    size = (a.abs() @ w_kernel.abs().t()).max().item()  # float64 sums in another order: 1e-12 of it
    tolerance = dict(rtol=0, atol=1e-12 * size if zeros is None else 2**-8 * size)
    torch.testing.assert_close(got, want, **tolerance)
    sub = zeros.double()[:, g_idx.long()] if zeros is not None else OFFSET[weight_type]
    w_checkpoint = (q.double() - sub) * scales.double()[:, g_idx.long()]
    torch.testing.assert_close(dequantize(packed).double(), w_checkpoint.t(), rtol=0, atol=0)
