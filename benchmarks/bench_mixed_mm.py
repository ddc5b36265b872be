#!/usr/bin/env python3
"""Benchmark gemmgen's mixed-input GEMM (weight-only int4 / int8) against torch, side by side.

For every M in --m and every weight shape (N, K) of the --models (default the Llama ones; also
qwen2.5-7b, or any dense model's shape file in gemmgen/manifests/shapes/, e.g. qwen3_32b), on the
same data:
  bf16_mm        torch.mm(a bf16 [M,K], w bf16 [K,N]) with the dequantized weight (cuBLAS)
  tinygemm       torch._weight_int4pack_mm(a, int4 pack, group 128, scales_and_zeros) (torch's own)
  gemmgen_i4     gemmgen.mixed_mm(a, uint4b8 weight, group 128 bf16 scales)      (GPTQ-style)
  gemmgen_i4z    gemmgen.mixed_mm(a, uint4 weight + zeros, group 128)              (AWQ-style)
                 (--group 32 or 64: that group size for these three and the floor; group 32 is
                 served by the `_g32` kernels)
  gemmgen_i8     gemmgen.mixed_mm(a, int8 weight, per-channel scales)
  gemmgen_i4ao   with --act-order: the uint4b8 weight with GPTQ desc_act groups (a random g_idx),
                 whose call gathers a's columns first (the entry point's gather kernel) — the cost of act-order
  sm80_i4        the uint4b8 weight through the sm80 library's kernel (the direct mma.sync kernel
                 that also serves Ampere; here PTX JIT-compiled for Hopper), up to --sm80-max-m
  floor_i4       int4 weights + group-128 scales read once at the measured copy bandwidth
It prints µs and the speed-ups over bf16 mm, then issue 10's floors on the run's points (PASS /
FAIL, each with its worst shape: `floor_checks`); writes <--out-dir>/bench_mixed_mm.md (+
--append-results to RESULTS.md).
--dtype fp16 runs the activations, scales and the dense baseline in fp16 (tinygemm: bf16 only).
--group 32 (or 64) times GPTQ's group 32 (64) instead of 128 for the int4 weights; --i8-group 32
(or 64, 128) gives the int8 weight groups instead of per-channel scales.
--kernels REGEX also times every built kernel of that dtype whose name matches, forced (on the
weight of its scheme: uint4b8, uint4 + zeros or int8 per channel), checked against the reference
first: a side-by-side of configs in one run.

NOTES (timing method): gemmgen.tuning.measure.gpu_time_us — a spin kernel hides the host, then a
warm-up batch and 7 timed batches run back to back; the median per call. Every impl rotates
through its own pool of weight copies larger than twice the L2 (weights dominate the bytes at
small M), full-range random data. Outputs are checked against gemmgen.reference first.

    python benchmarks/bench_mixed_mm.py [--m 1 16 128] [--models llama3-8b qwen3_32b] [--append-results]
                                        [--kernels 'wgmma|_sk'] [--dtype fp16] [--act-order]
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
import shlex
import statistics
import sys
from pathlib import Path

import torch

try:
    import gemmgen
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gemmgen
from gemmgen import reference
from gemmgen.errors import GemmgenError
from gemmgen.families.mixed.configs import G32_GROUP, base_scheme
from gemmgen.families.mixed.packing import dequantize
from gemmgen.tuning.measure import gpu_time_us
from gemmgen.tuning.shapes import available_stems, load_many

# the names earlier runs (and RESULTS) use, for shape files of gemmgen/manifests/shapes/
MODELS = {"llama3-8b": "llama3_8b", "llama2-70b": "llama2_70b",
          # not a default (session 18's held-out model; the tables of session 19 list it)
          "qwen2.5-7b": "qwen2_5_7b"}
DEFAULT_MODELS = ["llama3-8b", "llama2-70b"]
DEFAULT_M = [1, 4, 16, 32, 64, 128, 256, 1024, 4096]
GROUP = 128
I8_GROUP = None  # --i8-group: the int8 weight's group size (None: per-channel)
I8_NAME = "per-channel"
IMPLS = ("bf16_mm", "tinygemm", "gemmgen_i4", "gemmgen_i4z", "gemmgen_i8", "sm80_i4", "gemmgen_i4ao")
GEMMGEN_IMPLS = ("gemmgen_i4", "gemmgen_i4z", "gemmgen_i8", "gemmgen_i4ao")
ACT_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# the activations' dtype (--dtype): the dense baseline ("bf16_mm", keyed so whatever the dtype),
# the scales and every kernel run in it
ACT_NAME, ACT = "bf16", torch.bfloat16
ACT_ORDER = False  # --act-order: also time gemmgen_i4ao


def dense_shape_files() -> list[str]:
    """Stems of the shipped shape files of dense models (no MoE expert layers)."""
    return [stem for stem in available_stems() if not stem.startswith("moe_")]


def model_shapes(models: list[str]) -> list[tuple[int, int]]:
    """The (N, K) of every model's linear layers, in order, each once."""
    return [(s.n, s.k) for s in load_many([MODELS.get(model, model) for model in models])
            if not s.experts]


def sm80_kernel(m: int, n: int, k: int):
    """The sm80 library's dispatch choice for a uint4b8 weight, or None when it is not built."""
    try:
        return gemmgen.dispatch.lookup("mixed_mm", arch="sm80", a_dtype=ACT,
                                       weight_type="uint4b8", m=m, n=n, k=k,
                                       group_size=GROUP).name
    except (GemmgenError, ValueError):  # no sm80 mixed library built (or none serves it)
        return None


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = gpu_time_us(lambda i: dst.copy_(src), 1, repeats=5)
    return 2 * src.numel() / (us * 1e-6)


def make_weight(n: int, k: int, kind: str):
    """One weight of `kind`, full-range random, in every representation the impls need."""
    if kind == "i8":
        group = I8_GROUP or k
        q = torch.randint(-128, 128, (n, k), dtype=torch.int32, device="cuda")
        scales = (torch.rand(n, k // group, device="cuda") * 0.002 + 0.0005).to(ACT)
        return gemmgen.pack_weights(q, scales, weight_type="int8", group_size=group)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
    scales = (torch.rand(n, k // GROUP, device="cuda") * 0.02 + 0.005).to(ACT)
    if kind == "i4ao":  # GPTQ desc_act: groups numbered along a random quantization order
        g_idx = torch.empty(k, dtype=torch.int32, device="cuda")
        g_idx[torch.randperm(k, device="cuda")] = torch.arange(k, dtype=torch.int32, device="cuda") // GROUP
        return gemmgen.pack_weights(q, scales, weight_type="uint4b8", group_size=GROUP, g_idx=g_idx)
    if kind == "i4z":
        zeros = torch.randint(0, 16, (n, k // GROUP), dtype=torch.int32, device="cuda")
        return gemmgen.pack_weights(q, scales, zeros, weight_type="uint4", group_size=GROUP)
    return gemmgen.pack_weights(q, scales, weight_type="uint4b8", group_size=GROUP)


def tinygemm_weight(packed):
    """torch's int4 layout of a uint4b8 weight: (q - 8)·s = q·s + (−8·s), scale and zero per group."""
    q, scales, _ = gemmgen.unpack_weights(packed)                 # q [N, K] in 0..15, scales [N, G]
    q = q.to(torch.int32)
    nibbles = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8).contiguous()  # torch's [N, K/2] input
    w = torch._convert_weight_to_int4pack(nibbles, 8)
    s = scales.t().float()                                         # [G, N]
    # tinygemm dequantizes (q - 8) * scale + zero
    scales_and_zeros = torch.stack([s, torch.zeros_like(s)], dim=2).to(torch.bfloat16).contiguous()
    return w, scales_and_zeros


def impl_call(impl: str, pool: list, a_pool: list, out, kernel=None):
    if impl == "bf16_mm":
        return lambda i: torch.mm(a_pool[i % len(a_pool)], pool[i % len(pool)], out=out)
    if impl == "tinygemm":
        return lambda i: torch._weight_int4pack_mm(a_pool[i % len(a_pool)], pool[i % len(pool)][0],
                                                   GROUP, pool[i % len(pool)][1])
    mixed_mm = gemmgen.mixed_mm
    return lambda i: mixed_mm(a_pool[i % len(a_pool)], pool[i % len(pool)], out=out, kernel=kernel)


def pool_size(weight_bytes: int, l2: int) -> int:
    return max(2, min(32, math.ceil(2 * l2 / max(weight_bytes, 1)) + 1))


# the pool a forced kernel runs on, by its scheme's math (spec.w, base scheme)
FORCED_POOL = {("int4", "scale"): "gemmgen_i4", ("int4", "scale_zero"): "gemmgen_i4z",
               ("int8", "scale"): "gemmgen_i8"}


def forced_pool(spec) -> str | None:
    """The pool a forced kernel runs on; None when its group sizes are not the pool's (the int4
    pools have group --group, the int8 pool --i8-group or per-channel scales)."""
    group = GROUP if spec.w == "int4" else I8_GROUP
    if (spec.group_k == G32_GROUP) != (group == G32_GROUP):
        return None
    return FORCED_POOL[(spec.w, base_scheme(spec.scheme))]


def forced_kernels(pattern: str | None) -> list:
    """The built sm90a mixed_mm kernels of the activation dtype whose names match `pattern` and
    whose group sizes are this run's (none without a pattern)."""
    if not pattern:
        return []
    regex = re.compile(pattern)
    return [k for k in gemmgen.list_kernels("mixed_mm")
            if k.spec.a == ACT_NAME and k.spec.arch == "sm90a" and regex.search(k.name)
            and forced_pool(k.spec) is not None]


def bench_shape(n: int, k: int, ms: list[int], l2: int, bandwidth: float, sm80_max_m: int,
                forced: list = ()) -> list[dict]:
    rows = []
    base = {kind: make_weight(n, k, kind) for kind in ("i4", "i4z", "i8")}
    dense = dequantize(base["i4"]).to(ACT).contiguous()  # [K, N]
    pools = {
        "bf16_mm": [dense.clone() for _ in range(pool_size(dense.numel() * 2, l2))],
        "gemmgen_i4": [base["i4"]] + [make_weight(n, k, "i4") for _ in range(pool_size(n * k // 2, l2) - 1)],
        "gemmgen_i4z": [base["i4z"]] + [make_weight(n, k, "i4z") for _ in range(pool_size(n * k // 2, l2) - 1)],
        "gemmgen_i8": [base["i8"]] + [make_weight(n, k, "i8") for _ in range(pool_size(n * k, l2) - 1)],
    }
    if ACT_ORDER:
        pools["gemmgen_i4ao"] = [make_weight(n, k, "i4ao") for _ in range(pool_size(n * k // 2, l2))]
    if ACT != torch.bfloat16:
        print("  tinygemm left out: torch._weight_int4pack_mm takes bf16 activations only")
    else:
        try:
            tiny = tinygemm_weight(base["i4"])
            pools["tinygemm"] = [tiny] * 1 + [tinygemm_weight(p) for p in pools["gemmgen_i4"][1:]]
        except Exception as exc:  # torch's int4 kernel is optional; say why it is absent
            print(f"  tinygemm unavailable: {type(exc).__name__}: {exc}")
    floor_us = (n * k / 2 + n * (k // GROUP) * 2) / bandwidth * 1e6
    for m in ms:
        a_pool = [torch.randn(m, k, device="cuda").to(ACT) for _ in range(4)]
        out = torch.empty(m, n, dtype=ACT, device="cuda")
        # correctness first: every gemmgen impl against the reference on its first weight
        for impl in GEMMGEN_IMPLS:
            if impl not in pools:
                continue
            try:
                got = gemmgen.mixed_mm(a_pool[0], pools[impl][0]).float()
            except ValueError as exc:  # a manifest without this weight scheme: leave it out
                if "no built kernel" not in str(exc):
                    raise
                print(f"  {impl}: not built ({exc.args[0].split(';')[0]}); left out")
                del pools[impl]
                continue
            ref = reference.mixed_mm(a_pool[0], pools[impl][0])
            err = ((got - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"{impl} n={n} k={k} m={m}: relative error {err:.2e}"
        if "tinygemm" in pools:
            got = torch._weight_int4pack_mm(a_pool[0], pools["tinygemm"][0][0], GROUP, pools["tinygemm"][0][1])
            ref = reference.mixed_mm(a_pool[0], base["i4"])
            err = ((got.float() - ref).norm() / ref.norm()).item()
            if err > 2e-2:
                print(f"  tinygemm n={n} k={k} m={m}: relative error {err:.2e} (layout mismatch?)")
        sm80 = sm80_kernel(m, n, k) if m <= sm80_max_m else None
        if sm80 is not None:
            got = gemmgen.mixed_mm(a_pool[0], base["i4"], kernel=sm80).float()
            ref = reference.mixed_mm(a_pool[0], base["i4"])
            err = ((got - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"{sm80} n={n} k={k} m={m}: relative error {err:.2e}"
        row = {"n": n, "k": k, "m": m, "floor_i4": floor_us}
        for kernel in forced:
            pool = pools[forced_pool(kernel.spec)]
            got = gemmgen.mixed_mm(a_pool[0], pool[0], kernel=kernel.name).float()
            ref = reference.mixed_mm(a_pool[0], pool[0])
            err = ((got - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"{kernel.name} n={n} k={k} m={m}: relative error {err:.2e}"
            row["kernel:" + kernel.name] = gpu_time_us(
                impl_call("forced", pool, a_pool, out, kernel.name), len(pool) * len(a_pool))
        for impl in IMPLS:
            if impl == "sm80_i4" and sm80 is not None:
                row[impl] = gpu_time_us(impl_call(impl, pools["gemmgen_i4"], a_pool, out, sm80),
                                        len(pools["gemmgen_i4"]) * len(a_pool))
            elif impl in pools:
                row[impl] = gpu_time_us(impl_call(impl, pools[impl], a_pool, out),
                                        len(pools[impl]) * len(a_pool))
        rows.append(row)
        print(f"  n={n:6d} k={k:6d} m={m:5d}  " + "  ".join(
            f"{impl} {row[impl]:8.1f}" for impl in IMPLS if impl in row) + f"  floor {floor_us:7.1f} µs",
            flush=True)
        for kernel in forced:
            print(f"    {kernel.name} {row['kernel:' + kernel.name]:8.1f} µs", flush=True)
    return rows


def geomean(values) -> float:
    values = [v for v in values if v and math.isfinite(v)]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def _ratio(a: float, b: float) -> str:
    """a / b to two decimals, or "–" when either was not measured (the sm80 column past
    --sm80-max-m, tinygemm with fp16 activations)."""
    return f"{a / b:.2f}" if math.isfinite(a) and math.isfinite(b) else "–"


def summary(rows: list[dict], ms: list[int], device: str) -> str:
    lines = [f"## Mixed-input GEMM (weight-only) on {device}", "",
             f"{datetime.date.today()}; `{shlex.join(['python', *sys.argv])}`; group {GROUP}; µs "
             f"geomean over the shapes; speed-up = {ACT_NAME} `torch.mm` time / impl time.", "",
             f"| M | {ACT_NAME} mm µs | gemmgen i4 µs | × {ACT_NAME} | i4 / floor | tinygemm × {ACT_NAME} "
             f"| gemmgen × tinygemm | i4+zero × {ACT_NAME} | i8 {I8_NAME} × {ACT_NAME} "
             f"| sm80 i4 × {ACT_NAME} |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in ms:
        sel = [r for r in rows if r["m"] == m]
        g = {impl: geomean([r.get(impl) for r in sel]) for impl in (*IMPLS, "floor_i4")}
        lines.append(f"| {m} | {g['bf16_mm']:.1f} | {g['gemmgen_i4']:.1f} | "
                     f"{g['bf16_mm'] / g['gemmgen_i4']:.2f} | {g['gemmgen_i4'] / g['floor_i4']:.2f} | "
                     f"{_ratio(g['bf16_mm'], g['tinygemm'])} | "
                     f"{_ratio(g['tinygemm'], g['gemmgen_i4'])} | "
                     f"{_ratio(g['bf16_mm'], g['gemmgen_i4z'])} | {_ratio(g['bf16_mm'], g['gemmgen_i8'])} | "
                     f"{_ratio(g['bf16_mm'], g['sm80_i4'])} |")
    forced = sorted({key for r in rows for key in r if key.startswith("kernel:")})
    if forced:
        lines += ["", f"Forced kernels, speed-up over {ACT_NAME} `torch.mm` (geomean over the shapes):", "",
                  "| kernel | " + " | ".join(f"M = {m}" for m in ms) + " |",
                  "|---|" + "---:|" * len(ms)]
        for key in forced:
            cells = []
            for m in ms:
                sel = [r for r in rows if r["m"] == m]
                cells.append(_ratio(geomean([r["bf16_mm"] for r in sel]),
                                    geomean([r.get(key) for r in sel])))
            lines.append(f"| `{key.removeprefix('kernel:')}` | " + " | ".join(cells) + " |")
    if any("gemmgen_i4ao" in r for r in rows):
        lines += ["", "GPTQ act-order (desc_act; the call gathers a's columns first): its time / the "
                  "same kind of weight without act-order (gemmgen i4), geomean over the shapes:", "",
                  "| " + " | ".join(f"M = {m}" for m in ms) + " |", "|" + "---:|" * len(ms)]
        both = [r for r in rows if r.get("gemmgen_i4ao") and r.get("gemmgen_i4")]  # paired shapes
        cells = [_ratio(geomean([r["gemmgen_i4ao"] for r in both if r["m"] == m]),
                        geomean([r["gemmgen_i4"] for r in both if r["m"] == m])) for m in ms]
        lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Per shape, act-order µs / gemmgen i4 µs = ratio:", "",
                  "| N x K | " + " | ".join(f"M = {m}" for m in ms) + " |", "|---|" + "---|" * len(ms)]
        for n, k in dict.fromkeys((r["n"], r["k"]) for r in rows):
            cells = []
            for m in ms:
                row = next((r for r in rows if (r["n"], r["k"], r["m"]) == (n, k, m)), {})
                ao, plain = row.get("gemmgen_i4ao", math.nan), row.get("gemmgen_i4", math.nan)
                cells.append(f"{ao:.1f} / {plain:.1f} = {_ratio(ao, plain)}"
                             if math.isfinite(ao) and math.isfinite(plain) else "–")
            lines.append(f"| {n} x {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def floor_checks(rows: list[dict]) -> list[str]:
    """Issue 10's floors on the points of this run (int4 GPTQ-style weights with group-128
    scales, bf16 activations; int8 per channel): each PASS / FAIL with its value (the geomean over
    the run's shapes at that M) and the shape where it is worst. A floor whose M this run did not
    measure says so; a run in another configuration (--dtype, --group, --i8-group) gets one line
    saying its figures are not the floors'."""
    if (ACT_NAME, GROUP, I8_GROUP) != ("bf16", 128, None):
        return [f"- not evaluated: the floors are stated for bf16 activations, int4 group 128 and "
                f"int8 per channel; this run: {ACT_NAME}, group {GROUP}, int8 {I8_NAME}"]

    def ratios(m: int, impl: str, over: str) -> list[tuple[float, dict]]:
        return [(r[over] / r[impl], r) for r in rows
                if r["m"] == m and r.get(impl) and r.get(over)]

    checks = []  # (title, M, impl, baseline, bound, strictly above the bound)
    for m in (1, 4, 16):
        checks.append((f"gemmgen i4 x {ACT_NAME} mm at M = {m} >= 2.5", m, "gemmgen_i4", "bf16_mm", 2.5, False))
    checks.append((f"gemmgen i4 x {ACT_NAME} mm at M = 64 >= 2.0", 64, "gemmgen_i4", "bf16_mm", 2.0, False))
    checks.append((f"gemmgen i4 x {ACT_NAME} mm at M = 4096 >= 0.85", 4096, "gemmgen_i4", "bf16_mm", 0.85,
                   False))
    for m in sorted({r["m"] for r in rows}):  # faster than tinygemm at every M
        checks.append((f"gemmgen i4 x tinygemm at M = {m} > 1", m, "gemmgen_i4", "tinygemm", 1.0, True))
    for m in (1, 4, 16):
        checks.append((f"gemmgen i8 (per channel) x {ACT_NAME} mm at M = {m} >= 1.6", m, "gemmgen_i8",
                       "bf16_mm", 1.6, False))
    out = []
    for title, m, impl, over, bound, strict in checks:
        values = ratios(m, impl, over)
        if not values:
            out.append(f"- {title}: not evaluated (no points in this run)")
            continue
        value = geomean([v for v, _ in values])
        passed = value > bound if strict else value >= bound
        worst, where = min(values, key=lambda t: t[0])
        out.append(f"- {title}: {'PASS' if passed else 'FAIL'} ({value:.2f}x over {len(values)} "
                   f"shapes); worst shape {worst:.2f}x (N={where['n']} K={where['k']})")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=DEFAULT_M)
    p.add_argument("--models", nargs="+", choices=list(MODELS) + dense_shape_files(),
                   default=DEFAULT_MODELS,
                   help="models whose linear layers are timed: the names above, or shape files of "
                        "gemmgen/manifests/shapes/ (e.g. qwen3_32b); a shape listed twice runs once")
    p.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "out"))
    p.add_argument("--append-results", action="store_true")
    p.add_argument("--sm80-max-m", type=int, default=256,
                   help="time the sm80 library up to this M (it re-reads weights per token block)")
    p.add_argument("--kernels", default=None,
                   help="also time every built sm90a kernel of --dtype whose name matches this regex, "
                        "forced")
    p.add_argument("--dtype", choices=list(ACT_DTYPES), default="bf16",
                   help="the activations' dtype (the dense baseline's too; tinygemm: bf16 only)")
    p.add_argument("--act-order", action="store_true",
                   help="also time a GPTQ desc_act weight (its call gathers the activations first)")
    p.add_argument("--group", type=int, choices=(G32_GROUP, 64, 128), default=128,
                   help="the int4 weights' group size (tinygemm's too)")
    p.add_argument("--i8-group", type=int, choices=(G32_GROUP, 64, 128), default=None,
                   help="the int8 weight's group size (default: per-channel scales)")
    args = p.parse_args(argv)
    global ACT_NAME, ACT, ACT_ORDER, GROUP, I8_GROUP, I8_NAME
    ACT_NAME, ACT, ACT_ORDER, GROUP = args.dtype, ACT_DTYPES[args.dtype], args.act_order, args.group
    I8_GROUP = args.i8_group
    I8_NAME = f"group {I8_GROUP}" if I8_GROUP else "per-channel"
    torch.manual_seed(0)
    device = torch.cuda.get_device_name()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    bandwidth = copy_bandwidth()
    print(f"{device}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    rows = []
    for n, k in model_shapes(args.models):
        rows += bench_shape(n, k, args.m, l2, bandwidth, args.sm80_max_m, forced_kernels(args.kernels))
    text = (summary(rows, args.m, device) + f"\nCopy bandwidth measured in the run: {bandwidth / 1e12:.2f} TB/s.\n"
            + "\nIssue 10's floors on this run's points:\n\n" + "\n".join(floor_checks(rows)) + "\n")
    print(text)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_mixed_mm.md").write_text(text)
    if args.append_results:
        with open(Path(__file__).resolve().parent / "RESULTS.md", "a") as handle:
            handle.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
