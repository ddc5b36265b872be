"""Setup of the GPU tests: skip unless an sm90 GPU and a built gemmgen library are present.

Every test in this folder is skipped (with the reason) when
  * no CUDA device is visible,
  * the current device is not compute capability (9, 0) (the kernels are sm90a SASS only), or
  * `gemmgen.list_kernels()` raises `LibraryNotBuiltError` (run `gemmgen build` first).
Any other error from loading the library is NOT turned into a skip: it fails the tests.

Fixtures:
  * `built_kernel` (W8A8) and `built_<family>_kernel` (e.g. `built_mixed_kernel`): parametrized
    at collection time over every built kernel of that op family (`gemmgen.list_kernels()`);
    collection never fails: without GPU or library it yields one skipped case.
  * `w8a8_built`: skips unless a W8A8 kernel is built; `w8a8_dispatch_library` and
    `moe_dispatch_library`: the built library the tuner would take for the family (one with
    dispatch rules: the shipped manifest's, not the rule-less test samples'), or a skip when
    there is none.
  * autouse: per-test seed (stable hash of the test id, so a failure reproduces), and a
    `torch.cuda.synchronize()` after each test so an asynchronous CUDA error is reported by the
    test that caused it.

Only the small test manifests built (tests/gpu/manifests/): a test that asks dispatch for a class
(dtypes, epilogue, scheme) none of them builds raises gemmgen.errors.NoKernelError; that test is
reported as skipped, naming the class and the shipped manifests that build it, as long as a
shipped manifest builds that class and none of those shipped libraries is built. A class no
shipped manifest builds, or one whose shipped library is built, stays a failure, as does any
assertion (only the error itself, or one raised from it, counts).
"""

from __future__ import annotations

import functools
import zlib

import pytest
import torch

import gemmgen
from gemmgen import settings
from gemmgen.bindings.library import libraries, manifest_libraries
from gemmgen.errors import GemmgenError, LibraryNotBuiltError, NoKernelError


@functools.cache
def _device_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False"
    capability = torch.cuda.get_device_capability()
    if capability != (9, 0):
        return (f"needs an sm90 (Hopper, compute capability (9, 0)) GPU; the current device "
                f"{torch.cuda.get_device_name()!r} has capability {capability}")
    return None


def gpu_skip_reason() -> str | None:
    """Why the GPU tests cannot run here, or None. Errors other than a missing library propagate."""
    reason = _device_skip_reason()
    if reason is not None:
        return reason
    try:
        gemmgen.list_kernels()
    except LibraryNotBuiltError as exc:
        return f"gemmgen kernel library not available (LibraryNotBuiltError): {exc}"
    return None


@pytest.fixture(scope="session")
def gpu_ready() -> None:
    """For module- or session-scoped fixtures, which run before the per-test check below."""
    reason = gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def w8a8_built(gpu_ready) -> None:
    """For the tests that need the W8A8 family's kernels (its tuner's), whatever else is built."""
    if not any(k.spec.family == "w8a8" for k in gemmgen.list_kernels()):
        pytest.skip("no W8A8 kernel built (these tests tune or dispatch the int8 scaled_mm)")


def _tuner_library(family: str, manifest: str):
    """The library `gemmgen tune` takes for `family` on this GPU (the one with its dispatch
    rules), or a skip saying why there is none."""
    from gemmgen.tuning.tune import choose_library  # torch-heavy: only where a test tunes

    try:
        return choose_library(None, family)
    except GemmgenError as exc:  # none (the test samples have no rules) or several
        pytest.skip(f"no one {family} library for the tuner: {exc} (build "
                    f"gemmgen/manifests/{manifest} alone beside the samples)")


@pytest.fixture(scope="session")
def w8a8_dispatch_library(gpu_ready):
    """The library `gemmgen tune` takes for W8A8 on this GPU (the one with W8A8 dispatch rules)."""
    return _tuner_library("w8a8", "w8a8_sm90.yaml")


@pytest.fixture(scope="session")
def moe_dispatch_library(gpu_ready):
    """The library `gemmgen tune` takes for the MoE family on this GPU."""
    return _tuner_library("moe", "moe_sm90.yaml")


@functools.cache
def _shipped_builders() -> dict[tuple[str, ...], tuple[str, ...]]:
    """(dispatch class, arch) -> the names of the shipped libraries whose manifests build it (read
    from the manifests, nothing built)."""
    found: dict[tuple[str, ...], list[str]] = {}
    for library in manifest_libraries(settings.default_manifests()):
        for kernel in library.kernels.values():
            found.setdefault((*kernel.spec.dispatch_class, kernel.spec.arch), []).append(library.name)
    return {key: tuple(dict.fromkeys(names)) for key, names in found.items()}


def _no_kernel_in_samples(error: BaseException | None) -> str | None:
    """Why a test that failed with `error` is a skip, or None (a failure): `error` is, or was
    raised from (its __cause__ chain, as opcheck re-raises), a NoKernelError of dispatch over the
    built libraries for a class that a shipped manifest builds for one of the arches asked, while
    none of those shipped libraries is built. Anything else stays a failure: an assertion, a class
    no shipped manifest builds (a bug), a lookup from manifests."""
    seen = set()
    try:
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            if isinstance(error, NoKernelError):
                if error.from_manifests:
                    return None
                shipped = sorted({name for arch in error.arches
                                  for name in _shipped_builders().get((*error.key, arch), ())})
                built = sorted(lib.name for lib in libraries())
                if not shipped or set(shipped) & set(built):
                    return None
                return (f"{error} (built libraries: {', '.join(built)}; the shipped "
                        f"{', '.join(shipped)} would build it)")
            error = error.__cause__
    except Exception:  # noqa: BLE001 - the hook must never turn a report into an internal error
        return None
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and report.failed and call.excinfo is not None:
        reason = _no_kernel_in_samples(call.excinfo.value)
        if reason is not None:
            line = item.location[1]
            report.outcome = "skipped"
            report.longrepr = (str(item.path), (line or 0) + 1, f"Skipped: {reason}")


@pytest.fixture(autouse=True)
def _gpu_test_environment(request):
    reason = gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))  # seeds every CUDA device too
    yield
    torch.cuda.synchronize()


def _kernel_fixture(metafunc) -> tuple[str, str] | None:
    """(fixture name, op family) of a `built_kernel` / `built_<family>_kernel` fixture."""
    for name in metafunc.fixturenames:
        if name == "built_kernel":
            return name, "w8a8"
        if name.startswith("built_") and name.endswith("_kernel"):
            return name, name[len("built_"):-len("_kernel")]
    return None


def pytest_generate_tests(metafunc):
    found = _kernel_fixture(metafunc)
    if found is None:
        return
    fixture, family = found
    try:
        reason = gpu_skip_reason()
        names = [] if reason is not None else [k.name for k in gemmgen.list_kernels()
                                               if k.spec.family == family]
    except Exception as exc:  # a broken library must fail the test, not abort the collection
        metafunc.parametrize(fixture, [pytest.param(exc, id="list_kernels-failed")], indirect=True)
        return
    if reason is not None:
        params = [pytest.param(None, id="unavailable", marks=pytest.mark.skip(reason=reason))]
    elif not names:
        params = [pytest.param(None, id="no-kernels", marks=pytest.mark.skip(
            reason=f"no built kernel of op family {family!r}"))]
    else:
        params = [pytest.param(name, id=name) for name in names]
    metafunc.parametrize(fixture, params, indirect=True)


def _built(request):
    value = request.param
    if isinstance(value, BaseException):
        raise value
    kernels = {k.name: k for k in gemmgen.list_kernels()}
    if value not in kernels:
        pytest.fail(f"kernel {value} was listed at collection time but is gone now")
    return kernels[value]


@pytest.fixture
def built_kernel(request):
    """One built W8A8 kernel (a `gemmgen` Kernel object), from the collection-time list."""
    return _built(request)


@pytest.fixture
def built_mixed_kernel(request):
    """One built mixed-input kernel, from the collection-time list."""
    return _built(request)


@pytest.fixture
def built_moe_kernel(request):
    """One built MoE (grouped_matmul_swiglu_quant) kernel, from the collection-time list."""
    return _built(request)
