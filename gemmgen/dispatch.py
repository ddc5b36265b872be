"""Dispatch: which compiled kernel serves a problem, looked up from Python.

The rules are the manifest's ordered `dispatch` tables (first match wins), generated into the
library's bindings and parsed once at load; lookups are memoized per problem key.

    gemmgen.dispatch.lookup("scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16,
                            epilogue="ScaledEpilogueBias", m=37, n=4096, k=4096)
    gemmgen.dispatch.explain(...)      # which rule chose it, and why
    gemmgen.dispatch.kernels()         # every built kernel
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .bindings.library import Kernel, all_kernels, libraries
from .generator.kernel_config import AZP_EPILOGUES, EPILOGUES

_DTYPE_NAMES = {"int8": "int8", "float8_e4m3fn": "e4m3", "e4m3": "e4m3", "bfloat16": "bf16",
                "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16"}
_OPS = ("scaled_mm", "scaled_mm_azp")
# Without an explicit arch, the fastest family that serves the problem: Hopper kernels first.
ARCH_PREFERENCE = ("sm90a", "sm80")


def dtype_name(dtype) -> str:
    """'int8' / 'e4m3' / 'bf16' / 'fp16' for a torch dtype or one of those strings."""
    text = str(dtype).removeprefix("torch.")
    if text not in _DTYPE_NAMES:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of torch.int8, "
                         "torch.float8_e4m3fn, torch.bfloat16, torch.float16")
    return _DTYPE_NAMES[text]


@dataclass(frozen=True)
class Choice:
    """The kernel a rule picked, with the rule's text and manifest line."""

    kernel: Kernel
    rule: str
    rule_index: int
    line: int


def _epilogue_for(op: str, epilogue: str | None) -> str:
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(_OPS)}")
    epilogue = epilogue or ("ScaledEpilogue" if op == "scaled_mm" else "ScaledEpilogueAzp")
    if epilogue not in EPILOGUES or (op == "scaled_mm_azp") != (epilogue in AZP_EPILOGUES):
        allowed = AZP_EPILOGUES if op == "scaled_mm_azp" else tuple(
            e for e in EPILOGUES if e not in AZP_EPILOGUES)
        raise ValueError(f"epilogue {epilogue!r} does not belong to op {op!r}; expected one of "
                         f"{', '.join(allowed)}")
    return epilogue


@functools.lru_cache(maxsize=8192)
def _choose(arches: tuple[str, ...], a: str, d: str, epilogue: str, m: int, n: int, k: int) -> Choice:
    key = ("scaled_mm", a, d, epilogue)
    for arch in arches:
        for library in libraries():
            rules = library.dispatch.get(key) if library.arch == arch else None
            if rules is None:
                continue
            for index, (condition, name, line) in enumerate(rules):
                if condition.matches(m, n, k):
                    return Choice(library.kernels[name], condition.source, index, line)
            # check_rule_table proved the table has no gap at build time
            raise AssertionError(f"dispatch table for {key} has a gap at m={m}, n={n}, k={k}")
    built = sorted({(k.spec.arch, k.spec.a, k.spec.d, k.spec.epilogue)
                    for k in all_kernels().values()})
    raise ValueError(f"no built kernel for {'/'.join(arches)} computes {a} x {a} -> {d} with "
                     f"{epilogue}; built (arch, a, d, epilogue): {built}. Add it to a manifest and "
                     "run `gemmgen build`.")


def _arches(arch) -> tuple[str, ...]:
    if arch is None:
        return ARCH_PREFERENCE
    arches = (arch,) if isinstance(arch, str) else tuple(arch)
    for name in arches:
        if name not in ARCH_PREFERENCE:
            raise ValueError(f"unknown arch {name!r}; expected one of {', '.join(ARCH_PREFERENCE)}")
    return arches


def choose(op: str = "scaled_mm", *, a_dtype, out_dtype, epilogue: str | None = None,
           m: int, n: int, k: int, arch=None) -> Choice:
    """The dispatch decision for a problem (kernel, rule and its manifest line).

    `arch` ("sm90a", "sm80" or a preference list) picks the kernel family; by default the first of
    ARCH_PREFERENCE whose libraries serve the problem.
    """
    for label, value in (("m", m), ("n", n), ("k", k)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int, got {value!r}")
    return _choose(_arches(arch), dtype_name(a_dtype), dtype_name(out_dtype),
                   _epilogue_for(op, epilogue), m, n, k)


def lookup(op: str = "scaled_mm", *, a_dtype, out_dtype, epilogue: str | None = None,
           m: int, n: int, k: int, arch=None) -> Kernel:
    """The kernel the dispatch table picks: `.name`, `.config`, and callable like the op."""
    return choose(op, a_dtype=a_dtype, out_dtype=out_dtype, epilogue=epilogue, m=m, n=n, k=k,
                  arch=arch).kernel


def explain(op: str = "scaled_mm", *, a_dtype, out_dtype, epilogue: str | None = None,
            m: int, n: int, k: int, arch=None) -> str:
    """One paragraph: which rule chose which kernel for this problem, and where the rule lives."""
    c = choose(op, a_dtype=a_dtype, out_dtype=out_dtype, epilogue=epilogue, m=m, n=n, k=k, arch=arch)
    return (f"m={m}, n={n}, k={k}: rule {c.rule_index} ({c.rule!r}, {c.kernel.spec.origin.file}:"
            f"{c.line}) is the first that matches; it picks {c.kernel.name} "
            f"(config {c.kernel.spec.origin.config!r}).")


def kernels(op: str | None = None) -> list[Kernel]:
    """Every built kernel, sorted by name; `op='scaled_mm_azp'` keeps the azp epilogues only."""
    found = sorted(all_kernels().values(), key=lambda kernel: kernel.name)
    if op is None:
        return found
    _epilogue_for(op, None)
    return [k for k in found if (k.spec.epilogue in AZP_EPILOGUES) == (op == "scaled_mm_azp")]


def cache_clear() -> None:
    _choose.cache_clear()
