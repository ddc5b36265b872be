"""CPU tests of the mixed-input op's argument checks on fake CUDA tensors (FakeTensorMode: no GPU
needed): sizes the C++ wrapper cannot take (its problem shape is int) are refused by name."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gemmgen.families.mixed import ops

BF16 = torch.bfloat16


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield


def _args(m=4, n=8, k=64, group=64) -> tuple:
    """A valid int8-weight problem: (out, a, qweight, scales, zeros, bias, weight_type,
    group_size, n, k)."""
    empty = lambda *shape, dtype=BF16: torch.empty(shape, dtype=dtype, device="cuda")  # noqa: E731
    return (empty(m, n), empty(m, k), empty(n, k, dtype=torch.int8), empty(k // group, n), None,
            None, "int8", group, n, k)


def test_valid_problem_passes(fake):
    assert ops.check_arguments(*_args()) is None


@pytest.mark.parametrize("changes", [dict(m=2**31), dict(n=2**31), dict(k=2**31, group=2**31)],
                         ids=["M", "N", "K"])
def test_sizes_beyond_int32_are_refused(fake, changes):
    with pytest.raises(ValueError, match=r"^gemmgen\.mixed_mm: argument 'a': expected M, N and K "
                                         r"<= 2147483647 \(2\^31 - 1: the kernels take int sizes\)"):
        ops.check_arguments(*_args(**changes))


def _act_order_weight(n=8, k=128, group=64):
    """An int8 act-order PackedWeight of fake CUDA tensors (shapes only: k_perm is not read)."""
    from gemmgen.families.mixed.packing import PackedWeight
    empty = lambda *shape, dtype=BF16: torch.empty(shape, dtype=dtype, device="cuda")  # noqa: E731
    return PackedWeight(qweight=empty(n, k, dtype=torch.int8), scales=empty(k // group, n),
                        zeros=None, weight_type="int8", group_size=group, k=k, n=n,
                        k_perm=empty(k, dtype=torch.int32))


def test_act_order_passes_k_perm_to_the_op(fake):
    """An act-order weight: the custom op takes k_perm (its kernel's entry point gathers a's
    columns), and the fake kernel checks a as it is, strided or not."""
    packed = _act_order_weight()
    assert packed.act_order
    out = ops.mixed_mm(torch.empty(4, 128, dtype=BF16, device="cuda"), packed)
    assert tuple(out.shape) == (4, 8) and out.dtype == BF16
    wide = torch.empty_strided((4, 128), (192, 1), dtype=BF16, device="cuda")
    assert tuple(ops.mixed_mm(wide, packed).shape) == (4, 8)


@pytest.mark.parametrize("k_a", [64, 192])
def test_act_order_checks_k(fake, k_a):
    """The gather reads a's columns at k_perm's values: a's K must be the packed K."""
    with pytest.raises(ValueError, match=r"^gemmgen\.mixed_mm: argument 'a': expected K = 128 "
                                         r"columns \(the packed weight's K\)"):
        ops.mixed_mm(torch.empty(4, k_a, dtype=BF16, device="cuda"), _act_order_weight())


@pytest.mark.parametrize("k_perm,expected", [
    (lambda: torch.empty(128, dtype=torch.int64, device="cuda"), "a contiguous torch.int32 tensor"),
    (lambda: torch.empty(64, dtype=torch.int32, device="cuda"), "a contiguous torch.int32 tensor"),
    (lambda: torch.empty_strided((128,), (2,), dtype=torch.int32, device="cuda"),
     "a contiguous torch.int32"),
    (lambda: 3, "a contiguous torch.int32 tensor"),
    (lambda: torch.empty(128, dtype=torch.int32, device="cuda:1"), "a tensor on cuda:0 like a"),
])
def test_the_op_checks_k_perm(fake, k_perm, expected):
    """The custom op called directly with a wrong k_perm (the PackedWeight checks its own):
    refused by name before anything launches."""
    out, a, q, scales, zeros, bias, weight_type, group, n, k = _args(k=128)
    with pytest.raises(ValueError, match=rf"argument 'packed.k_perm': expected (None or )?{expected}"):
        ops.check_arguments(out, a, q, scales, zeros, bias, weight_type, group, n, k, k_perm())


def test_act_order_checks_the_device():
    from gemmgen.families.mixed.packing import pack_weights
    g_idx = torch.arange(128).flip(0) // 64
    packed = pack_weights(torch.randint(-128, 128, (8, 128)), torch.rand(8, 2, dtype=BF16) + 0.5,
                          weight_type="int8", group_size=64, g_idx=g_idx)
    assert packed.act_order and packed.device.type == "cpu"
    with pytest.raises(ValueError, match=r"argument 'a': expected a CUDA tensor"):
        ops.mixed_mm(torch.randn(4, 128).to(BF16), packed)


def test_group_sizes_the_kernels_serve(fake):
    """Group 32 (the `_g32` kernels), multiples of 64 and K pass; other sizes are refused,
    naming the sizes that work."""
    for group in (32, 64, 128):
        assert ops.check_arguments(*_args(k=128, group=group)) is None
    with pytest.raises(ValueError, match=r"^gemmgen\.mixed_mm: argument 'packed': expected group_size "
                                         r"32, a multiple of 64 dividing K=128, or K .*; got 16"):
        ops.check_arguments(*_args(k=128, group=16))
