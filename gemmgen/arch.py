"""The one arch policy: which kernel arch gemmgen builds how, and which GPUs run it.

Every layer asks here — the build (nvcc flags), the generated C++ (each entry point checks the
device's compute capability against the bounds rendered from `Arch`), the ops (which arch serves
a tensor's GPU), dispatch (preference order) and the tuner (which library a GPU tunes).
"""

from __future__ import annotations

from dataclasses import dataclass

Capability = tuple[int, int]


@dataclass(frozen=True)
class Arch:
    """One kernel arch: how it is compiled and the compute capabilities its binaries run on."""

    name: str
    cutlass: str                 # the CUTLASS API generation its templates use
    nvcc_flags: tuple[str, ...]
    min_capability: Capability
    max_capability: Capability   # inclusive
    gpus: str                    # the GPUs it runs on, in words, for error messages

    def runs_on(self, capability: Capability) -> bool:
        return self.min_capability <= tuple(capability) <= self.max_capability


# NOTES: sm90a is SASS only: wgmma/setmaxnreg exist only there, and PTX for a later arch would
# JIT into kernels that CUTLASS compiled empty (each .cu's #error guard enforces the same).
# sm80 ships Ampere SASS plus PTX, which the driver JIT-compiles on Ada and Hopper.
ARCHES: dict[str, Arch] = {
    "sm90a": Arch("sm90a", "CUTLASS 3.x", ("-gencode=arch=compute_90a,code=sm_90a",),
                  (9, 0), (9, 0), "an sm90 (Hopper) GPU"),
    "sm80": Arch("sm80", "CUTLASS 2.x", ("-gencode=arch=compute_80,code=[sm_80,compute_80]",),
                 (8, 0), (99, 9), "a GPU of compute capability >= 8.0"),
}
# Without an explicit arch, the fastest arch that serves a problem: Hopper kernels first.
PREFERENCE: tuple[str, ...] = ("sm90a", "sm80")


def get(name: str) -> Arch:
    """The arch called `name`; ValueError listing the known ones otherwise."""
    arch = ARCHES.get(name) if isinstance(name, str) else None
    if arch is None:
        raise ValueError(f"unknown arch {name!r}; expected one of {', '.join(PREFERENCE)}")
    return arch


def arches_for(capability: Capability) -> tuple[str, ...]:
    """The arches whose kernels run on a GPU of `capability`, fastest first (may be empty)."""
    return tuple(name for name in PREFERENCE if ARCHES[name].runs_on(capability))


def best_arch_for(capability: Capability) -> str | None:
    """The arch a GPU of `capability` dispatches to by default (None: no arch runs there)."""
    found = arches_for(capability)
    return found[0] if found else None
