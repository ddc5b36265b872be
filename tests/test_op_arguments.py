"""Argument checks of the W8A8 ops without a GPU: CUDA tensors are fake (FakeTensorMode: shapes,
dtypes, strides and devices, no memory), so every check runs, sizes of 2^31 included; eager calls
with CPU tensors show which op an error names. And dispatch's range check of m, n, k."""

from __future__ import annotations

import random
import re

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import gemmgen  # noqa: E402
from gemmgen import dispatch  # noqa: E402
from gemmgen.families.w8a8 import FAMILY  # noqa: E402
from gemmgen.families.w8a8 import ops  # noqa: E402

INT8, FP8, BF16 = torch.int8, torch.float8_e4m3fn, torch.bfloat16


def _problem(m: int, n: int, k: int, dtype=INT8, device="cuda"):
    """a [M, K] row-major, b = w.t() of a row-major [N, K] weight, per-tensor scales."""
    a = torch.empty((m, k), dtype=dtype, device=device)
    b = torch.empty((n, k), dtype=dtype, device=device).t()
    scale = torch.empty(1, dtype=torch.float32, device=device)
    return a, b, scale, scale


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield


# ------------------------------------------------------------- which op errors name

def test_errors_name_the_op_called(fake):
    a, b, scale_a, _ = _problem(4, 16, 32)
    bad_scale_b = torch.empty(3, dtype=torch.float32, device="cuda")
    adj = torch.empty(16, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm: argument 'scale_b': expected"):
        gemmgen.scaled_mm(a, b, scale_a, bad_scale_b, BF16)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'scale_b': expected"):
        gemmgen.scaled_mm_azp(a, b, scale_a, bad_scale_b, BF16, adj)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'azp': expected"):
        gemmgen.scaled_mm_azp(a, b, scale_a, scale_a, BF16, adj, azp=torch.empty(5, dtype=torch.int32,
                                                                                  device="cuda"))
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'out_dtype'"):
        gemmgen.scaled_mm_azp(a, b, scale_a, scale_a, torch.float32, adj)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'azp_adj'"):
        gemmgen.scaled_mm_azp(a, b, scale_a, scale_a, BF16, None)
    a8, b8, s, _ = _problem(4, 16, 32, FP8)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'a': expected int8 "
                                         r"activations for the azp epilogues"):
        gemmgen.scaled_mm_azp(a8, b8, s, s, BF16, adj)
    # valid calls pass the checks (the fake op returns an output of the right shape)
    assert gemmgen.scaled_mm(a, b, scale_a, scale_a, BF16).shape == (4, 16)
    assert gemmgen.scaled_mm_azp(a, b, scale_a, scale_a, BF16, adj).shape == (4, 16)


def test_eager_errors_name_the_op_called():
    """The eager path (no dispatch mode: straight to the implementation), CPU tensors: the first
    check that needs CUDA refuses them, naming the op that was called."""
    a, b, scale_a, scale_b = _problem(4, 16, 32, device="cpu")
    adj = torch.zeros(16, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm: argument 'a': expected a CUDA tensor"):
        gemmgen.scaled_mm(a, b, scale_a, scale_b, BF16)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'a': expected a CUDA tensor"):
        gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, BF16, adj)


def test_check_arguments_picks_the_prefix_by_azp_adj():
    """The custom op and its fake call check_arguments without the op's name: azp_adj (only
    scaled_mm_azp passes it) picks the prefix; no per-call ArgumentErrors object is built."""
    assert ops._fail.prefix == "gemmgen.scaled_mm" and ops._fail_azp.prefix == "gemmgen.scaled_mm_azp"
    with FakeTensorMode():
        a, b, scale_a, scale_b = _problem(4, 16, 32)
        out = torch.empty((4, 16), dtype=BF16, device="cuda")
        adj = torch.empty(16, dtype=torch.int32, device="cuda")
        assert ops.check_arguments(out, a, b, scale_a, scale_b, None, adj, None) == "ScaledEpilogueAzp"
        with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'bias'"):
            ops.check_arguments(out, a, b, scale_a, scale_b, scale_a, adj, None)
        with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm: argument 'bias'"):
            ops.check_arguments(out, a, b, scale_a, scale_b, scale_a, None, None)


# ------------------------------------------------------------- numbers at the edges

def test_int8_k_limit(fake):
    """int8 products accumulate in int32: (-128) * (-128) * K stays below 2^31 up to K = 131056
    (the largest multiple of 16 below 2^17; at 2^17 an all -128 problem overflows)."""
    assert ops.INT8_MAX_K == 131056 and 128 * 128 * ops.INT8_MAX_K <= 2**31 - 1
    assert 128 * 128 * (ops.INT8_MAX_K + 16) > 2**31 - 1
    ok = _problem(2, 16, ops.INT8_MAX_K)
    assert gemmgen.scaled_mm(*ok, BF16).shape == (2, 16)
    a, b, scale_a, scale_b = _problem(2, 16, ops.INT8_MAX_K + 16)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm: argument 'a': expected K <= 131056 "
                                         r"for int8: int8 products accumulate in int32") as info:
        gemmgen.scaled_mm(a, b, scale_a, scale_b, BF16)
    assert "float8_e4m3fn accumulates in float32" in str(info.value)
    assert "shape (2, 131072)" in str(info.value)
    adj = torch.empty(16, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'a': expected K <= 131056"):
        gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, BF16, adj)


def test_fp8_has_no_k_limit(fake):
    assert gemmgen.scaled_mm(*_problem(2, 16, 4 * ops.INT8_MAX_K, FP8), BF16).shape == (2, 16)


@pytest.mark.parametrize("dim, argument", [("M", "a"), ("N", "b"), ("K", "a")])
def test_sizes_beyond_int32(fake, dim, argument):
    """The kernels take int sizes: M, N or K of 2^31 is refused, not truncated."""
    big = 2**31
    m, n, k = (big if dim == "M" else 16), (big if dim == "N" else 16), (big if dim == "K" else 16)
    problem = _problem(m, n, k, FP8)  # fp8: no int8 K limit in the way
    with pytest.raises(ValueError, match=rf"^gemmgen\.scaled_mm: argument '{argument}': expected "
                                         rf"{dim} <= 2147483647 \(2\^31 - 1: the kernels take int sizes\)"):
        gemmgen.scaled_mm(*problem, BF16)
    with pytest.raises(ValueError, match=rf"argument '{argument}': expected {dim} <= 2147483647"):
        gemmgen.scaled_mm(*_problem(m, n, k, INT8), BF16)


def test_largest_sizes_pass(fake):
    big = 2**31 - 16  # multiples of 16 (alignment), below 2^31
    assert gemmgen.scaled_mm(*_problem(big, 16, 16), BF16).shape == (big, 16)
    assert gemmgen.scaled_mm(*_problem(16, big, 16), BF16).shape == (16, big)


# -------------------------------------------------------------------- dispatch

@pytest.mark.parametrize("variable", ["m", "n", "k"])
@pytest.mark.parametrize("value", [2**31, 2**40, 0, -1, True, 1.0, "16"])
def test_dispatch_request_range(variable, value):
    problem = dict(a_dtype=INT8, out_dtype=BF16, m=16, n=16, k=16)
    problem[variable] = value
    message = rf"^{variable} must be an int in \[1, 2\^31 - 1\] = \[1, 2147483647\], got {re.escape(repr(value))}$"
    with pytest.raises(ValueError, match=message):
        FAMILY.dispatch_request("scaled_mm", **problem)
    with pytest.raises(ValueError, match=rf"^{variable} must be an int in \[1, 2\^31 - 1\]"):
        dispatch.choose("scaled_mm", **problem)  # before any library is looked for


def test_dispatch_request_accepts_the_edges():
    key, values = FAMILY.dispatch_request("scaled_mm_azp", a_dtype=INT8, out_dtype=BF16,
                                          m=2**31 - 1, n=1, k=2**31 - 1)
    assert key == ("scaled_mm", "int8", "bf16", "ScaledEpilogueAzp") and values == (2**31 - 1, 1, 2**31 - 1)


@pytest.mark.parametrize("value, shown", [(None, "None"), ([1, 2], "a list of 2 items"), (3, "an int 3"),
                                          ("x", "a string 'x'"), (object(), "an object object")])
def test_argument_errors_show_values_in_plain_words(value, shown):
    """No Python type names (NoneType, list, ...) in an op's argument error: plain words."""
    with pytest.raises(ValueError, match=rf"^gemmgen\.scaled_mm: argument 'a': expected .*; got {re.escape(shown)}$"):
        gemmgen.scaled_mm(value, None, None, None, BF16)


# ------------------------------------------------- the eager path's quick acceptance

_DTYPES = [INT8, FP8, BF16, torch.float16, torch.float32, torch.int32]


def _strided(sizes, strides, dtype):
    return torch.empty_strided(sizes, strides, dtype=dtype, device="cuda")


def _slow_problem(out, a, b, scale_a, scale_b, bias):
    """What the implementation reads after check_arguments, the long way (or None: refused)."""
    try:
        ops.check_arguments(out, a, b, scale_a, scale_b, bias, None, None)
    except ValueError:
        return None
    m, k = a.shape
    n = b.shape[1]
    return (m, n, k, a.get_device(), a.stride(0) if m > 1 else k, b.stride(1) if n > 1 else k,
            out.stride(0) if m > 1 else n, scale_a.numel() > 1, scale_b.numel() > 1)


@pytest.mark.parametrize("m", [1, 2, 16, 33])
@pytest.mark.parametrize("dtype, out_dtype", [(INT8, BF16), (FP8, torch.float16)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_quick_acceptance_takes_the_common_calls(fake, m, dtype, out_dtype, with_bias):
    """The usual calls (one token or many, per-token and per-tensor scales, bias or not) take
    the quick path, with the sizes the long way reads."""
    n, k = 48, 64
    a, b, _, _ = _problem(m, n, k, dtype)
    out = torch.empty((m, n), dtype=out_dtype, device="cuda")
    scale_a = torch.empty(m, 1, dtype=torch.float32, device="cuda")
    scale_b = torch.empty(1, dtype=torch.float32, device="cuda")
    bias = torch.empty(n, dtype=out_dtype, device="cuda") if with_bias else None
    quick = ops._common_problem(out, a, b, scale_a, scale_b, bias)
    assert quick is not None and quick == _slow_problem(out, a, b, scale_a, scale_b, bias)


def test_quick_acceptance_never_takes_what_the_checks_refuse():
    """3000 random calls around the valid ones (each size, stride, dtype and vector length wrong
    now and then): whenever the quick path accepts, check_arguments accepts too and the sizes
    agree (it may refuse more: those calls take the long way). Every outcome must occur often,
    or the property says little."""
    rng = random.Random(28)

    def pick(good, *bad):  # a good value, or now and then a bad one
        return rng.choice(bad) if bad and rng.random() < 0.06 else rng.choice(good)

    def vector(own, dtype):
        kind = pick(["1", "own"], "other", "strided", "int32")
        size = {"1": 1, "own": own, "other": own + 1, "strided": own, "int32": own}[kind]
        return _strided((size,), (2 if kind == "strided" else 1,), torch.int32 if kind == "int32" else dtype)

    seen = {"quick": 0, "long way only": 0, "refused": 0}
    with FakeTensorMode():
        for _ in range(3000):
            m, n, k = pick([1, 2, 3, 16], 0), pick([8, 16, 24], 1, 2, 12), pick([16, 32], 8, 24)
            a_dtype, out_dtype = pick([INT8, FP8], BF16), pick([BF16, torch.float16], torch.float32)
            lda, ldb, ldd = (pick([size, size + 16], size - 1, size + 1, size + 8, 1) for size in (k, k, n))
            a = _strided((m, k), (max(lda, 1), 1), a_dtype)
            b_dtype = pick([a_dtype], INT8 if a_dtype != INT8 else FP8)
            b = _strided((k, n), pick([(1, max(ldb, 1))], (max(ldb, 1), 1)), b_dtype)
            out = _strided((m, n), pick([(max(ldd, 1), 1)], (1, max(m, 1))), out_dtype)
            scale_a, scale_b = vector(m, torch.float32), vector(n, torch.float32)
            bias = pick([None, vector(n, out_dtype)])
            quick = ops._common_problem(out, a, b, scale_a, scale_b, bias)
            slow = _slow_problem(out, a, b, scale_a, scale_b, bias)
            if quick is not None:
                assert quick == slow, (quick, slow)
            seen["quick" if quick is not None else "long way only" if slow is not None else "refused"] += 1
    assert min(seen.values()) >= 50, seen
