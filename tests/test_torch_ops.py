"""CPU tests of gemmgen/bindings/torch_ops.py: the families' ops are defined on the dispatcher
with kernels whose Python defaults must equal the schema's (the dispatcher leaves out trailing
arguments equal to their default, so a kernel's own default would stand in for them)."""

from __future__ import annotations

from typing import Optional

import pytest
import torch

import gemmgen.families.mixed.ops  # noqa: F401  (each registers its op on import)
import gemmgen.families.moe.ops  # noqa: F401
import gemmgen.families.w8a8.ops  # noqa: F401
from gemmgen.bindings.torch_ops import _check_defaults

SCHEMA = torch._C.parse_schema("gemmgen::demo_out(Tensor(a!) out, Tensor x, bool? check=None, "
                               "SymInt bits=8) -> ()")


def test_matching_defaults_pass():
    def impl(out, x, check: Optional[bool] = None, bits: int = 8, extra=None):
        pass
    _check_defaults(SCHEMA, impl)


@pytest.mark.parametrize("impl, message", [
    (lambda out, x, check=False, bits=8: None, r"argument 2 \(check\) must default to None .*defaults to False"),
    (lambda out, x, check=None, bits=4: None, r"argument 3 \(bits\) must default to 8"),
    (lambda out, x, check, bits=8: None, r"argument 2 \(check\) must default to None"),
    (lambda out, x: None, r"does not take gemmgen::demo_out's argument 'check' at position 2"),
])
def test_mismatched_defaults_are_refused(impl, message):
    with pytest.raises(TypeError, match=message):
        _check_defaults(SCHEMA, impl)


@pytest.mark.parametrize("name", ["scaled_mm_out", "mixed_mm_out", "grouped_matmul_swiglu_quant_out"])
def test_the_families_ops_are_registered_with_cuda_and_fake_kernels(name):
    op = getattr(torch.ops.gemmgen, name).default
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta") or \
        torch._library.simple_registry.singleton.find(op.name()).fake_impl.kernel is not None
    assert op._schema.arguments[0].alias_info.is_write  # the output is declared mutated
