"""gemmgen: manifests → generator → templates → build → bindings → dispatch, for CUTLASS GEMMs.

Public API (torch is imported only when an op is first used):

    gemmgen.scaled_mm(a, b, scale_a, scale_b, out_dtype, bias=None, out=None, *, kernel=None,
                      arch=None, split_k=None)
    gemmgen.scaled_mm_azp(a, b, scale_a, scale_b, out_dtype, azp_adj, azp=None, bias=None, out=None,
                          *, kernel=None, arch=None, split_k=None)
    gemmgen.mixed_mm(a, packed, bias=None, out=None, *, kernel=None)
    gemmgen.grouped_matmul_swiglu_quant(x, weight, weight_scale, x_scale, group_list, ...),
    gemmgen.pack_moe_weights(...), gemmgen.MoeWeight
    gemmgen.pack_weights(q, scales, zeros=None, *, weight_type, group_size, g_idx=None, arch=None)
    gemmgen.unpack_weights(packed), gemmgen.PackedWeight.from_gptq / .from_awq / .from_compressed_tensors
    PackedWeight / MoeWeight .state_dict(prefix) / .from_state_dict(state, prefix)
    gemmgen.reference.scaled_mm / mixed_mm / grouped_matmul_swiglu_quant   # the plain torch
                                             # definitions the tests compare against
    gemmgen.list_kernels(op=None)
    gemmgen.dispatch.choose / lookup / explain / kernels
    gemmgen.autotune(enabled=True)   # context manager: tuning at first use
    gemmgen.reload()      # pick up a library rebuilt while this process runs
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
# `__all__` is every op family's `public_api` and these (computed on first use, in __getattr__, so
# that a new family's names are exported without editing this file)
_GENERIC_API = ("list_kernels", "dispatch", "reference", "reload", "autotune", "__version__")



def autotune(enabled: bool = True):
    """`with gemmgen.autotune():` — the first call of a problem no tuned table lists times the
    candidates and records the winner for later calls and processes (gemmgen/tuning/autotune.py;
    GEMMGEN_AUTOTUNE=1 turns it on for the whole process)."""
    from .tuning.autotune import autotune as context
    return context(enabled)


def list_kernels(op: str | None = None):
    """Every built kernel (name, config, origin), sorted by name; `op` keeps one user op's."""
    from .dispatch import kernels
    return kernels(op)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__getattr__("__all__")))


def __getattr__(name: str):
    """Each op family's public ops (e.g. scaled_mm) import torch on first use only; later
    lookups hit the module globals."""
    if name == "__all__":  # not cached: a family registered later joins it
        from .families import all_families
        return [api for family in all_families() for api in family.public_api] + list(_GENERIC_API)
    if name in ("dispatch", "reference"):
        value = importlib.import_module(f"gemmgen.{name}")
    else:
        from .families import all_families
        family = next((f for f in all_families() if name in f.public_api), None)
        if family is None:
            raise AttributeError(f"module 'gemmgen' has no attribute {name!r}")
        value = getattr(family.load_ops(), name)
    globals()[name] = value
    return value


def reload() -> None:
    """Forget loaded libraries and dispatch caches (after `gemmgen build` in this process)."""
    import sys

    from .bindings.library import reload as reload_libraries
    from .dispatch import cache_clear
    from .tuning import autotune as autotune_caches
    reload_libraries()
    cache_clear()
    autotune_caches.clear()
    launch = sys.modules.get("gemmgen.bindings.launch")  # loaded once an op ran; never import torch here
    if launch is not None:
        launch.clear_caches()
