"""What every family's torch op shares between its argument checks and the C call: argument
errors, which arches serve a device (the arch policy), the memoized dispatch choice and the
plans the ops derive from it, a forced kernel by name, the per-thread argument buffer, output
allocation, and the launch on the current stream with workspace from torch's allocator.

NOTES: all of this runs on every call; a few µs here is the whole host budget of a small-M GEMM,
so device facts, dispatch choices and per-problem plans (kernel, knob codes, workspace size) are
memoized and the argument struct is packed into a reused buffer.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Optional

import torch

from .. import arch as arch_policy
from .. import dispatch
from ..errors import KernelLaunchError, describe_argument
from ..generator.kernel_config import RuntimeKnobs
from ..tuning.autotune import enabled as autotune_enabled
from .library import Kernel, all_kernels

ALIGN_BYTES = 16  # TMA: base addresses and leading strides in multiples of 16 bytes


def describe(t) -> str:
    """A tensor as argument errors show it (with its strides); anything else in plain words
    (errors.describe_argument)."""
    if not isinstance(t, torch.Tensor):
        return describe_argument(t)
    return f"{t.dtype} tensor of shape {tuple(t.shape)}, strides {tuple(t.stride())} on {t.device}"


class ArgumentErrors:
    """Builds the ValueErrors of one public op: `gemmgen.<op>: argument '<name>': expected ...`."""

    def __init__(self, op: str):
        self.prefix = f"gemmgen.{op}"

    def __call__(self, argument: str, expected: str, got: object) -> ValueError:
        return ValueError(f"{self.prefix}: argument '{argument}': expected {expected}; got {got}")

    def vector(self, name: str, t, dtype: torch.dtype, sizes: tuple[int, ...], what: str,
               device: int) -> None:
        """An optional 1-D-like tensor of `dtype` with one of `sizes` elements on `device`."""
        if t is None:
            return
        if not isinstance(t, torch.Tensor):
            raise self(name, f"a {dtype} tensor", describe(t))
        numel = t.numel()
        if t.dtype != dtype or numel not in sizes or t.get_device() != device:
            raise self(name, f"{dtype} on cuda:{device} with {what}", describe(t))
        if numel > 1 and not t.is_contiguous():
            raise self(name, "a contiguous tensor", describe(t))


_device_arches: dict[int, tuple[str, ...]] = {}
_checked_devices: set[tuple[int, str]] = set()
_choices: dict[tuple, tuple[Kernel, RuntimeKnobs, bool]] = {}  # (kernel, knobs, settled)
_plan_memos: list[dict] = []  # the families' plan_memo()s
_MAX_CHOICES = 1 << 14


def arches_for(device: int, arch: Optional[str], fail: ArgumentErrors,
               tensor: str = "a") -> tuple[str, ...]:
    """Kernel arches that run on `device`, fastest first (the arch policy); or the one asked for."""
    if arch is not None:
        if arch not in arch_policy.PREFERENCE:
            raise fail("arch", f"one of {', '.join(arch_policy.PREFERENCE)} or None", repr(arch))
        return (arch,)
    arches = _device_arches.get(device)
    if arches is None:
        capability = torch.cuda.get_device_capability(device)
        arches = arch_policy.arches_for(capability)
        if not arches:
            raise fail(tensor, "a tensor on a GPU of compute capability 8.0 or newer",
                       f"a device of compute capability {capability}")
        _device_arches[device] = arches
    return arches


def check_device(device: int, kernel: Kernel, fail: ArgumentErrors, tensor: str = "a") -> None:
    """Refuse a kernel whose arch cannot run on `device` (checked once per device and arch)."""
    arch = kernel.library.arch
    if (device, arch) in _checked_devices:
        return
    capability = torch.cuda.get_device_capability(device)
    policy = arch_policy.get(arch)
    if not policy.runs_on(capability):
        raise fail(tensor, f"a tensor on {policy.gpus} for kernel {kernel.name} (library "
                           f"{kernel.library.name}, {arch})", f"a device of compute capability {capability}")
    _checked_devices.add((device, arch))


def choice(op: str, device: int, arches: tuple[str, ...], key: tuple,
           values: tuple[int, ...]) -> tuple[Kernel, RuntimeKnobs, Optional[bool]]:
    """Dispatch's kernel and knobs for a problem, memoized per (device, arches, class, values),
    and how long the answer holds: True (settled: until the caches are cleared), False (until
    tuning at first use is on: then it is chosen again, and so timed, as its problem was never
    timed on this GPU), None (provisional, made under CUDA graph capture: not kept)."""
    memo = (arches, device, key, values)
    chosen = _choices.get(memo)
    if chosen is None or (not chosen[2] and autotune_enabled()):
        if len(_choices) >= _MAX_CHOICES:
            _choices.clear()
        choice = dispatch.choose_class(key, values, arch=arches, device=device)
        chosen = (choice.kernel, choice.knobs, choice.settled)
        if choice.provisional:
            return choice.kernel, choice.knobs, None
        _choices[memo] = chosen
    return chosen


def plan_memo() -> dict:
    """A family's memo of what its eager call derives per problem from `choice`: a plan, a tuple
    (kernel, <the family's launch constants>..., workspace bytes, lasting), the workspace bytes
    None until the plan's first call asks the kernel (`launch_plan`: the size depends on the
    problem and knobs, never on the pointers), lasting `choice`'s flag. Emptied whenever the
    choices are (`forget_choices`, `clear_caches`)."""
    memo: dict = {}
    _plan_memos.append(memo)
    return memo


def memoized_plan(memo: dict, key: Optional[tuple]) -> Optional[tuple]:
    """The plan kept for `key`; None when there is none, when `key` is None (a call that is not
    memoized: the tuner's own knobs), when `key` is unhashable (an argument of the wrong kind,
    which the family's own path then refuses by name), or when the plan came from a choice that
    tuning at first use, now on, would time."""
    if key is None:
        return None
    try:
        plan = memo.get(key)
    except TypeError:
        return None
    if plan is not None and plan[-1] is False and autotune_enabled():
        return None
    return plan


def store_plan(memo: dict, key: tuple, plan: tuple) -> None:
    """Keep `plan` (whose last item is its choice's lasting flag) unless it is provisional."""
    if plan[-1] is None:
        return
    if len(memo) >= _MAX_CHOICES:
        memo.clear()
    memo[key] = plan


def launch_plan(memo: dict, key: Optional[tuple], plan: tuple, buffer: ctypes.Array, device: int) -> None:
    """Run the plan's kernel with the packed `buffer` on `device`'s current stream; raises
    KernelLaunchError if it fails. A plan's first call asks the kernel for its workspace size and
    keeps the completed plan under `key` (not when `key` is None)."""
    kernel, workspace_bytes = plan[0], plan[-2]
    if workspace_bytes is None:
        workspace_bytes = kernel.workspace_size(buffer)
        if key is not None:
            store_plan(memo, key, plan[:-2] + (workspace_bytes, plan[-1]))
    raise_on_status(launch(kernel, buffer, device, workspace_bytes), kernel)


# Programmatic dependent launch for the kernels that support it (sm90 W8A8, the MoE direct
# kernels, the mixed-input direct and wgmma kernels): each launch may start its prologue while
# the stream's previous kernel finishes; the kernel waits on the GPU before its first read of
# anything a kernel may have written (the mixed-input kernels queue their constant packed
# weights' first copies before the wait) and before its first write (so results do not change).
# GEMMGEN_PDL=0 turns it off (read at import); `set_programmatic_dependent_launch` at run time.
_pdl = os.environ.get("GEMMGEN_PDL", "1").strip().lower() not in ("0", "false", "no", "off")
LAUNCH_PDL = 1  # GEMMGEN_LAUNCH_PDL of gemmgen/c_api.h, in a family struct's `launch_flags`


def programmatic_dependent_launch() -> bool:
    return _pdl


def launch_flags() -> int:
    """The `launch_flags` field of a family's argument struct for this call."""
    return LAUNCH_PDL if _pdl else 0


def set_programmatic_dependent_launch(enabled: bool) -> None:
    global _pdl
    _pdl = bool(enabled)


def forget_choices() -> None:
    """Forget memoized choices (a new record of tuning at first use changes them)."""
    _choices.clear()
    for memo in _plan_memos:
        memo.clear()


def forced_kernel(name: str, arch: Optional[str], fail: ArgumentErrors) -> Kernel:
    """A kernel forced by name (`kernel=`), checked to exist and to match `arch`."""
    chosen = all_kernels().get(name) if isinstance(name, str) else None
    if chosen is None:
        raise fail("kernel", "the name of a built kernel (see gemmgen.list_kernels())", repr(name))
    if arch is not None and chosen.spec.arch != arch:
        raise fail("kernel", f"a kernel of arch {arch} (the arch argument)", f"{name} ({chosen.spec.arch})")
    return chosen


def clear_caches() -> None:
    """Forget memoized kernel choices and device checks (gemmgen.reload() calls this)."""
    forget_choices()
    _device_arches.clear()
    _checked_devices.clear()


class _ThreadState(threading.local):
    """Per thread: the families' argument buffers by struct type (made on first use)."""

    def __init__(self):
        self.buffers: dict[type, ctypes.Array] = {}


_thread_state = _ThreadState()


def args_buffer(mirror: type[ctypes.Structure]) -> ctypes.Array:
    """This thread's buffer for one family's argument struct (the C side copies it at the call)."""
    buffers = _thread_state.buffers
    buffer = buffers.get(mirror)
    if buffer is None:
        buffer = buffers[mirror] = ctypes.create_string_buffer(ctypes.sizeof(mirror))
    return buffer


_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _launch_here(kernel: Kernel, buffer: ctypes.Array, device: int,
                 workspace_bytes: Optional[int]) -> int:
    size = kernel.workspace_size(buffer) if workspace_bytes is None else workspace_bytes
    # Workspace (stream-K partials, tile counters) comes from torch's caching allocator, which
    # also makes it graph-safe under CUDA graph capture.
    workspace = new_output((size,), torch.uint8, device) if size else None
    if _current_raw_stream is not None:
        stream = _current_raw_stream(device)
    else:
        stream = torch.cuda.current_stream(device).cuda_stream
    return kernel.run(buffer, 0 if workspace is None else workspace.data_ptr(), size, stream)


def new_output(sizes: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    """`torch.empty(sizes, dtype=dtype, device=device)` for a 1-D or a row-major 2-D tensor, made
    through `torch.empty_strided`: ~1 µs cheaper a call on a GPU host, as torch.empty's Python
    binding weighs more signatures (session 28, H200 host: 2.2-2.3 against 3.2-3.5 µs)."""
    return torch.empty_strided(sizes, (1,) if len(sizes) == 1 else (sizes[1], 1), dtype=dtype,
                               device=device)


def launch(kernel: Kernel, buffer: ctypes.Array, device: int, workspace_bytes: Optional[int] = None) -> int:
    """Run `kernel` on `device`'s current stream; returns the C status (0: launched).
    `workspace_bytes`: the kernel's workspace size for these arguments when the caller has it
    memoized (it depends on the problem and knobs, never on the pointers); None asks the kernel."""
    if device == _current_device():
        return _launch_here(kernel, buffer, device, workspace_bytes)
    with torch.cuda.device(device):
        return _launch_here(kernel, buffer, device, workspace_bytes)


def refuse_unaligned(fail: ArgumentErrors, names: tuple[str, ...], pointers: tuple[int, ...]) -> None:
    """Refuse the first data pointer that is not 16-byte aligned, naming its argument. (The ops
    call this only once one OR of all their pointers has shown a misaligned one.)"""
    for name, address in zip(names, pointers):
        if address % ALIGN_BYTES:
            raise fail(name, "a 16-byte aligned data pointer", f"address {address:#x}")


def raise_on_status(status: int, kernel: Kernel) -> None:
    if status != 0:
        raise KernelLaunchError(f"gemmgen kernel failed (status {status}): {kernel.library.last_error()}")


def mark_written(*tensors: torch.Tensor) -> None:
    """Bump the version counters of tensors a kernel wrote through raw pointers, as an in-place
    torch op does: autograd then refuses a saved tensor that was overwritten instead of using
    the new values silently. (The ops are Library ops, not custom_op, which did this in its
    ADInplaceOrView kernel; eager calls skip the dispatcher.)"""
    _increment_version(tensors)


def _version_bumper():
    """torch's own call behind torch.autograd.graph.increment_version, where it takes a tuple of
    tensors (as in the torch versions whose public function takes a list): this runs on every
    call of every op, and the public function adds a Python wrapper. Else the public function, a
    tensor at a time."""
    own = getattr(torch._C, "_increment_version", None)
    try:
        own((torch.empty(0),))
        return own
    except TypeError:
        public = torch.autograd.graph.increment_version
        return lambda tensors: [public(t) for t in tensors]


_increment_version = _version_bumper()


def refuse_wrong_kinds(fail: ArgumentErrors, required=(), optional=(), kernel=None) -> None:
    """Before a call goes through the custom op: a non-tensor where the op's schema takes a
    tensor, or a `kernel` that is not a name, gets the op's ValueError naming the argument
    (torch's schema check would raise a RuntimeError first). `required` / `optional`: (name,
    value) pairs."""
    for name, value in required:
        if not isinstance(value, torch.Tensor):
            raise fail(name, "a torch.Tensor", describe(value))
    for name, value in optional:
        if value is not None and not isinstance(value, torch.Tensor):
            raise fail(name, "None or a torch.Tensor", describe(value))
    if kernel is not None and not isinstance(kernel, str):
        raise fail("kernel", "None or a kernel name (a str)", repr(kernel))


def through_custom_op(first: torch.Tensor) -> bool:
    """Whether a call must go through the registered custom op rather than straight to the C call.

    NOTES: eager calls skip the custom-op dispatcher (~30 µs of Python per call measured on an
    H200 host: the whole budget of a small-M GEMM). Under torch.compile, a dispatch mode
    (make_fx, FakeTensorMode) or a tensor subclass, the call goes through the custom op."""
    return (torch.compiler.is_compiling() or bool(torch._C._len_torch_dispatch_stack())
            or type(first) is not torch.Tensor)
