#!/usr/bin/env python3
"""A measurement prototype, not a benchmark of record: where the host time of a
`torch.compile`d call (no CUDA graphs) goes, split into torch.compile's own per-call runtime
(guards, the AOT runtime wrapper, the generated wrapper) and what the op adds. Each function is
timed eager and compiled (`fullgraph=True`), back to back, medians of 5 batches of calls, two
rounds; the generated wrapper of the op's function is printed last.

Without a GPU (`--device cpu`, this project's CPU machine) the op is a stand-in: an op of
`gemmgen::scaled_mm_out`'s schema under another namespace with a no-op Python CPU kernel, so
the figures are the dispatcher's and torch.compile's, not gemmgen's argument checks or launch.
On a GPU host with the W8A8 sm90 library built (`--device cuda`), the op is `gemmgen.scaled_mm`
itself (int8 -> bf16 with bias, M=16, N=K=4096), beside `torch._scaled_mm`.

    python benchmarks/prototypes/compile_overhead.py [--device cpu|cuda]

Results: benchmarks/RESULTS.md, "Host cost of a compiled call" (session 23).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

M, N, K = 16, 4096, 4096
SCHEMA = ("(Tensor(a!) out, Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias, "
          "Tensor? azp_adj, Tensor? azp, str? kernel, str? arch=None, SymInt? split_k=None) -> ()")


def per_call_us(fn, args, calls: int = 20000) -> float:
    for _ in range(500):
        fn(*args)
    batch = calls // 5
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(batch):
            fn(*args)
        times.append((time.perf_counter() - start) / batch * 1e6)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return statistics.median(times)


def cpu_cases():
    """The stand-in op (no-op Python kernel, gemmgen's schema) and an allocation alone."""
    lib = torch.library.Library("gemmgen_probe", "DEF")
    lib.define("scaled_mm_out" + SCHEMA)
    lib.impl("scaled_mm_out", lambda *args, **kwargs: None, "CPU")
    torch.library.register_fake("gemmgen_probe::scaled_mm_out", lambda *args, **kwargs: None, lib=lib)
    op = torch.ops.gemmgen_probe.scaled_mm_out

    def op_call(a, b, scale_a, scale_b, bias):
        out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)
        op(out, a, b, scale_a, scale_b, bias, None, None, None)
        return out

    def empty_alone(a, b, scale_a, scale_b, bias):
        return torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)

    a = torch.randint(-128, 128, (M, K), dtype=torch.int8)
    b = torch.randint(-128, 128, (N, K), dtype=torch.int8).t()
    args = (a, b, torch.rand(M), torch.rand(N), torch.randn(N, dtype=torch.bfloat16))
    return {"stand-in op (gemmgen's schema, no-op)": op_call, "torch.empty alone": empty_alone}, args, lib


def cuda_cases():
    import gemmgen

    def gemmgen_call(a, b, scale_a, scale_b, bias):
        return gemmgen.scaled_mm(a, b, scale_a, scale_b, torch.bfloat16, bias)

    def torch_call(a8, b8, scale_a, scale_b, bias):
        return torch._scaled_mm(a8, b8, scale_a.view(-1, 1), scale_b.view(1, -1), bias=bias,
                                out_dtype=torch.bfloat16, use_fast_accum=True)

    def empty_alone(a, b, scale_a, scale_b, bias):
        return torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)

    a = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
    b = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda").t()
    args = (a, b, torch.rand(M, device="cuda"), torch.rand(N, device="cuda"),
            torch.randn(N, dtype=torch.bfloat16, device="cuda"))
    a8 = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    b8 = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn).t()
    cases = {"gemmgen.scaled_mm": (gemmgen_call, args), "torch.empty alone": (empty_alone, args),
             "torch._scaled_mm (fp8)": (torch_call, (a8, b8) + args[2:])}
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    device = parser.parse_args().device
    if device == "cpu":
        functions, args, _keep_alive = cpu_cases()
        cases = {name: (fn, args) for name, fn in functions.items()}
    else:
        cases = cuda_cases()
    print(f"torch {torch.__version__}, {device}; µs per call (median of 5 batches), two rounds")
    compiled = {name: torch.compile(fn, fullgraph=True) for name, (fn, _) in cases.items()}
    for round_ in (1, 2):
        for name, (fn, fn_args) in cases.items():
            eager, comp = per_call_us(fn, fn_args), per_call_us(compiled[name], fn_args)
            print(f"round {round_}  {name:40s} eager {eager:7.2f}   compiled {comp:7.2f}   "
                  f"compiled - eager {comp - eager:6.2f}")


if __name__ == "__main__":
    main()
