#!/usr/bin/env python3
"""Benchmark gemmgen's W8A8 scaled GEMM against the cuBLAS-backed torch ops, side by side.

For every M in --m and every weight shape (N, K) of the --models it times, on the same data:
  gemmgen_int8  gemmgen.scaled_mm(int8 a, int8 b, scale_a [M,1] f32, scale_b [1,N] f32, bf16, bias=[N] bf16)
                (dispatch as shipped: the tuned table where one is published, else the manifest's rules)
  gemmgen_int8_heur, gemmgen_fp8_heur  the same op forced to the manifest rules' kernel (no table)
  int_mm        torch._int_mm(int8 a, int8 b) -> int32 (no scales, no bias; torch refuses M <= 16: n/a)
  gemmgen_fp8   gemmgen.scaled_mm with float8_e4m3fn inputs (same scales, bias, bf16 output)
  scaled_mm_rw  torch._scaled_mm(fp8 a, fp8 b, row-wise scales, bias, out_dtype=bf16)
  bf16_mm       torch.mm(bf16 a, bf16 b)
a is [M, K] row-major; b is [K, N] column-major (w.t() of a row-major [N, K] weight).
It reports TFLOP/s = 2*M*N*K / median time (TOP/s for int8), the ratios gemmgen_int8/int_mm and
gemmgen_fp8/scaled_mm_rw, issue 14's floors on the run's points (PASS / FAIL, each with its worst
point: `floor_checks`), the host (CPU) overhead per call and the cost of a dispatch lookup.

Run (an sm90 GPU and a built library, `gemmgen build`, are needed):
    python benchmarks/bench_scaled_mm.py [--quick] [--m 1 128 4096] [--models llama3-8b] [--out-dir DIR]
Writes to --out-dir (default benchmarks/out/): bench_scaled_mm.csv (every measurement, per-call
samples included), bench_scaled_mm.png (TFLOP/s vs M) and results.md; --append-results also
appends that summary (device name, date, command) to benchmarks/RESULTS.md.

NOTES (timing method):
- Device time per call: one CUDA event between consecutive calls (repeats + 1 events), median of
  --repeats calls after --warmup calls. Before the timed calls the stream gets a spin kernel
  (torch.cuda._sleep) that outlasts the time the CPU needs to enqueue them (measured on the
  warm-up), so the GPU runs the calls back to back and the events measure GPU time, not Python or
  launch overhead; that is measured separately ("host overhead"). If the queue ran dry anyway the
  measurement is redone once with a longer spin, then flagged host_bound=1 in the CSV.
- --timing graph (what the issue's figures and an application serving from CUDA graphs see):
  the calls over every rotated set are captured in one CUDA graph
  (gemmgen.tuning.measure.graph_time_us) and replayed back to back behind a spin kernel; time
  per call = median replay batch / calls in the graph. No event separates two calls there, so a
  gemmgen kernel's programmatic dependent launch overlaps its prologue with the previous call's
  tail (as between a model's back-to-back GEMMs); the baselines run in the same kind of graph.
- --heat MS: before each measurement a heavy bf16 matmul load runs for MS ms, so every impl is
  timed with the GPU at its sustained (power-limited) clocks, as a long prefill or a tune sees
  it; without it, an impl timed after a light one starts at boost clocks. Large-M rankings move
  with that state (benchmarks/RESULTS.md, session 29).
- Inputs rotate: ceil(2 * L2 / bytes(a + b)) distinct (a, b) sets (at most --max-sets, and within
  --max-set-gib) are cycled so that each call reads operands that are not L2-resident; every impl
  reads the same sequence of sets (its own dtype's copy of them).
- Data is full-range random int8 and randn -> e4m3 / bf16; low-entropy data (zeros, constants)
  draws less power and runs faster. Scales are set so that outputs are O(1) and the bias matters.
- torch._scaled_mm runs with use_fast_accum=True (--fast-accum) like gemmgen's FP8FastAccum
  mainloop. Every impl allocates its output per call (caching allocator, no GPU work).
- --rounds R (default 3): every point's implementations are timed R times, in rounds, the order
  rotated round to round, and each keeps the median of its rounds (its samples: every round's).
  One pass in a fixed order put each impl at the clock state the one before it left (a short
  graph timing is ~1.5 ms of GPU time): one point's ratio to a baseline then moved up to 20%
  between runs (H200, session 61: gemmgen fp8 8192 x 8192 at 1024 rows 1157-1404 TFLOP/s over 12
  runs, the same kernel timed at 93.9 µs in one process by four methods within 2%).
- Clocks are not locked; expect a few % run-to-run noise.
"""

from __future__ import annotations

import argparse, csv, datetime, math, shlex, statistics, sys, time  # noqa: E401
from pathlib import Path

import torch

try:
    import gemmgen
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gemmgen
from gemmgen.errors import GemmgenError, NoKernelError
from gemmgen.tuning.shapes import load_many
from gemmgen.tuning.measure import graph_time_us

MODELS = {"llama3-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
          "llama2-70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)]}
DEFAULT_M = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
QUICK_M = [1, 16, 128, 1024, 4096]
IMPLS = ("gemmgen_int8", "gemmgen_int8_heur", "int_mm", "gemmgen_fp8", "gemmgen_fp8_heur", "scaled_mm_rw",
         "scaled_mm_rw_default", "bf16_mm", "gemmgen_int8_sm80")
LABELS = {"gemmgen_int8": "gemmgen i8", "int_mm": "_int_mm", "gemmgen_fp8": "gemmgen fp8",
          "gemmgen_int8_heur": "i8 rules only", "gemmgen_fp8_heur": "fp8 rules only",
          "gemmgen_int8_wr": "i8 x weight-read", "gemmgen_fp8_wr": "fp8 x weight-read",
          "scaled_mm_rw": "_scaled_mm rw", "bf16_mm": "bf16 mm",
          "scaled_mm_rw_default": "_scaled_mm rw (default)", "gemmgen_fp8_xd": "x (default)",
          "gemmgen_int8_sm80": "gemmgen i8 sm80"}
DTYPE = {"gemmgen_int8": "int8", "int_mm": "int8", "gemmgen_fp8": "fp8", "scaled_mm_rw": "fp8",
         "gemmgen_int8_heur": "int8", "gemmgen_fp8_heur": "fp8",
         "gemmgen_int8_sm80": "int8",
         "scaled_mm_rw_default": "fp8", "bf16_mm": "bf16"}
BASELINE = {"gemmgen_int8": "int_mm", "gemmgen_fp8": "scaled_mm_rw"}
TORCH_DTYPE = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
EPILOGUE = "ScaledEpilogueBias"
CHECK_TOL = 3e-2
SPIN_CYCLES_PER_US = 2000  # torch.cuda._sleep counts clock cycles; ~2 GHz, longer at lower clocks
scaled_mm = gemmgen.scaled_mm  # bound once, as user code does (module __getattr__ costs per access)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, nargs="+", help=f"M values (default {DEFAULT_M}; --quick: {QUICK_M})")
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help=f"weight shape sets: {', '.join(MODELS)}, or shape files of gemmgen/manifests/shapes/ "
                        "(e.g. qwen3_32b phi3_medium_14b)")
    p.add_argument("--quick", action="store_true", help="smaller grid and fewer repeats (M in QUICK_M, 30 repeats)")
    p.add_argument("--repeats", type=int, help="timed calls per measurement (default 100; --quick 30)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls before each measurement")
    p.add_argument("--rounds", type=int, default=3,
                   help="time each point's implementations this many times, order rotated; the median")
    p.add_argument("--heat", type=float, default=0.0, metavar="MS",
                   help="run a heavy bf16 matmul load for MS ms before each measurement (sustained clocks)")
    p.add_argument("--timing", choices=("events", "graph"), default="events",
                   help="per-call CUDA events between eager calls (default), or calls replayed in a CUDA graph")
    p.add_argument("--max-sets", type=int, default=64, help="most rotated input sets per problem")
    p.add_argument("--max-set-gib", type=float, default=8.0, help="memory cap of the rotated input sets")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help=f"check gemmgen against a float32 reference first (rel. error < {CHECK_TOL})")
    p.add_argument("--fast-accum", action=argparse.BooleanOptionalAction, default=True,
                   help="use_fast_accum for torch._scaled_mm (gemmgen fp8 uses FastAccum)")
    p.add_argument("--host-iters", type=int, help="back-to-back calls of the host-overhead test (default 2000)")
    p.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent / "out")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--append-results", nargs="?", type=Path, const=Path(__file__).resolve().parent / "RESULTS.md",
                   help="also append the markdown summary to this file (default: benchmarks/RESULTS.md)")
    args = p.parse_args(argv)
    args.m = sorted(set(args.m or (QUICK_M if args.quick else DEFAULT_M)))
    args.repeats = args.repeats or (30 if args.quick else 100)
    args.host_iters = args.host_iters or (500 if args.quick else 2000)
    if any(m < 1 for m in args.m) or args.repeats < 1 or args.warmup < 1 or args.rounds < 1:
        p.error("--m, --repeats, --warmup and --rounds must be positive")
    for name in args.models:  # a shape file's (N, K), each once, in the file's order
        if name not in MODELS:
            try:
                MODELS[name] = list(dict.fromkeys((s.n, s.k) for s in load_many([name])))
            except GemmgenError as exc:
                p.error(f"--models {name}: not one of {', '.join(MODELS)} nor a shape file ({exc})")
    return args


# ---------------------------------------------------------------- data
def copy_bandwidth(dev) -> float:
    """Bytes/s of a device-to-device copy of 2 GiB (read + write counted), median of 10."""
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del x, y
    return 2 * 2 * 2**30 / statistics.median(times[2:])


def l2_bytes() -> int:
    size = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
    return size if size > 0 else 50 * 2**20


def set_count(m: int, n: int, k: int, l2: int, args) -> int:
    """Rotated sets so that the 1-byte operands of all sets exceed 2x L2 (int8 + fp8 + bf16: 4 B/elem)."""
    per_set = (m + n) * k
    by_memory = int(args.max_set_gib * 2**30) // (4 * per_set)
    return max(1, min(math.ceil(2 * l2 / per_set), args.max_sets, by_memory))


def _scale(shape, k: int, dtype: str, dev) -> torch.Tensor:
    # int8 values have std ~74, randn ~1: scale each side by 1/(std * K^(1/4)) so outputs are O(1)
    std = 74.0 if dtype == "int8" else 1.0
    return torch.empty(shape, dtype=torch.float32, device=dev).uniform_(0.5, 1.5) / (std * k ** 0.25)


def make_weights(n: int, k: int, count: int, dev) -> list[dict]:
    return [{"int8": torch.randint(-128, 128, (n, k), dtype=torch.int8, device=dev).t(),
             "fp8": torch.randn(n, k, dtype=torch.bfloat16, device=dev).to(torch.float8_e4m3fn).t(),
             "bf16": torch.randn(n, k, dtype=torch.bfloat16, device=dev).t(),
             "sb_int8": _scale((1, n), k, "int8", dev), "sb_fp8": _scale((1, n), k, "fp8", dev),
             "bias": torch.randn(n, dtype=torch.bfloat16, device=dev)} for _ in range(count)]


def make_acts(m: int, k: int, count: int, dev) -> list[dict]:
    return [{"int8": torch.randint(-128, 128, (m, k), dtype=torch.int8, device=dev),
             "fp8": torch.randn(m, k, dtype=torch.bfloat16, device=dev).to(torch.float8_e4m3fn),
             "bf16": torch.randn(m, k, dtype=torch.bfloat16, device=dev),
             "sa_int8": _scale((m, 1), k, "int8", dev), "sa_fp8": _scale((m, 1), k, "fp8", dev)}
            for _ in range(count)]


def impl_fn(impl: str, fast_accum: bool, kernel: str | None = None):
    """f(act_set, weight_set) -> output, for one impl (`kernel`: a gemmgen kernel forced by name)."""
    if impl == "gemmgen_int8_sm80":  # the CUTLASS 2.x family (JIT from compute_80 PTX on Hopper)
        return lambda a, w: scaled_mm(a["int8"], w["int8"], a["sa_int8"], w["sb_int8"], torch.bfloat16,
                                      bias=w["bias"], arch="sm80")
    if impl.startswith("gemmgen_"):
        d = DTYPE[impl]
        return lambda a, w: scaled_mm(a[d], w[d], a["sa_" + d], w["sb_" + d], torch.bfloat16, bias=w["bias"],
                                      kernel=kernel)
    if impl == "int_mm":
        return lambda a, w: torch._int_mm(a["int8"], w["int8"])
    if impl == "scaled_mm_rw_default":  # torch's default call: use_fast_accum=False
        return lambda a, w: torch._scaled_mm(a["fp8"], w["fp8"], scale_a=a["sa_fp8"], scale_b=w["sb_fp8"],
                                             bias=w["bias"], out_dtype=torch.bfloat16)
    if impl == "scaled_mm_rw":
        return lambda a, w: torch._scaled_mm(a["fp8"], w["fp8"], scale_a=a["sa_fp8"], scale_b=w["sb_fp8"],
                                             bias=w["bias"], out_dtype=torch.bfloat16, use_fast_accum=fast_accum)
    return lambda a, w: torch.mm(a["bf16"], w["bf16"])


# ---------------------------------------------------------------- timing
_HEATER: list[torch.Tensor] = []


def heat(ms: float) -> None:
    """Keep the GPU under a heavy bf16 matmul load for about `ms` ms of GPU time (enqueued; the
    timed calls then queue behind it)."""
    if not _HEATER:
        _HEATER.extend(torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.mm(*_HEATER)
    end.record()
    end.synchronize()
    for _ in range(max(1, round(ms / max(start.elapsed_time(end), 0.05)))):
        torch.mm(*_HEATER)


def time_calls(fn, pairs: list, args) -> tuple[list[float], bool]:
    """Per-call GPU times (µs) of `repeats` calls cycling through `pairs`; and whether host-bound."""
    t0 = time.perf_counter()
    for i in range(args.warmup):
        fn(*pairs[i % len(pairs)])
    host_us = (time.perf_counter() - t0) * 1e6 / args.warmup
    torch.cuda.synchronize()
    for attempt in range(2):
        spin_us = min(200_000.0, (2 + 6 * attempt) * host_us * (args.repeats + 1) + 500)
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.repeats + 1)]
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(spin_us * SPIN_CYCLES_PER_US))
        events[0].record()
        for i in range(args.repeats):
            fn(*pairs[(args.warmup + i) % len(pairs)])
            events[i + 1].record()
        host_bound = events[0].query()  # the spin ended before the CPU had enqueued everything
        torch.cuda.synchronize()
        if not host_bound:
            break
    return [events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(args.repeats)], host_bound


def check(impl: str, a: dict, w: dict, fast_accum: bool, kernel: str | None = None) -> float:
    """Relative (Frobenius) error of one gemmgen call against a float32 reference on dequantized data."""
    d = DTYPE[impl]
    out = impl_fn(impl, fast_accum, kernel)(a, w).float()
    ref = (a[d].float() @ w[d].float()) * a["sa_" + d] * w["sb_" + d] + w["bias"].float()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def measure(impl: str, model: str, n: int, k: int, m: int, pairs: list, args, state: dict) -> dict:
    row = {"model": model, "n": n, "k": k, "m": m, "impl": impl, "dtype": DTYPE[impl], "kernel": "", "dispatch": "",
           "sets": len(pairs), "status": "ok", "median_us": None, "min_us": None, "mean_us": None,
           "tflops": None, "vs_baseline": None, "host_bound": 0, "check_rel_err": None, "samples_us": "", "rounds": 1}
    forced = None
    try:
        if impl.startswith("gemmgen_"):
            choice = gemmgen.dispatch.choose("scaled_mm", a_dtype=TORCH_DTYPE[DTYPE[impl]], m=m, n=n, k=k,
                                             out_dtype=torch.bfloat16, epilogue=EPILOGUE,
                                             tuned=not impl.endswith("_heur"),
                                             arch="sm80" if impl.endswith("_sm80") else None)
            row["kernel"] = choice.kernel.name
            row["dispatch"] = choice.source
            forced = row["kernel"] if impl.endswith("_heur") else None
            key = (DTYPE[impl], m, row["kernel"])
            if args.check and key not in state["checked"]:
                err = check(impl, *pairs[0], args.fast_accum, forced)
                state["checked"][key] = (err, model, n, k)
                if not err < CHECK_TOL:
                    print(f"\n!!! CHECK FAILED: {impl} {row['kernel']} M={m} N={n} K={k}: relative error "
                          f"{err:.3g} >= {CHECK_TOL}; its timings are not reported !!!\n", file=sys.stderr)
            if key in state["checked"]:
                row["check_rel_err"] = state["checked"][key][0]
                if not row["check_rel_err"] < CHECK_TOL:
                    row["status"] = "check_failed"
                    return row
        fn = impl_fn(impl, args.fast_accum, forced)
        if args.heat > 0:
            heat(args.heat)
        if args.timing == "graph":
            per_call, how = graph_time_us(lambda i: fn(*pairs[i]), len(pairs), max(3, args.repeats // 10))
            samples, host_bound = [per_call], how != "graph"  # a refused capture is timed eagerly: flagged
        else:
            samples, host_bound = time_calls(fn, pairs, args)
    except NoKernelError as exc:  # no built library serves this column (e.g. the sm80 one): said once
        row["status"] = "n/a: not built"
        if impl not in state["unbuilt"]:
            state["unbuilt"][impl] = str(exc).split(";")[0]
            print(f"\n{LABELS[impl]}: {state['unbuilt'][impl]}; its column is n/a\n", file=sys.stderr)
        return row
    except Exception as exc:  # baselines: e.g. torch._int_mm refuses M <= 16; gemmgen: a bug, said loudly
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        row["status"] = ("error: " if impl.startswith("gemmgen_") else "n/a: ") + message
        if impl.startswith("gemmgen_"):
            print(f"\n!!! {impl} M={m} N={n} K={k} raised {type(exc).__name__}: {exc} !!!\n", file=sys.stderr)
        return row
    row["host_bound"], row["median_us"] = int(host_bound), statistics.median(samples)
    row["min_us"], row["mean_us"] = min(samples), statistics.fmean(samples)
    row["tflops"] = 2.0 * m * n * k / (row["median_us"] * 1e-6) / 1e12
    row["samples_us"] = " ".join(f"{s:.2f}" for s in samples)
    return row


def rotated(impls, shift: int) -> list:
    """`impls` in round `shift`'s order: each round starts one implementation later."""
    shift %= len(impls)
    return list(impls[shift:]) + list(impls[:shift])


def merge_rounds(rounds: list[dict]) -> dict:
    """One implementation's rows of one point, a row a round, as one row: the median of the
    rounds' medians (TFLOP/s from it), every round's samples; a round that failed makes the row
    that round's failure."""
    failed = [r for r in rounds if r["status"] != "ok" or r["median_us"] is None]
    if failed:
        return failed[0]
    row = dict(rounds[0])
    row["median_us"] = statistics.median(r["median_us"] for r in rounds)
    row["min_us"] = min(r["min_us"] for r in rounds)
    row["mean_us"] = statistics.fmean(r["mean_us"] for r in rounds)
    row["host_bound"] = max(r["host_bound"] for r in rounds)
    row["tflops"] = 2.0 * row["m"] * row["n"] * row["k"] / (row["median_us"] * 1e-6) / 1e12
    row["samples_us"] = " ".join(r["samples_us"] for r in rounds)
    row["rounds"] = len(rounds)
    return row


def host_overhead(args, dev) -> list[tuple[str, float]]:
    """CPU µs per call: back-to-back calls, no sync inside the loop (M=32, N=K=1024), and lookups."""
    m, n, k = 32, 1024, 1024
    a, w = make_acts(m, k, 1, dev)[0], make_weights(n, k, 1, dev)[0]
    results = []

    def per_call(fn, iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / iters

    for impl in IMPLS:
        fn = impl_fn(impl, args.fast_accum)
        try:
            per_call(lambda: fn(a, w), 50)
            gpu_us = statistics.median(time_calls(fn, [(a, w)], args)[0])
            results.append((f"{LABELS[impl]} (GPU time {gpu_us:.1f} µs)", per_call(lambda: fn(a, w), args.host_iters)))
        except Exception as exc:
            results.append((f"{LABELS[impl]}: {type(exc).__name__}", None))
    query = dict(a_dtype=torch.int8, out_dtype=torch.bfloat16, epilogue=EPILOGUE, m=m, n=n, k=k)
    lookup, clear = gemmgen.dispatch.lookup, gemmgen.dispatch.cache_clear
    results.append(("dispatch.lookup, memoized", per_call(lambda: lookup("scaled_mm", **query), args.host_iters)))
    results.append(("dispatch.lookup, cache cleared each call",
                    per_call(lambda: (clear(), lookup("scaled_mm", **query)), args.host_iters)))
    return results


# ---------------------------------------------------------------- summary and outputs
def geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict], args) -> dict[str, list[tuple[int, dict]]]:
    """{group: [(M, {impl: geomean TFLOP/s, impl_x: geomean ratio})]} per model (and 'all')."""
    tf = {(r["model"], r["n"], r["k"], r["m"], r["impl"]): r["tflops"] for r in rows}
    us = {(r["model"], r["n"], r["k"], r["m"], r["impl"]): r["median_us"] for r in rows}
    for r in rows:  # per-shape ratios into the CSV rows
        base = tf.get((r["model"], r["n"], r["k"], r["m"], BASELINE.get(r["impl"])))
        r["vs_baseline"] = r["tflops"] / base if r["tflops"] and base else None
    groups = list(args.models) + (["all"] if len(args.models) > 1 else [])
    table = {}
    for g in groups:
        shapes = [(mdl, n, k) for mdl in (args.models if g == "all" else [g]) for n, k in MODELS[mdl]]
        table[g] = []
        for m in args.m:
            vals = {i: geomean(tf.get((*s, m, i)) for s in shapes) for i in IMPLS}
            for ours, base in BASELINE.items():
                pairs = [(tf.get((*s, m, ours)), tf.get((*s, m, base))) for s in shapes]
                vals[ours + "_x"] = geomean(o / b for o, b in pairs if o and b)
            pairs = [(tf.get((*s, m, "gemmgen_fp8")), tf.get((*s, m, "scaled_mm_rw_default"))) for s in shapes]
            vals["gemmgen_fp8_xd"] = geomean(o / b for o, b in pairs if o and b)
            for ours in ("gemmgen_int8", "gemmgen_fp8"):  # time / (weight bytes / copy bandwidth)
                vals[ours + "_wr"] = geomean(us.get((*s, m, ours)) / (s[1] * s[2] / args.bandwidth * 1e6)
                                             for s in shapes if us.get((*s, m, ours))) if m <= 16 else None
            table[g].append((m, vals))
    return table


def floor_checks(rows: list[dict], bandwidth: float, fast_accum: bool = True) -> list[str]:
    """Issue 14's floors on the points of this run, each PASS / FAIL with its value and where it
    is worst: fp8 >= 1.05x `_scaled_mm` (row-wise) geomean over every (shape, M) from M = 512 and
    >= 0.95x at each of them; int8 >= 1.8x `_int_mm` geomean from M = 1024; at M <= 16 each gemmgen
    column within 1.4x of the weight-read time (N*K bytes at the copy bandwidth) geomean. A floor
    whose points this run did not measure says so."""
    def where(r):
        return f"{r['model']} N={r['n']} K={r['k']} M={r['m']}"

    def points(impl, keep, value):
        return [(value(r), r) for r in rows if r["impl"] == impl and keep(r["m"]) and value(r)]

    out = []
    accum = "" if fast_accum else " (use_fast_accum=False: the issue's baseline is fast-accum)"
    checks = [  # (title, points, value test, the worst is the min or the max)
        (f"fp8 x {LABELS['scaled_mm_rw']}{accum} geomean at M >= 512 >= 1.05",
         points("gemmgen_fp8", lambda m: m >= 512, lambda r: r.get("vs_baseline")), lambda v: v >= 1.05, min, True),
        (f"fp8 x {LABELS['scaled_mm_rw']}{accum} at every shape from M = 512 >= 0.95",
         points("gemmgen_fp8", lambda m: m >= 512, lambda r: r.get("vs_baseline")), lambda v: v >= 0.95, min, False),
        (f"int8 x {LABELS['int_mm']} geomean at M >= 1024 >= 1.8",
         points("gemmgen_int8", lambda m: m >= 1024, lambda r: r.get("vs_baseline")), lambda v: v >= 1.8, min, True),
    ]
    for impl in ("gemmgen_int8", "gemmgen_fp8"):
        checks.append((f"{LABELS[impl]} time / weight-read time geomean at M <= 16 <= 1.4",
                       points(impl, lambda m: m <= 16, lambda r: r["median_us"] and r["median_us"] / (
                           r["n"] * r["k"] / bandwidth * 1e6)), lambda v: v <= 1.4, max, True))
    for title, values, ok, worst, by_geomean in checks:
        if not values:
            out.append(f"- {title}: not evaluated (no points in this run)")
            continue
        value = geomean(v for v, _ in values) if by_geomean else worst(v for v, _ in values)
        passed = "PASS" if ok(value) else "FAIL"
        v, r = worst(values, key=lambda t: t[0])
        shown = f"{value:.2f}x over {len(values)} points" if by_geomean else f"{len(values)} points"
        out.append(f"- {title}: {passed} ({shown}); worst single point {v:.2f}x ({where(r)})")
    return out


def markdown_table(lines: list[tuple[int, dict]]) -> str:
    cols = ["gemmgen_int8", "gemmgen_int8_heur", "int_mm", "gemmgen_int8_x", "gemmgen_int8_wr", "gemmgen_fp8",
            "gemmgen_fp8_heur", "scaled_mm_rw", "gemmgen_fp8_x", "scaled_mm_rw_default", "gemmgen_fp8_xd",
            "gemmgen_fp8_wr", "bf16_mm", "gemmgen_int8_sm80"]
    head = ["M"] + [LABELS.get(c, "x") for c in cols]
    out = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for m, vals in lines:
        cells = [str(m)] + ["n/a" if vals[c] is None else f"{vals[c]:.2f}x" if c.endswith(("_x", "_xd", "_wr")) else f"{vals[c]:.1f}"
                            for c in cols]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def dispatch_sources(rows: list[dict]) -> str:
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        if r["dispatch"]:
            counts[(r["impl"], r["dispatch"])] = counts.get((r["impl"], r["dispatch"]), 0) + 1
    return ", ".join(f"{impl}: {n} by {source}" for (impl, source), n in sorted(counts.items()))


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for r in rows:
            writer.writerow({key: f"{v:.6g}" if isinstance(v, float) else v for key, v in r.items()})


def plot(table: dict, args, device: str, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("warning: matplotlib is not installed; no plot written", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, len(args.models), figsize=(6.5 * len(args.models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], args.models):
        for impl in IMPLS:
            pts = [(m, vals[impl]) for m, vals in table[model] if vals[impl]]
            if pts:
                ax.plot(*zip(*pts), marker="o", ls="-" if impl.startswith("gemmgen") else "--", label=LABELS[impl])
        ax.set_xscale("log", base=2)
        ax.set_xticks(args.m, [str(m) for m in args.m])
        ax.set(xlabel="M (tokens)", ylabel="TFLOP/s (TOP/s int8), geomean over shapes", title=f"{model} on {device}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def timing_method(args) -> str:
    state = f"; before each measurement {args.heat:g} ms of bf16 matmul load (sustained clocks)" if args.heat > 0 else ""
    rounds = (f"; each point's implementations timed in {args.rounds} rounds, order rotated, the median of the "
              f"rounds") if args.rounds > 1 else ""
    if args.timing == "graph":
        return (f"per-call time = median of {max(3, args.repeats // 10)} replay batches of one CUDA graph holding "
                f"the calls over every rotated set, back to back (gemmgen's PDL overlaps consecutive calls)"
                f"{rounds}{state}")
    return f"median of {args.repeats} per-call CUDA-event times after {args.warmup} warm-up calls{rounds}{state}"


def write_markdown(table, host, rows, state, args, device: str, path: Path) -> str:
    failed = [f"{d} {name} at M={m} ({mdl} N={n} K={k}): rel. err {e:.3g}"
              for (d, m, name), (e, mdl, n, k) in state["checked"].items() if not e < CHECK_TOL]
    failed += [f"{r['impl']} M={r['m']} N={r['n']} K={r['k']}: {r['status']}" for r in rows if r["status"].startswith("error")]
    checked = (f"FAILED: {'; '.join(failed)}" if failed else f"{len(state['checked'])} (dtype, M, kernel) "
               f"checks passed (rel. err < {CHECK_TOL})") if args.check else "skipped (--no-check)"
    if state["unbuilt"]:
        checked += "; not built (columns n/a): " + "; ".join(
            f"{LABELS[impl]} ({why})" for impl, why in state["unbuilt"].items())
    text = [f"## gemmgen scaled_mm vs torch/cuBLAS on {device} ({datetime.date.today().isoformat()})", "",
            f"- torch {torch.__version__} (CUDA {torch.version.cuda}), gemmgen {gemmgen.__version__}, "
            f"L2 {l2_bytes() / 2**20:.0f} MiB", f"- command: `python {shlex.join(sys.argv)}`",
            f"- {timing_method(args)}, inputs "
            f"rotated over > 2x L2; TFLOP/s = 2MNK/t (TOP/s for int8), geomean over shapes; x = geomean of "
            f"per-shape ratios; gemmgen: bf16 out, per-token/per-channel scales and bias; _int_mm: int32 out, "
            f"no epilogue; _scaled_mm use_fast_accum={args.fast_accum}; 'rules only' = the manifest's "
            f"dispatch rules without the tuned table; 'x weight-read' (M <= 16) = time / (N*K bytes at the "
            f"measured copy bandwidth, {args.bandwidth / 1e12:.2f} TB/s)",
            f"- dispatch of the gemmgen columns: {dispatch_sources(rows)}", f"- correctness: {checked}", ""]
    for group, lines in table.items():
        shapes = ", ".join(f"{n}x{k}" for mdl in (args.models if group == "all" else [group]) for n, k in MODELS[mdl])
        text += [f"### {group} (N x K: {shapes})", "", markdown_table(lines), ""]
    text += ["Issue 14's floors on this run's points:", ""] + floor_checks(rows, args.bandwidth, args.fast_accum) + [""]
    text += ["### Host overhead per call (M=32, N=K=1024; back-to-back calls, sync at the end)", "",
             "| call | µs/call |", "|---|---:|"] + [f"| {name} | {'n/a' if us is None else f'{us:.2f}'} |" for name, us in host] + [""]
    path.write_text("\n".join(text))
    return "\n".join(text)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device visible; this benchmark needs an sm90 GPU", file=sys.stderr)
        return 2
    try:
        gemmgen.dispatch.kernels()
    except Exception as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 reference of --check
    dev, l2, device = torch.device("cuda", 0), l2_bytes(), torch.cuda.get_device_name(0)
    args.bandwidth = copy_bandwidth(dev)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{device}, torch {torch.__version__}, L2 {l2 / 2**20:.0f} MiB, M={args.m}, repeats={args.repeats}")
    rows, state, start = [], {"checked": {}, "unbuilt": {}}, time.perf_counter()
    for model in args.models:
        for n, k in MODELS[model]:
            counts = {m: set_count(m, n, k, l2, args) for m in args.m}
            weights = make_weights(n, k, max(counts.values()), dev)
            for m in args.m:
                pairs = list(zip(make_acts(m, k, counts[m], dev), weights[:counts[m]]))
                timed: dict[str, list[dict]] = {impl: [] for impl in IMPLS}
                for r in range(args.rounds):
                    for impl in rotated(IMPLS, r):
                        if r and timed[impl][0]["status"] != "ok":
                            continue  # n/a or failed: once is enough
                        timed[impl].append(measure(impl, model, n, k, m, pairs, args, state))
                new = [merge_rounds(timed[impl]) for impl in IMPLS]
                rows += new
                cells = "  ".join(f"{LABELS[r['impl']]} " + (f"{r['tflops']:7.1f}" if r["tflops"] else "    n/a")
                                  for r in new)
                print(f"{model} N={n:5d} K={k:5d} M={m:5d} sets={counts[m]:2d} | {cells}", flush=True)
                del pairs
            del weights
            torch.cuda.empty_cache()
    host = host_overhead(args, dev)
    table = summarize(rows, args)
    write_csv(rows, args.out_dir / "bench_scaled_mm.csv")
    plotted = not args.no_plot and plot(table, args, device, args.out_dir / "bench_scaled_mm.png")
    summary = write_markdown(table, host, rows, state, args, device, args.out_dir / "results.md")
    print("\n" + summary)
    if args.append_results:
        with args.append_results.open("a") as handle:
            handle.write("\n" + summary)
    print(f"wrote {args.out_dir}/bench_scaled_mm.csv{', bench_scaled_mm.png' if plotted else ''}, results.md "
          f"in {time.perf_counter() - start:.0f} s")
    if any(r["status"] == "check_failed" or r["status"].startswith("error") for r in rows):
        print("!!! SOME GEMMGEN KERNELS FAILED (check or launch); see above and results.md !!!", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
