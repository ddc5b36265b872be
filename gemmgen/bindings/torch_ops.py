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

import inspect
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
    op = getattr(getattr(torch.ops, NAMESPACE), name)
    for fn in (cuda_impl, fake_impl):
        _check_defaults(op.default._schema, fn)
    _LIBRARY.impl(name, cuda_impl, "CUDA")
    # NOTES: also the CPU kernel, whose first check refuses a CPU tensor by name: a tensor
    # subclass on the CPU (an nn.Parameter, say) goes through the dispatcher, which would
    # otherwise raise NotImplementedError for a backend without a kernel.
    _LIBRARY.impl(name, cuda_impl, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake_impl, lib=_LIBRARY)
    return op


def _check_defaults(schema, fn: Callable) -> None:
    """`fn` must take the schema's arguments in order, with the schema's defaults.

    NOTES: the dispatcher calls a Python kernel without the trailing arguments that equal their
    schema default, so the kernel's own default stands in for them: a different one would
    silently change the op (a `check=False` default under a `check=None` schema once turned
    the group-list check off for every torch.compile'd call)."""
    params = list(inspect.signature(fn).parameters.values())
    for i, argument in enumerate(schema.arguments):
        if i >= len(params) or params[i].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                      inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise TypeError(f"{fn.__qualname__} does not take {schema.name}'s argument "
                            f"{argument.name!r} at position {i}")
        if argument.has_default_value():
            default = params[i].default
            if default is inspect.Parameter.empty or default != argument.default_value:
                raise TypeError(f"{fn.__qualname__}: argument {i} ({params[i].name}) must default "
                                f"to {argument.default_value!r} like {schema.name}'s "
                                f"{argument.name!r}; it defaults to {default!r}")
