"""Arguments of the wrong kind — a number where a tensor goes, an `out` of the wrong rank, a CPU
tensor subclass, a hand-built packed weight holding no tensor — get each op's ValueError naming
the argument, on the eager path and through the custom op (FakeTensorMode: what torch.compile
traces), never torch's schema RuntimeError, an AttributeError or a NotImplementedError. No GPU:
CUDA tensors are fake (built directly: views of fake CUDA tensors need a CUDA build)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import gemmgen
from gemmgen.families.mixed import ops as mixed_ops
from gemmgen.families.mixed.packing import PackedWeight
from gemmgen.families.moe.packing import MoeWeight

BF16, INT8 = torch.bfloat16, torch.int8


def cuda(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="cuda")


def w8a8_operands():
    """a [16, 64] int8, b = [64, 32] column-major, per-tensor scales (fake CUDA)."""
    return (cuda(16, 64, dtype=INT8), torch.empty_strided((64, 32), (1, 64), dtype=INT8, device="cuda"),
            cuda(1, dtype=torch.float32), cuda(1, dtype=torch.float32))


def int8_packed(n=8, k=64):
    return PackedWeight(qweight=cuda(n, k, dtype=INT8), scales=cuda(1, n), zeros=None,
                        weight_type="int8", group_size=k, k=k, n=n)


def moe_operands(e=2, m=4, n=16, k=64):
    """x int8 [M, K], a packed MoeWeight [E, N, K] with [E, N] scales, x_scale, group_list."""
    return (cuda(m, k, dtype=INT8), MoeWeight(cuda(e, n, k, dtype=INT8), cuda(e, n, dtype=torch.float32)),
            cuda(m, dtype=torch.float32), cuda(e, dtype=torch.int64))


@pytest.mark.parametrize("changes,argument", [
    (dict(scale_a=1.0), "scale_a"), (dict(b=[[1]]), "b"), (dict(bias=1.0), "bias"),
    (dict(kernel=3), "kernel"), (dict(arch="sm70"), "arch"), (dict(split_k=0), "split_k"),
])
def test_scaled_mm_through_the_custom_op(changes, argument):
    with FakeTensorMode():
        a, b, scale_a, scale_b = w8a8_operands()
        args = dict(a=a, b=b, scale_a=scale_a, scale_b=scale_b, out_dtype=BF16)
        args.update(changes)
        with pytest.raises(ValueError, match=rf"^gemmgen\.scaled_mm: argument '{argument}': expected "):
            gemmgen.scaled_mm(**args)


def test_scaled_mm_out_that_is_not_a_tensor():
    a = torch.zeros(16, 64, dtype=INT8)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm: argument 'out': expected None or a "
                                         r"torch.bfloat16 tensor .*; got an int 5"):
        gemmgen.scaled_mm(a, a.t(), torch.ones(1), torch.ones(1), BF16, out=5)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm_azp: argument 'out'"):
        gemmgen.scaled_mm_azp(a, a.t(), torch.ones(1), torch.ones(1), BF16,
                              torch.zeros(16, dtype=torch.int32), out="out")


@pytest.mark.parametrize("call", ["scaled_mm", "mixed_mm", "moe"])
def test_a_cpu_tensor_subclass_is_refused_by_name(call):
    """An nn.Parameter on the CPU goes through the dispatcher (a subclass): its CPU kernel is the
    op's, whose first check asks for a CUDA tensor."""
    param = lambda t: torch.nn.Parameter(t, requires_grad=False)  # noqa: E731
    with pytest.raises(ValueError, match=r"argument '(a|x)': expected .*CUDA tensor"):
        if call == "scaled_mm":
            a = torch.zeros(16, 64, dtype=INT8)
            gemmgen.scaled_mm(param(a), a.t(), torch.ones(1), torch.ones(1), BF16)
        elif call == "mixed_mm":
            packed = gemmgen.pack_weights(torch.zeros(8, 64, dtype=torch.int32), torch.ones(8, 1, dtype=BF16),
                                          weight_type="int8", group_size=64)
            gemmgen.mixed_mm(param(torch.zeros(4, 64, dtype=BF16)), packed)
        else:
            packed = gemmgen.pack_moe_weights(torch.zeros(2, 64, 16, dtype=INT8), torch.ones(2, 16))
            gemmgen.grouped_matmul_swiglu_quant(param(torch.zeros(4, 64, dtype=INT8)), packed, None,
                                                torch.ones(4), torch.tensor([2, 2]))


@pytest.mark.parametrize("changes,argument", [
    (dict(out=lambda: cuda(32)), "out"), (dict(out=lambda: cuda(1, 4, 8)), "out"),
    (dict(bias=lambda: 1.0), "bias"), (dict(kernel=lambda: 7), "kernel"),
])
def test_mixed_mm_arguments_of_the_wrong_kind(changes, argument):
    with FakeTensorMode():
        args = dict(a=cuda(4, 64), packed=int8_packed())
        args.update({name: make() for name, make in changes.items()})
        with pytest.raises(ValueError, match=rf"^gemmgen\.mixed_mm: argument '{argument}': expected "):
            gemmgen.mixed_mm(**args)


def test_mixed_mm_out_op_metadata():
    """The custom op called directly (README: with a packed weight's tensors): missing scales,
    K or N of 0 are refused by name."""
    op = torch.ops.gemmgen.mixed_mm_out
    with FakeTensorMode():
        with pytest.raises(ValueError, match=r"argument 'packed.scales': expected a \[1, 8\] tensor"):
            mixed_ops.check_arguments(cuda(4, 8), cuda(4, 64), cuda(8, 64, dtype=INT8), None, None,
                                      None, "int8", 64, 8, 64)
        for n, k in ((8, 0), (0, 64)):
            with pytest.raises(ValueError, match=r"argument 'packed': expected K a positive multiple "
                                                 r"of 64 and N a positive multiple of 8"):
                op(cuda(4, n), torch.empty_strided((4, k), (64, 1), dtype=BF16, device="cuda"),
                   cuda(n, k, dtype=INT8), cuda(1, n), None, None, "int8", max(k, 1), n, k)
        with pytest.raises(ValueError, match=r"argument 'bias': expected None or a torch.bfloat16 tensor"):
            mixed_ops.check_arguments(cuda(4, 8), cuda(4, 64), cuda(8, 64, dtype=INT8), cuda(1, 8),
                                      None, 1.0, "int8", 64, 8, 64)


@pytest.mark.parametrize("changes,argument", [
    (dict(x_scale=1.0), "x_scale"), (dict(group_list=[2, 2]), "group_list"),
    (dict(check="yes"), "check"), (dict(kernel=1), "kernel"),
])
def test_moe_arguments_of_the_wrong_kind_through_the_custom_op(changes, argument):
    with FakeTensorMode():
        x, weight, x_scale, group_list = moe_operands()
        args = dict(x=x, weight=weight, weight_scale=None, x_scale=x_scale, group_list=group_list)
        args.update(changes)
        with pytest.raises(ValueError, match=rf"^gemmgen\.grouped_matmul_swiglu_quant: argument "
                                             rf"'{argument}': expected "):
            gemmgen.grouped_matmul_swiglu_quant(**args)


@pytest.mark.parametrize("weight", [MoeWeight(None, torch.ones(4, 32)),
                                    MoeWeight(torch.zeros(4, dtype=torch.uint8), torch.ones(4, 32), bits=4)])
def test_a_hand_built_moe_weight_without_its_tensors(weight):
    with pytest.raises(ValueError, match=r"argument 'weight': expected a MoeWeight holding a 3-D "
                                         r"packed weight tensor"):
        gemmgen.grouped_matmul_swiglu_quant(torch.zeros(4, 64, dtype=INT8), weight, None,
                                            torch.ones(4), torch.tensor([2, 2]),
                                            weight_assist_matrix=torch.ones(4, 32))


def test_pack_moe_weights_int4_on_meta_tensors():
    with pytest.raises(ValueError, match=r"argument 'weight': expected int4 values -8..7 in a tensor "
                                         r"with data .*not a meta tensor"):
        gemmgen.pack_moe_weights(torch.empty(2, 128, 16, dtype=INT8, device="meta"),
                                 torch.empty(2, 16, device="meta"), weight_bits=4)
