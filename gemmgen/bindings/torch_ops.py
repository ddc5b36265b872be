"""Registering an op family's torch op with PyTorch's dispatcher: `gemmgen::<name>`, an op that
writes into its output tensors (declared mutable in the schema), with a CUDA kernel (the family's
eager implementation) and a fake one (shape and argument checks only), for CUDA graphs,
`torch.compile(fullgraph=True)` and `torch.library.opcheck`.

NOTES: the ops are defined through `torch.library.Library` directly, not `torch.library.custom_op`:
custom_op wraps every call in Python autograd and ADInplaceOrView kernels, measured at 28 µs per
call against 4.6 µs for the same no-op body defined this way (CPU host, torch 2.13) — the whole
budget of a small-M GEMM, paid on every call `torch.compile` makes without CUDA graphs. The ops
take no gradients (quantized operands), so autograd falls through to PyTorch's own
not-implemented fallback (C++), which only speaks when an input requires grad.
"""

from __future__ import annotations

from typing import Callable

import torch

NAMESPACE = "gemmgen"

# One fragment of the `gemmgen` namespace for every family's op; kept alive for the process
# (an op is deregistered when its Library is collected).
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


def define_out_op(name: str, schema: str, cuda_impl: Callable, fake_impl: Callable):
    """Define `gemmgen::<name><schema>` (e.g. "(Tensor(a!) out, Tensor a) -> ()"), register
    `cuda_impl` as its CUDA kernel and `fake_impl` as its fake (meta) kernel; return the op
    (`torch.ops.gemmgen.<name>`)."""
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, cuda_impl, "CUDA")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake_impl, lib=_LIBRARY)
    return getattr(getattr(torch.ops, NAMESPACE), name)
