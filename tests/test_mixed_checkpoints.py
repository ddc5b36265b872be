"""CPU tests of the GPTQ / AWQ checkpoint import (gemmgen/families/mixed/checkpoints.py): random
logical weights, zeros and scales are written in each checkpoint format by an independent little
packer here (Python ints and loops, nothing shared with checkpoints.py), imported, and the
dequantized weight compared with s * (q - z) computed from the logical values."""

from __future__ import annotations

import random

import pytest
import torch

from gemmgen.families.mixed.checkpoints import (AWQ_ORDER, AWQ_REVERSE_ORDER, from_awq,
                                              from_compressed_tensors, from_gptq)
from gemmgen.families.mixed.packing import PackedWeight, dequantize, pack_weights, unpack_weights

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def to_int32(words: list[list[int]]) -> torch.Tensor:
    """Unsigned 32-bit Python ints -> the int32 tensor a checkpoint stores (same bits)."""
    return torch.tensor([[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words],
                        dtype=torch.int32)


def gptq_pack_qweight(q_kn: list[list[int]], bits: int) -> torch.Tensor:
    """[K][N] values -> int32 [K*bits/32, N]: value k of a column in word k // p, bits
    (k % p) * bits upward."""
    per = 32 // bits
    k, n = len(q_kn), len(q_kn[0])
    words = [[0] * n for _ in range(k // per)]
    for kk in range(k):
        for nn in range(n):
            words[kk // per][nn] |= (q_kn[kk][nn] & ((1 << bits) - 1)) << ((kk % per) * bits)
    return to_int32(words)


def gptq_pack_qzeros(z_gn: list[list[int]], bits: int) -> torch.Tensor:
    """[G][N] real zeros -> int32 [G, N*bits/32] storing zero - 1 (v1), packed along N."""
    per = 32 // bits
    g, n = len(z_gn), len(z_gn[0])
    words = [[0] * (n // per) for _ in range(g)]
    for gg in range(g):
        for nn in range(n):
            stored = (z_gn[gg][nn] - 1) & ((1 << bits) - 1)
            words[gg][nn // per] |= stored << ((nn % per) * bits)
    return to_int32(words)


def awq_pack(v_rn: list[list[int]]) -> torch.Tensor:
    """[R][N] 4-bit values -> int32 [R, N/8] the way AutoAWQ's GEMM packer writes them: slot i of
    word j gets column 8j + order_map[i], order_map = [0, 2, 4, 6, 1, 3, 5, 7]."""
    order_map = [0, 2, 4, 6, 1, 3, 5, 7]
    r, n = len(v_rn), len(v_rn[0])
    words = [[0] * (n // 8) for _ in range(r)]
    for rr in range(r):
        for j in range(n // 8):
            for i in range(8):
                words[rr][j] |= v_rn[rr][8 * j + order_map[i]] << (4 * i)
    return to_int32(words)


def logical(k: int, n: int, group: int, q_range: tuple[int, int], z_range, seed: int):
    """Random [K][N] q, [G][N] zeros (None: not drawn), float16 scales [G, N]."""
    rng = random.Random(seed)
    q = [[rng.randint(*q_range) for _ in range(n)] for _ in range(k)]
    zeros = None if z_range is None else [[rng.randint(*z_range) for _ in range(n)]
                                          for _ in range(k // group)]
    scales = (torch.rand(k // group, n, generator=torch.Generator().manual_seed(seed)) * 0.1
              + 0.001).half()
    return q, zeros, scales


def expected(q, zeros, scales, group, offset=None) -> torch.Tensor:
    """float64 [K, N] s * (q - z) from the logical values."""
    k, n = len(q), len(q[0])
    out = torch.empty(k, n, dtype=torch.float64)
    for kk in range(k):
        for nn in range(n):
            z = offset if zeros is None else zeros[kk // group][nn]
            out[kk, nn] = scales[kk // group, nn].item() * (q[kk][nn] - z)
    return out


# ---------------------------------------------------------------- GPTQ

def test_gptq_word_by_hand():
    q = [[v] * 8 for v in (1, 2, 3, 4, 5, 6, 7, 8)]          # K=8 rows, column n = k + 1
    assert gptq_pack_qweight(q, 4)[0, 0].item() == 0x87654321 - (1 << 32)
    assert gptq_pack_qzeros([[8] * 8], 4)[0, 0].item() == 0x77777777


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,n,group", [(256, 16, 64), (256, 32, 128), (128, 8, 128), (128, 16, 32)])
def test_gptq_symmetric_4bit_is_uint4b8(device, k, n, group):
    q, _, scales = logical(k, n, group, (0, 15), None, seed=k + n)
    zeros = [[8] * n for _ in range(k // group)]
    g_idx = torch.arange(k, dtype=torch.int32) // group                     # trivial: accepted
    packed = from_gptq(gptq_pack_qweight(q, 4).to(device), gptq_pack_qzeros(zeros, 4).to(device),
                       scales.to(device), g_idx.to(device), bits=4)
    assert (packed.weight_type, packed.group_size, packed.k, packed.n) == ("uint4b8", group, k, n)
    assert not packed.has_zeros and not packed.act_order and packed.device.type == device
    assert torch.equal(dequantize(packed).cpu().double(), expected(q, None, scales, group, 8))
    q_back, s_back, _ = unpack_weights(packed)
    assert q_back.cpu().tolist() == [list(col) for col in zip(*q)]          # [N, K]
    assert torch.equal(s_back.cpu(), scales.t())


@pytest.mark.parametrize("device", DEVICES)
def test_gptq_asymmetric_4bit_is_uint4_with_zeros(device):
    k, n, group = 384, 24, 128
    # GPTQ v1 stores zero - 1, so zero 0 cannot be written (see the test below): zeros 1..15
    q, zeros, scales = logical(k, n, group, (0, 15), (1, 15), seed=5)
    zeros[0][0], zeros[-1][-1] = 1, 15
    packed = PackedWeight.from_gptq(gptq_pack_qweight(q, 4).to(device),
                                    gptq_pack_qzeros(zeros, 4).to(device), scales.to(device))
    assert (packed.weight_type, packed.group_size, packed.has_zeros) == ("uint4", group, True)
    assert packed.device.type == device
    assert torch.equal(dequantize(packed).cpu().double(), expected(q, zeros, scales, group))
    assert unpack_weights(packed)[2].cpu().tolist() == [list(col) for col in zip(*zeros)]


@pytest.mark.parametrize("zero_range", [None, (1, 15)], ids=["symmetric", "asymmetric"])
def test_gptq_import_for_another_activation_dtype(zero_range):
    """dtype=torch.bfloat16: a float16 checkpoint's scales rounded once to bf16 (the packed weight
    serves bf16 activations); integer zeros stay exact; a dtype the kernels cannot take is refused."""
    k, n, group = 256, 16, 64
    q, zeros, scales = logical(k, n, group, (0, 15), zero_range, seed=13)
    qzeros = gptq_pack_qzeros(zeros if zeros is not None else [[8] * n] * (k // group), 4)
    packed = from_gptq(gptq_pack_qweight(q, 4), qzeros, scales, dtype=torch.bfloat16)
    assert packed.scale_dtype == torch.bfloat16
    rounded = scales.to(torch.bfloat16).double()
    assert torch.equal(dequantize(packed).double(), expected(q, zeros, rounded, group, 8))
    if zeros is not None:
        assert unpack_weights(packed)[2].tolist() == [list(col) for col in zip(*zeros)]
    for bad in (torch.float32, "bf16"):
        with pytest.raises(ValueError, match=r"gemmgen.from_gptq: argument 'dtype': expected None "
                           r"\(the checkpoint scales' dtype\), torch.float16 or torch.bfloat16"):
            from_gptq(gptq_pack_qweight(q, 4), qzeros, scales, dtype=bad)


def test_gptq_per_channel():
    k, n = 192, 16
    q, _, scales = logical(k, n, k, (0, 15), None, seed=11)
    for group_size in (None, -1, k):   # -1: quantize_config.json's per-channel
        packed = from_gptq(gptq_pack_qweight(q, 4), gptq_pack_qzeros([[8] * n], 4), scales,
                           group_size=group_size)
        assert packed.group_size == k and packed.weight_type == "uint4b8"
        assert torch.equal(dequantize(packed).double(), expected(q, None, scales, k, 8))


def test_gptq_symmetric_8bit_is_uint8b128():
    k, n, group = 256, 16, 64
    q, _, scales = logical(k, n, group, (0, 255), None, seed=3)
    zeros = [[128] * n for _ in range(k // group)]
    packed = from_gptq(gptq_pack_qweight(q, 8), gptq_pack_qzeros(zeros, 8), scales, bits=8)
    assert (packed.weight_type, packed.bits, packed.has_zeros) == ("uint8b128", 8, False)
    assert torch.equal(dequantize(packed).double(), expected(q, None, scales, group, 128))


def test_gptq_asymmetric_8bit_is_refused():
    k, n, group = 128, 8, 64
    q, zeros, scales = logical(k, n, group, (0, 255), (100, 140), seed=4)
    with pytest.raises(ValueError, match=r"gemmgen.from_gptq: argument 'qzeros': .*do not support "
                       r"8-bit weights with zero points"):
        from_gptq(gptq_pack_qweight(q, 8), gptq_pack_qzeros(zeros, 8), scales, bits=8)


def act_order_g_idx(k: int, group: int, seed: int) -> torch.Tensor:
    """g_idx as GPTQ's desc_act writes it: K quantized in a permuted order, groups numbered along
    that order (every group `group` features), int32 [K]."""
    order = torch.randperm(k, generator=torch.Generator().manual_seed(seed))   # quantization order
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = torch.arange(k, dtype=torch.int32) // group
    return g_idx


def expected_act_order(q, zeros, scales, g_idx, offset=None) -> torch.Tensor:
    """float64 [K, N] s[g_idx[k], n] * (q[k][n] - z[g_idx[k]][n]) from the logical values."""
    k, n = len(q), len(q[0])
    out = torch.empty(k, n, dtype=torch.float64)
    for kk in range(k):
        g = int(g_idx[kk])
        for nn in range(n):
            z = offset if zeros is None else zeros[g][nn]
            out[kk, nn] = scales[g, nn].item() * (q[kk][nn] - z)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits,zero_range", [(4, None), (4, (1, 15)), (8, None)],
                         ids=["uint4b8", "uint4", "uint8b128"])
def test_gptq_act_order_imports(device, bits, zero_range):
    """desc_act checkpoints: dequantize (input-feature order) matches s[g_idx[k]] * (q - z), the
    stored K is in group order, and unpack + g_idx pack the same weight again."""
    k, n, group = 384, 16, 128
    q, zeros, scales = logical(k, n, group, (0, (1 << bits) - 1), zero_range, seed=6 + bits)
    symmetric = 1 << (bits - 1)
    stored_zeros = zeros or [[symmetric] * n for _ in range(k // group)]
    g_idx = act_order_g_idx(k, group, seed=bits)
    packed = from_gptq(gptq_pack_qweight(q, bits).to(device), gptq_pack_qzeros(stored_zeros, bits).to(device),
                       scales.to(device), g_idx.to(device), bits=bits)
    assert packed.act_order and packed.device.type == device and "act-order" in packed.describe()
    assert torch.equal(packed.g_idx.cpu(), g_idx.long())
    assert torch.equal(dequantize(packed).cpu().double(),
                       expected_act_order(q, zeros, scales, g_idx, None if zeros else symmetric))
    # kernel position j holds input feature k_perm[j], whose group is j // group
    assert torch.equal(g_idx.long()[packed.k_perm.cpu()], torch.arange(k) // group)
    q_back, s_back, z_back = unpack_weights(packed)
    assert q_back.cpu().tolist() == [list(col) for col in zip(*q)]
    again = pack_weights(q_back, s_back, z_back, weight_type=packed.weight_type, group_size=group,
                         g_idx=packed.g_idx)
    assert torch.equal(again.qweight, packed.qweight) and torch.equal(again.k_perm, packed.k_perm)


def test_gptq_act_order_needs_equal_groups():
    k, n, group = 256, 8, 64
    q, _, scales = logical(k, n, group, (0, 15), None, seed=6)
    zeros = [[8] * n for _ in range(k // group)]
    g_idx = act_order_g_idx(k, group, seed=0)
    g_idx[g_idx == 1] = 0                                          # group 0 twice as large
    with pytest.raises(ValueError, match=r"gemmgen.from_gptq: the checkpoint does not fit .*"
                       r"argument 'g_idx': expected every group 0..3 given exactly group_size=64 "
                       r"input features .*got group 0 with 128"):
        from_gptq(gptq_pack_qweight(q, 4), gptq_pack_qzeros(zeros, 4), scales, g_idx)
    with pytest.raises(ValueError, match=r"argument 'g_idx': expected .*group index .* values in "
                       r"0..3"):
        from_gptq(gptq_pack_qweight(q, 4), gptq_pack_qzeros(zeros, 4), scales, g_idx + 4)
    with pytest.raises(ValueError, match=r"argument 'g_idx': expected None or an integer tensor \[K=256\]"):
        from_gptq(gptq_pack_qweight(q, 4), gptq_pack_qzeros(zeros, 4), scales, g_idx[:10])


def test_gptq_zero_point_zero_cannot_be_stored_in_v1():
    k, n, group = 128, 8, 64
    q, zeros, scales = logical(k, n, group, (0, 15), (1, 15), seed=8)
    zeros[1][3] = 0                                     # stored -1 -> wraps to 15 -> reads 16
    with pytest.raises(ValueError, match=r"argument 'qzeros': expected zero points 0..15 .*reads "
                       r"back as 16"):
        from_gptq(gptq_pack_qweight(q, 4), gptq_pack_qzeros(zeros, 4), scales)


def test_gptq_argument_errors():
    k, n, group = 128, 8, 64
    q, _, scales = logical(k, n, group, (0, 15), None, seed=9)
    qw, qz = gptq_pack_qweight(q, 4), gptq_pack_qzeros([[8] * n] * 2, 4)
    cases = [
        (dict(bits=3), "bits", r"4 or 8"),
        (dict(qweight=qw.float()), "qweight", r"2-D torch.int32"),
        (dict(qzeros=qz[:1]), "qzeros", r"shape \[K/group_size=2, N\*bits/32=1\]"),
        (dict(scales=scales[:, :4]), "scales", r"\[K/group_size, N=8\]"),
        (dict(scales=scales.repeat(3, 1)), "scales", r"group count that divides K=128.*got 6 groups"),
        (dict(scales=scales.to("meta")), "scales", r"on cpu like qweight"),
    ]
    for changes, argument, pattern in cases:
        args = dict(qweight=qw, qzeros=qz, scales=scales, g_idx=None, bits=4)
        args.update(changes)
        with pytest.raises(ValueError, match=rf"gemmgen.from_gptq: argument '{argument}': "
                           rf"expected .*{pattern}"):
            from_gptq(**args)
    for changes, argument, pattern in [
        (dict(qweight=qw[:0]), "qweight", r"a non-empty 2-D torch.int32 tensor"),
        (dict(bits=4.0), "bits", r"4 or 8"),
        (dict(bits=True), "bits", r"4 or 8"),
        (dict(g_idx=[0] * k), "g_idx", r"None or an integer tensor \[K=128\]; got a list"),
        (dict(group_size=32), "scales", r"ceil\(K=128 / group_size=32\) = 4 groups; got 2 groups"),
        (dict(group_size=64.0), "group_size", r"None, -1 \(per-channel\) or a positive int"),
        (dict(group_size=0), "group_size", r"None, -1 \(per-channel\) or a positive int"),
    ]:
        args = dict(qweight=qw, qzeros=qz, scales=scales, g_idx=None, bits=4)
        args.update(changes)
        with pytest.raises(ValueError, match=rf"gemmgen.from_gptq: argument '{argument}': "
                           rf"expected .*{pattern}"):
            from_gptq(**args)
    # group size 16 fits no kernel: pack_weights' error, said to come from the import
    q16, _, s16 = logical(k, n, 16, (0, 15), None, seed=9)
    with pytest.raises(ValueError, match=r"gemmgen.from_gptq: the checkpoint does not fit the "
                       r"mixed-input kernels .*argument 'group_size'.*got 16"):
        from_gptq(gptq_pack_qweight(q16, 4), gptq_pack_qzeros([[8] * n] * 8, 4), s16)


# ---------------------------------------------------------------- AWQ

def test_awq_orders():
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    assert [AWQ_ORDER.index(c) for c in range(8)] == list(AWQ_REVERSE_ORDER)


def test_awq_word_by_hand():
    """Columns 0..7 hold 1..8: slots (low nibble first) hold columns 0,2,4,6,1,3,5,7."""
    word = awq_pack([[1, 2, 3, 4, 5, 6, 7, 8]])[0, 0].item()
    assert word == 0x86427531 - (1 << 32)
    q = [[c + 1 for c in range(8)] for _ in range(64)]           # K=64, N=8, column c = c + 1
    qweight = awq_pack(q)
    assert (qweight == word).all()
    packed = from_awq(qweight, awq_pack([[8] * 8]), torch.ones(1, 8, dtype=torch.float16))
    q_back, _, z_back = unpack_weights(packed)
    assert q_back[:, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert (z_back == 8).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("k,n,group", [(256, 16, 64), (256, 32, 128), (128, 8, 128)])
def test_awq_import(device, k, n, group):
    q, zeros, scales = logical(k, n, group, (0, 15), (0, 15), seed=k * n)
    zeros[0][0], zeros[-1][-1] = 0, 15
    packed = PackedWeight.from_awq(awq_pack(q).to(device), awq_pack(zeros).to(device),
                                   scales.to(device))
    assert (packed.weight_type, packed.group_size, packed.k, packed.n) == ("uint4", group, k, n)
    assert packed.has_zeros and packed.device.type == device
    assert torch.equal(dequantize(packed).cpu().double(), expected(q, zeros, scales, group))
    assert unpack_weights(packed)[2].cpu().tolist() == [list(col) for col in zip(*zeros)]
    # for bf16 activations: the scales rounded once, the zeros exact
    bf16 = PackedWeight.from_awq(awq_pack(q).to(device), awq_pack(zeros).to(device),
                                 scales.to(device), dtype=torch.bfloat16)
    assert bf16.scale_dtype == torch.bfloat16
    assert torch.equal(dequantize(bf16).cpu().double(),
                       expected(q, zeros, scales.to(torch.bfloat16).double(), group))
    assert unpack_weights(bf16)[2].cpu().tolist() == [list(col) for col in zip(*zeros)]


def test_awq_argument_errors():
    k, n, group = 128, 16, 64
    q, zeros, scales = logical(k, n, group, (0, 15), (0, 15), seed=2)
    qw, qz = awq_pack(q), awq_pack(zeros)
    cases = [
        (dict(qweight=qw.to(torch.int64)), "qweight", r"2-D torch.int32"),
        (dict(qzeros=qz[:, :1]), "qzeros", r"shape \[K/group_size=2, N/8=2\]"),
        (dict(scales=scales.t()), "scales", r"\[K/group_size, N=16\]"),
    ]
    for changes, argument, pattern in cases:
        args = dict(qweight=qw, qzeros=qz, scales=scales)
        args.update(changes)
        with pytest.raises(ValueError, match=rf"gemmgen.from_awq: argument '{argument}': "
                           rf"expected .*{pattern}"):
            from_awq(**args)
    # N = 8 * 1 = 8 fits; K = 32 does not (the kernels' tile K is 64)
    small = [[1] * 8 for _ in range(32)]
    with pytest.raises(ValueError, match=r"from_awq: the checkpoint does not fit .*argument 'q'.*"
                       r"multiple of 64"):
        from_awq(awq_pack(small), awq_pack([[8] * 8]), torch.ones(1, 8, dtype=torch.float16))


# ---------------------------------------------------------------- compressed-tensors

def ct_pack_rows(values: list[list[int]], bits: int) -> torch.Tensor:
    """[R][C] signed values -> int32 [R, C*bits/32] the way compressed-tensors' pack_to_int32
    writes them (packed_dim=1): value c of a row in word c // p, bits (c % p) * bits upward,
    stored as value + 2^(bits-1)."""
    per, offset = 32 // bits, 1 << (bits - 1)
    words = [[0] * (len(row) // per) for row in values]
    for r, row in enumerate(values):
        for c, v in enumerate(row):
            words[r][c // per] |= (v + offset) << ((c % per) * bits)
    return to_int32(words)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits,asymmetric,act_order,zero_packed", [
    (4, False, False, True), (4, True, False, True), (4, True, False, False), (8, False, False, True),
    (4, False, True, True), (4, True, True, True)],
    ids=["w4_sym", "w4_asym", "w4_asym_int8_zp", "w8_sym", "w4_sym_actorder", "w4_asym_actorder"])
def test_compressed_tensors_pack_quantized(device, bits, asymmetric, act_order, zero_packed):
    """llm-compressor's pack-quantized tensors (signed values and zero points, offset by
    2^(bits-1) when packed; zero points packed along N or plain int8): dequantize matches
    scale * (q - zero_point) with the checkpoint's g_idx."""
    k, n, group = 256, 16, 64
    rng = random.Random(bits * 10 + asymmetric)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = [[rng.randint(low, high) for _ in range(k)] for _ in range(n)]       # [N][K] like Linear
    zp = [[rng.randint(low, high) for _ in range(k // group)] for _ in range(n)] if asymmetric else None
    scales = (torch.rand(n, k // group, generator=torch.Generator().manual_seed(bits)) * 0.1
              + 0.001).to(torch.bfloat16)
    g_idx = act_order_g_idx(k, group, seed=1) if act_order else None
    zero_tensor = None
    if asymmetric:
        zero_tensor = (ct_pack_rows([list(col) for col in zip(*zp)], bits).t().contiguous()
                       if zero_packed else torch.tensor(zp, dtype=torch.int8))
    packed = PackedWeight.from_compressed_tensors(
        ct_pack_rows(q, bits).to(device), scales.to(device),
        None if zero_tensor is None else zero_tensor.to(device),
        None if g_idx is None else g_idx.to(device), num_bits=bits, weight_shape=torch.tensor([n, k]))
    want_type = {4: "uint4" if asymmetric else "uint4b8", 8: "uint8b128"}[bits]
    assert (packed.weight_type, packed.group_size, packed.k, packed.n) == (want_type, group, k, n)
    assert packed.act_order == act_order and packed.device.type == device
    g = (torch.arange(k) // group) if g_idx is None else g_idx.long()
    want = torch.empty(k, n, dtype=torch.float64)
    for kk in range(k):
        for nn in range(n):
            z = zp[nn][int(g[kk])] if asymmetric else 0
            want[kk, nn] = scales[nn, int(g[kk])].item() * (q[nn][kk] - z)
    assert torch.equal(dequantize(packed).cpu().double(), want)


@pytest.mark.parametrize("bits", [4, 8])
def test_compressed_tensors_all_zero_zero_points_are_symmetric(bits):
    k, n, group = 128, 8, 64
    rng = random.Random(bits)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    q = [[rng.randint(low, high) for _ in range(k)] for _ in range(n)]
    scales = torch.rand(n, k // group).half() + 0.5
    packed = from_compressed_tensors(ct_pack_rows(q, bits), scales,
                                     torch.zeros(n, k // group, dtype=torch.int8), num_bits=bits)
    assert packed.weight_type == ("uint4b8" if bits == 4 else "uint8b128") and not packed.has_zeros
    want = torch.tensor(q, dtype=torch.float64) * scales.double().repeat_interleave(group, 1)
    assert torch.equal(dequantize(packed).double(), want.t())


def test_compressed_tensors_errors():
    k, n, group = 128, 8, 64
    q = [[0] * k for _ in range(n)]
    wp, scales = ct_pack_rows(q, 4), torch.ones(n, k // group, dtype=torch.float16)
    cases = [
        (dict(num_bits=3), "num_bits", r"4 or 8"),
        (dict(num_bits=4.0), "num_bits", r"4 or 8"),
        (dict(weight_packed=wp.to(torch.int64)), "weight_packed", r"2-D torch.int32"),
        (dict(weight_shape=[n, k + 8]), "weight_shape", r"\[N=8, K=128\]"),
        (dict(weight_scale=scales.t()), "weight_scale", r"\[N=8, K/group_size\]"),
        (dict(weight_scale=scales.repeat(1, 3)), "weight_scale", r"group count that divides K=128"),
        (dict(weight_zero_point=torch.zeros(n, 2, dtype=torch.int32)), "weight_zero_point",
         r"int32 \[N\*bits/32=1, K/group_size=2\] \(packed along N\) or int8 \[N=8, K/group_size=2\]"),
        (dict(weight_g_idx=torch.zeros(k)), "weight_g_idx", r"None or an integer tensor \[K=128\]"),
        (dict(weight_scale=scales.to("meta")), "weight_scale", r"on cpu like qweight"),
    ]
    for changes, argument, pattern in cases:
        args = dict(weight_packed=wp, weight_scale=scales)
        args.update(changes)
        with pytest.raises(ValueError, match=rf"gemmgen.from_compressed_tensors: argument "
                           rf"'{argument}': expected .*{pattern}"):
            from_compressed_tensors(**args)
    q8 = ct_pack_rows([[0] * k for _ in range(n)], 8)
    with pytest.raises(ValueError, match=r"argument 'weight_zero_point': expected None \(symmetric "
                       r"8-bit\)"):
        from_compressed_tensors(q8, scales, torch.ones(n, 2, dtype=torch.int8), num_bits=8)
    with pytest.raises(ValueError, match=r"the checkpoint does not fit the mixed-input kernels.*"
                       r"float16 or bfloat16"):
        from_compressed_tensors(wp, scales.float())


def test_gptq_group_size_that_does_not_divide_k():
    """K = 384 in groups of 256 is stored as 2 groups (ceil), which K / 2 = 192 would misread:
    g_idx (or group_size=) tells the group size, which the kernels refuse (not whole groups)."""
    k, n, group = 384, 8, 256
    q, _, _ = logical(k, n, 128, (0, 15), None, seed=12)
    scales = torch.rand(2, n).half() + 0.5
    qw, qz = gptq_pack_qweight(q, 4), gptq_pack_qzeros([[8] * n] * 2, 4)
    g_idx = torch.arange(k, dtype=torch.int32) // group
    with pytest.raises(ValueError, match=r"gemmgen.from_gptq: argument 'g_idx': expected a group "
                       r"size that divides K=384 \(the kernels take whole groups\); got group size "
                       r"256 \(the input features of group 0\)"):
        from_gptq(qw, qz, scales, g_idx)
    with pytest.raises(ValueError, match=r"argument 'group_size': expected a group size that "
                       r"divides K=384.*got group size 256"):
        from_gptq(qw, qz, scales, group_size=256)
    # the same tensors read as groups of 192 when that is what the checkpoint says
    assert from_gptq(qw, qz, scales, group_size=192).group_size == 192
    assert from_gptq(qw, qz, scales, torch.arange(k) // 192).group_size == 192
