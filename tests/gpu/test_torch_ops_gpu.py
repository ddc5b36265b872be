"""The families' torch ops as PyTorch sees them (gemmgen/bindings/torch_ops.py: ops defined on the
dispatcher with a CUDA and a fake kernel), with kernels forced by name so that any built library
serves (the shipped ones or tests/gpu/manifests/sample_*.yaml):

  * `torch.library.opcheck` of `gemmgen::scaled_mm_out`, `gemmgen::mixed_mm_out` and
    `gemmgen::grouped_matmul_swiglu_quant_out` (schema and mutation annotations, fake kernel,
    AOT dispatch with dynamic shapes);
  * `torch.compile(fullgraph=True)` of a function calling each public op: bit for bit the eager
    result;
  * CUDA graph capture of the raw op: replay after new inputs are copied in gives the eager
    result of the new inputs.
"""

from __future__ import annotations

import pytest
import torch

import gemmgen
# each family's ops module registers its op on import (the public functions import it lazily)
import gemmgen.families.mixed.ops  # noqa: F401
import gemmgen.families.moe.ops  # noqa: F401
import gemmgen.families.w8a8.ops  # noqa: F401
from gemmgen.families.mixed.configs import WEIGHT_TYPES_FOR_KERNEL
from gemmgen.families.mixed.packing import q_range

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")


def first_kernel(family: str, **fields):
    for k in gemmgen.list_kernels():
        if k.spec.family == family and all(getattr(k.spec, f) == v for f, v in fields.items()):
            return k
    pytest.skip(f"no built {family} kernel with {fields}")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# --------------------------------------------------------------------------- the three ops

class W8A8:
    def __init__(self):
        self.kernel = first_kernel("w8a8", a="int8", d="bf16", epilogue="ScaledEpilogueBias")
        m, n, k = 40, 256, 512
        self.a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=DEVICE)
        self.b = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEVICE).t()
        self.scale_a = torch.rand(m, 1, device=DEVICE) * 1e-2
        self.scale_b = torch.rand(1, n, device=DEVICE) * 1e-2
        self.bias = torch.randn(n, device=DEVICE).to(torch.bfloat16)
        self.out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)

    def raw_args(self):
        return (self.out, self.a, self.b, self.scale_a, self.scale_b, self.bias, None, None,
                self.kernel.name)

    def raw_op(self):
        return torch.ops.gemmgen.scaled_mm_out

    def public(self, a):
        return gemmgen.scaled_mm(a, self.b, self.scale_a, self.scale_b, torch.bfloat16,
                                 bias=self.bias, kernel=self.kernel.name)

    def inputs(self):
        return self.a

    def outputs(self):
        return (self.out,)


class Mixed:
    def __init__(self):
        self.kernel = first_kernel("mixed")
        spec = self.kernel.spec
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[spec.a]
        weight_type = WEIGHT_TYPES_FOR_KERNEL[(spec.w, spec.scheme)][0]
        m, n, k, group = 24, 256, 512, 32 if spec.group_k == 32 else 128
        low, high = q_range(weight_type)
        q = torch.randint(low, high + 1, (n, k), dtype=torch.int32, device=DEVICE)
        zeros = (torch.randint(0, 16, (n, k // group), dtype=torch.int32, device=DEVICE)
                 if weight_type == "uint4" else None)
        scales = (torch.rand(n, k // group, device=DEVICE) * 0.02 + 0.005).to(dtype)
        self.packed = gemmgen.pack_weights(q, scales, zeros, weight_type=weight_type,
                                           group_size=group, arch="sm90a")
        self.a = torch.randn(m, k, device=DEVICE).to(dtype)
        self.bias = torch.randn(n, device=DEVICE).to(dtype)
        self.out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)

    def raw_args(self):
        p = self.packed
        return (self.out, self.a, p.qweight, p.scales, p.zeros, self.bias, p.weight_type,
                p.group_size, p.n, p.k, self.kernel.name)

    def raw_op(self):
        return torch.ops.gemmgen.mixed_mm_out

    def public(self, a):
        return gemmgen.mixed_mm(a, self.packed, self.bias, kernel=self.kernel.name)

    def inputs(self):
        return self.a

    def outputs(self):
        return (self.out,)


class Moe:
    def __init__(self):
        self.kernel = first_kernel("moe", x="int8", w="int8")
        e, m, n, k = 4, 50, 256, 256
        self.packed = gemmgen.pack_moe_weights(
            torch.randint(-128, 128, (e, k, n), dtype=torch.int8, device=DEVICE),
            torch.rand(e, n, device=DEVICE) * 1e-2 + 1e-3)
        self.x = torch.randint(-128, 128, (m, k), dtype=torch.int8, device=DEVICE)
        self.x_scale = torch.rand(m, device=DEVICE) * 1e-2 + 1e-3
        self.group_list = torch.tensor([20, 0, 25, 5], dtype=torch.int64, device=DEVICE)
        self.q = torch.full((m, n // 2), -128, dtype=torch.int8, device=DEVICE)
        self.q_scale = torch.full((m,), float("nan"), device=DEVICE)

    def raw_args(self):
        return (self.q, self.q_scale, self.x, self.packed.weight, self.packed.scale, self.x_scale,
                self.group_list, "count", 8, False, self.kernel.name)

    def raw_op(self):
        return torch.ops.gemmgen.grouped_matmul_swiglu_quant_out

    def public(self, x):
        return gemmgen.grouped_matmul_swiglu_quant(x, self.packed, None, self.x_scale,
                                                   self.group_list, check=False,
                                                   kernel=self.kernel.name)

    def inputs(self):
        return self.x

    def outputs(self):
        return (self.q, self.q_scale)


OPS = {"w8a8": W8A8, "mixed": Mixed, "moe": Moe}


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


@pytest.mark.parametrize("family", list(OPS))
def test_opcheck(family):
    case = OPS[family]()
    torch.library.opcheck(case.raw_op(), case.raw_args())


@pytest.mark.parametrize("family", list(OPS))
def test_torch_compile_fullgraph_equals_eager(family):
    case = OPS[family]()
    eager = as_tuple(case.public(case.inputs()))
    compiled = torch.compile(case.public, fullgraph=True)
    for _ in range(2):  # the second call runs the cached compiled code
        got = as_tuple(compiled(case.inputs()))
        assert all(same_bits(g, e) for g, e in zip(got, eager, strict=True)), family


@pytest.mark.parametrize("family", list(OPS))
def test_cuda_graph_of_the_raw_op(family):
    case = OPS[family]()
    op, args = case.raw_op(), case.raw_args()
    op(*args)  # warm-up outside capture (kernel choice, shared-memory attribute)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*args)
    source = case.inputs()
    source.copy_(torch.randint(-128, 128, source.shape, device=DEVICE).to(source.dtype)
                 if source.dtype == torch.int8 else torch.randn(source.shape, device=DEVICE).to(source.dtype))
    for out in case.outputs():  # poison no op writes: NaN bytes (float), -128 (int8 q: ±127 at most)
        out.view(torch.uint8).fill_(0x80 if out.dtype == torch.int8 else 0xFF)
    graph.replay()
    torch.cuda.synchronize()
    want = as_tuple(case.public(source.clone()))
    assert all(same_bits(g, w) for g, w in zip(case.outputs(), want, strict=True)), family


@pytest.mark.parametrize("family", list(OPS))
def test_written_outputs_get_a_new_version(family):
    """The kernels write through raw pointers; the ops bump the outputs' version counters like
    an in-place torch op, through the dispatcher and eagerly alike."""
    case = OPS[family]()
    before = [t._version for t in case.outputs()]
    case.raw_op()(*case.raw_args())
    after = [t._version for t in case.outputs()]
    assert all(a > b for a, b in zip(after, before)), (family, before, after)
