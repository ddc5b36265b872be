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
