"""Host (CPU) time per call of gemmgen's op and of its parts, beside torch's own ops.

    python benchmarks/host_overhead.py        # needs an sm90 GPU and a built default library
    python benchmarks/host_overhead.py --kernel NAME   # any built int8 bf16 bias kernel, by name
    python benchmarks/host_overhead.py --mixed-kernel NAME  # also gemmgen.mixed_mm (int4, group
                                                             # 128, bf16, M=1) with that kernel
    python benchmarks/host_overhead.py --tensor-map         # also one cuTensorMapEncodeTiled call
    python benchmarks/host_overhead.py --moe-kernel NAME[,NAME...]  # also grouped_matmul_swiglu_quant
                                                             # (8 experts, one token each; the kernel's
                                                             # x, w and scales: int8, or A8W4 per
                                                             # channel / per group 128)

Each row is the wall time of back-to-back calls (no sync inside the loop) divided by their
count: the rows take turns, 7 rounds of 500 calls each (after 50 warm-up calls), and a row shows
its median round, so a host that slows down or speeds up mid-run moves every row alike. The
problem (M=16, N=K=4096) is small, so host time, not GPU time, is what is measured.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

import gemmgen
from gemmgen import dispatch
from gemmgen.bindings import launch
from gemmgen.bindings.library import all_kernels
from gemmgen.families.w8a8 import ops
from gemmgen.families.w8a8.abi import ScaledMmArgs

M, N, K = 16, 4096, 4096


def per_call_us(fn, calls: int = 500) -> float:
    """Wall time a call of `calls` back-to-back calls of `fn`, after a sync."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def interleaved_medians(rows: dict, rounds: int = 7) -> dict:
    """Each row's median per-call time over `rounds` rounds in which every row takes its turn."""
    for fn in rows.values():
        for _ in range(50):
            fn()
    samples = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            samples[name].append(per_call_us(fn))
    return {name: statistics.median(times) for name, times in samples.items()}


def operands(dev: str = "cuda") -> SimpleNamespace:
    """The problem's operands on the GPU: int8 `a` [M, K] and `b` [K, N] (column-major), float32
    `scale_a` [M, 1] and `scale_b` [1, N], bf16 `bias` [N] and `out` [M, N]; fp8 `a8`, `b8`; and
    `a32`, int8 [32, K] (torch._int_mm needs M > 16)."""
    return SimpleNamespace(
        a=torch.randint(-128, 128, (M, K), device=dev, dtype=torch.int8),
        b=torch.randint(-128, 128, (N, K), device=dev, dtype=torch.int8).t(),
        scale_a=torch.rand(M, 1, device=dev),
        scale_b=torch.rand(1, N, device=dev),
        bias=torch.randn(N, device=dev, dtype=torch.bfloat16),
        out=torch.empty(M, N, device=dev, dtype=torch.bfloat16),
        a8=torch.randn(M, K, device=dev).to(torch.float8_e4m3fn),
        b8=torch.randn(N, K, device=dev).to(torch.float8_e4m3fn).t(),
        a32=torch.randint(-128, 128, (32, K), device=dev, dtype=torch.int8),
    )


def mixed_rows(kernel) -> dict:
    """gemmgen.mixed_mm at one token (int4 group 128, bf16, N=K=4096), eager and on the dispatcher."""
    q = torch.randint(-8, 8, (N, K), dtype=torch.int8, device="cuda")
    scales = torch.rand(N, K // 128, device="cuda").to(torch.bfloat16)
    packed = gemmgen.pack_weights(q, scales, weight_type="int4", group_size=128)
    x = torch.randn(1, K, device="cuda").to(torch.bfloat16)
    y = torch.empty(1, N, device="cuda", dtype=torch.bfloat16)
    gemmgen.mixed_mm(x, packed, out=y, kernel=kernel)
    args = (y, x, packed.qweight, packed.scales, packed.zeros, None, packed.weight_type,
            packed.group_size, packed.n, packed.k, kernel, packed.k_perm)
    return {"gemmgen.mixed_mm (int4 g128, M=1), eager (out= given)":
                lambda: gemmgen.mixed_mm(x, packed, out=y, kernel=kernel),
            "torch.ops.gemmgen.mixed_mm_out (the op on the dispatcher)":
                lambda: torch.ops.gemmgen.mixed_mm_out(*args)}


def moe_rows(kernel) -> dict:
    """gemmgen.grouped_matmul_swiglu_quant, 8 experts of K=2048, N=2x768, one row each (a decode
    step's top-8 of one token), check=False (the sync-free call), eager. The weights are those of
    the forced kernel's class: int8, or int4 (A8W4) with per-channel or group-128 scales (None:
    int8 and dispatch's choice). A TMA kernel of the wgmma schedule encodes its tensor maps in the
    call: its row beside a cp.async twin's is that cost."""
    e, k, n = 8, 2048, 1536
    spec = None if kernel is None else all_kernels()[kernel].spec
    int4 = spec is not None and spec.w == "int4"
    per_group = int4 and spec.scales == "group"
    if int4:
        w = torch.randint(-8, 8, (e, k, n), dtype=torch.int8, device="cuda")
        scale = torch.rand((e, k // 128, n) if per_group else (e, n), device="cuda")
        packed = gemmgen.pack_moe_weights(w, scale, weight_bits=4)
    else:
        packed = gemmgen.pack_moe_weights(torch.randint(-128, 128, (e, k, n), dtype=torch.int8, device="cuda"),
                                          torch.rand(e, n, device="cuda"))
    x = torch.randint(-128, 128, (e, k), dtype=torch.int8, device="cuda")
    x_scale = torch.rand(e, device="cuda")
    group_list = torch.ones(e, dtype=torch.int64, device="cuda")
    what = "int8" if not int4 else "A8W4 group 128" if per_group else "A8W4 per channel"
    return {f"gemmgen.grouped_matmul_swiglu_quant ({what}, 8 rows), eager, check=False"
            + (f" [{kernel.split('quant_')[-1]}]" if kernel else ""):
                lambda: gemmgen.grouped_matmul_swiglu_quant(x, packed, None, x_scale, group_list,
                                                            check=False, kernel=kernel)}


def tensor_map_row() -> dict:
    """One `cuTensorMapEncodeTiled` call (a 2-D uint8 map of x's kind: 128-byte rows, 128-byte
    swizzle), through ctypes from the driver library: what a TMA kernel of the MoE family's wgmma
    schedule spends on each of its maps a call (two per channel, three per group; its C++ calls
    the driver directly, without ctypes' own cost)."""
    import ctypes
    driver = ctypes.CDLL("libcuda.so.1")
    encode = driver.cuTensorMapEncodeTiled
    base = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    tensor_map = (ctypes.c_uint64 * 16)()  # CUtensorMap: 128 bytes, 64-byte aligned
    dims, strides = (ctypes.c_uint64 * 2)(2048, 512), (ctypes.c_uint64 * 1)(2048)
    box, unit = (ctypes.c_uint32 * 2)(128, 64), (ctypes.c_uint32 * 2)(1, 1)
    args = (ctypes.byref(tensor_map), 0, 2, ctypes.c_void_p(base.data_ptr()), dims, strides, box,
            unit, 0, 3, 3, 0)  # UINT8, rank 2, no interleave, 128B swizzle, L2 256B, no NaN fill
    if encode(*args) != 0:
        raise RuntimeError("cuTensorMapEncodeTiled failed")
    return {"  cuTensorMapEncodeTiled (one map, through ctypes)": lambda: encode(*args)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", help="force this built kernel (int8 -> bf16, ScaledEpilogueBias) "
                        "instead of the one dispatch picks")
    parser.add_argument("--mixed-kernel", help="also time gemmgen.mixed_mm (int4 group 128, bf16, M=1, "
                        "N=K=4096) forced to this built kernel ('dispatch': dispatch's choice)")
    parser.add_argument("--moe-kernel", help="also time gemmgen.grouped_matmul_swiglu_quant (8 experts, one "
                        "row each) forced to each of these built kernels, comma-separated ('dispatch': "
                        "int8, dispatch's choice)")
    parser.add_argument("--tensor-map", action="store_true",
                        help="also time one cuTensorMapEncodeTiled call (a TMA map's host cost)")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave out the torch.compile row (its compile takes tens of seconds)")
    options = parser.parse_args()
    forced = options.kernel
    o = operands()
    a, b, scale_a, scale_b, bias, out = o.a, o.b, o.scale_a, o.scale_b, o.bias, o.out
    a32, a8, b8 = o.a32, o.a8, o.b8
    if forced:
        kernel = all_kernels()[forced]
    else:
        kernel = dispatch.lookup("scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16,
                                 epilogue="ScaledEpilogueBias", m=M, n=N, k=K)
    gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out, kernel=forced)  # fills the args buffer
    buffer = launch.args_buffer(ScaledMmArgs)
    stream = torch.cuda.current_stream().cuda_stream
    rows = {
        "gemmgen.scaled_mm, eager (out= given)":
            lambda: gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, out=out, kernel=forced),
        "gemmgen.scaled_mm, eager (allocates out)":
            lambda: gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias, kernel=forced),
        "torch.ops.gemmgen.scaled_mm_out (the op on the dispatcher)":
            lambda: torch.ops.gemmgen.scaled_mm_out(out, a, b, scale_a, scale_b, bias, None, None, forced),
        "  argument checks (check_arguments: every refusal explained)":
            lambda: ops.check_arguments(out, a, b, scale_a, scale_b, bias, None, None),
        "  dispatch.choose (memoized)": lambda: dispatch.choose(
            "scaled_mm", a_dtype=torch.int8, out_dtype=torch.bfloat16, epilogue="ScaledEpilogueBias",
            m=M, n=N, k=K),
        "  C++ workspace_size": lambda: kernel.workspace_size(buffer),
        "  C++ run (can_implement, TMA descriptors, launch)": lambda: kernel.run(buffer, 0, 0, stream),
        "torch._scaled_mm (fp8, row-wise, bias)": lambda: torch._scaled_mm(
            a8, b8, scale_a=scale_a, scale_b=scale_b, bias=bias, out_dtype=torch.bfloat16),
        "torch._int_mm (M=32)": lambda: torch._int_mm(a32, b),
    }
    if hasattr(ops, "_common_problem"):  # since session 28: the eager call's quick acceptance
        rows["  argument checks, quick path (the eager call's)"] = (
            lambda: ops._common_problem(out, a, b, scale_a, scale_b, bias))
    if not options.no_compile:
        compiled = torch.compile(lambda x: gemmgen.scaled_mm(x, b, scale_a, scale_b, torch.bfloat16, bias,
                                                             kernel=forced), fullgraph=True)
        rows["torch.compile(fullgraph=True) of gemmgen.scaled_mm, no CUDA graphs"] = lambda: compiled(a)
    if options.mixed_kernel:
        rows.update(mixed_rows(None if options.mixed_kernel == "dispatch" else options.mixed_kernel))
    if options.tensor_map:
        rows.update(tensor_map_row())
    for name in options.moe_kernel.split(",") if options.moe_kernel else ():
        rows.update(moe_rows(None if name == "dispatch" else name))
    print(f"host time per call on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    for name, us in interleaved_medians(rows).items():
        print(f"{name:55s} {us:8.2f} µs")


if __name__ == "__main__":
    main()
