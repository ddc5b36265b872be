"""The W8A8 eager call's host work per problem, without a GPU: dispatch chooses and the kernel
says its workspace size once per problem; later calls of the problem reuse that plan, another
problem (or cleared caches) makes a new one, and every call still launches with the arguments of
that call. CUDA facts are faked (CPU tensors that say they are on cuda:0, a stand-in kernel that
records its launches): what is tested is the memo's bookkeeping, not a kernel."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import gemmgen  # noqa: E402
from gemmgen import dispatch  # noqa: E402
from gemmgen.bindings import launch  # noqa: E402
from gemmgen.families.w8a8 import ops  # noqa: E402
from gemmgen.generator.kernel_config import RuntimeKnobs  # noqa: E402


class StandInKernel:
    """What the eager call uses of a Kernel: its workspace size and run, recorded."""

    name = "stand_in"

    class spec:
        split_k = False

    class library:
        arch = "sm90a"
        name = "stand_in"

    def __init__(self, workspace: int):
        self.workspace, self.asked, self.runs = workspace, 0, []

    def workspace_size(self, buffer) -> int:
        self.asked += 1
        return self.workspace

    def run(self, buffer, workspace_ptr, workspace_bytes, stream) -> int:
        self.runs.append((ops._ARGS_LAYOUT.unpack_from(buffer), workspace_bytes))
        return 0


@pytest.fixture
def faked_gpu(monkeypatch):
    """CPU tensors that report cuda:0, and a dispatch that counts its decisions."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(launch, "arches_for", lambda device, arch, fail, tensor="a": ("sm90a",))
    monkeypatch.setattr(launch, "check_device", lambda *args, **kwargs: None)
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_raw_stream", lambda device: 0)
    monkeypatch.setattr(launch, "new_output", lambda sizes, dtype, device: torch.empty(sizes, dtype=dtype))
    kernel = StandInKernel(workspace=64)
    decisions = []

    def choose_class(key, values, arch=None, device=None):
        decisions.append(values)
        return dispatch.Choice(kernel, RuntimeKnobs(raster="along_n", swizzle=2), "rule", "stand-in",
                               settled=True)

    monkeypatch.setattr(dispatch, "choose_class", choose_class)
    launch.clear_caches()
    yield kernel, decisions
    launch.clear_caches()


def _problem(m, n=64, k=128):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8).t()
    return a, b, torch.rand(m, 1), torch.rand(1, n), torch.randn(n).to(torch.bfloat16)


def test_one_decision_and_one_workspace_question_per_problem(faked_gpu):
    kernel, decisions = faked_gpu
    a, b, scale_a, scale_b, bias = _problem(16)
    outs = [gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias) for _ in range(3)]
    assert decisions == [(16, 64, 128)] and kernel.asked == 1 and len(kernel.runs) == 3
    for out, (fields, workspace_bytes) in zip(outs, kernel.runs):
        # every launch carries its own call's pointers and the plan's knob codes and workspace
        assert fields[:3] == (a.data_ptr(), b.data_ptr(), out.data_ptr())
        assert fields[3:6] == (16, 64, 128) and fields[-4:-1] == (2, 2, 1) and workspace_bytes == 64
    a2, b2, scale_a2, scale_b2, bias2 = _problem(24)  # another problem: a plan of its own
    gemmgen.scaled_mm(a2, b2, scale_a2, scale_b2, torch.bfloat16, bias2)
    gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias)
    assert decisions == [(16, 64, 128), (24, 64, 128)] and kernel.asked == 2
    launch.forget_choices()  # a new record of tuning at first use, say: everything is decided again
    gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias)
    assert decisions[-1] == (16, 64, 128) and len(decisions) == 3 and kernel.asked == 3


def test_the_tuners_knobs_are_never_memoized(faked_gpu):
    kernel, decisions = faked_gpu
    a, b, scale_a, scale_b, bias = _problem(8)
    out = torch.empty(8, 64, dtype=torch.bfloat16)
    for swizzle in (1, 4):
        ops._scaled_mm_out_impl(out, a, b, scale_a, scale_b, bias, None, None, None,
                                knobs=RuntimeKnobs(raster="along_m", swizzle=swizzle))
    assert [fields[-4:-2] for fields, _ in kernel.runs] == [(1, 1), (1, 4)]
    assert kernel.asked == 2 and launch.memoized_plan(ops._plans, None) is None and not ops._plans
    gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out)  # then dispatch's own
    assert kernel.runs[-1][0][-4:-2] == (2, 2) and len(ops._plans) == 1


def test_the_args_layout_matches_the_fields_read_here():
    """The field positions this file reads (pointers first, sizes, then raster, swizzle, slices
    and the launch flags last) are those of the packed struct."""
    fields = [name for name, _ in ops.ScaledMmArgs._fields_]
    assert fields[:6] == ["a", "b", "d", "m", "n", "k"]
    assert fields[-4:] == ["raster_order", "max_swizzle_size", "split_k_slices", "launch_flags"]


def test_a_misaligned_pointer_is_refused_by_name(faked_gpu):
    kernel, _ = faked_gpu
    a, b, scale_a, scale_b, bias = _problem(16)
    shifted = torch.empty(16 * 128 + 1, dtype=torch.int8)[1:].view(16, 128)  # 1 byte off
    shifted.copy_(a)
    with pytest.raises(ValueError, match=r"^gemmgen\.scaled_mm: argument 'a': expected a 16-byte "
                                         r"aligned data pointer; got address 0x"):
        gemmgen.scaled_mm(shifted, b, scale_a, scale_b, torch.bfloat16, bias)
    assert kernel.runs == []
