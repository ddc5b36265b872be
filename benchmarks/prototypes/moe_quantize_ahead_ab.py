"""A/B of the fused MoE kernels quantizing ahead inside the GEMM (with
benchmarks/prototypes/moe_quantize_ahead.patch applied: GEMMGEN_MOE_QUANTIZE_AHEAD budgets), in one
process: for each (dtype, model, tokens, routing) and kernel, the op replayed from CUDA graphs
(one captured under each budget), the budgets alternated round by round, medians; bench_moe.py's
data. --profile: each budget's kernel durations (torch.profiler; under programmatic dependent
launch a kernel's duration includes its wait for the one before).

    python benchmarks/prototypes/moe_quantize_ahead_ab.py --dtypes e4m3 --models mixtral-8x7b \
        --tokens 256 1024 --kernels t64x256 --budgets 0 1 4
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402

import bench_moe as B  # noqa: E402
import gemmgen  # noqa: E402
from gemmgen.tuning.measure import graph_time_us  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--dtypes", nargs="+", default=["e4m3", "int8"])
ap.add_argument("--models", nargs="+", default=["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"])
ap.add_argument("--tokens", nargs="+", type=int, default=[64, 256, 1024])
ap.add_argument("--routing", nargs="+", default=["uniform", "skewed"])
ap.add_argument("--budgets", nargs="+", default=["0", "4"])
ap.add_argument("--kernels", nargs="*", default=None, help="substrings; default: the dispatched one")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--json", default=None)
ap.add_argument("--profile", action="store_true", help="kernel durations per budget (torch.profiler)")
a = ap.parse_args()
models = B._shipped_models()
l2 = torch.cuda.get_device_properties(0).L2_cache_size
rows = []
stream = torch.cuda.Stream()
for dtype in a.dtypes:
    for name in a.models:
        model = models[name]
        w = B.make_weights(model, dtype, 2)
        for tokens in a.tokens:
            for routing in a.routing:
                counts = B.routing_counts(model, tokens, routing, name)
                m = sum(counts)
                active = sum(1 for c in counts if c)
                ab = int(active * model.n * model.k * B.weight_bytes(dtype))
                rot = max(1, min(B.MAX_ROTATIONS, (2 * l2) // (ab + m * model.k) + 1))
                inp = B.make_inputs(model, dtype, counts, rot)
                names = [None]
                if a.kernels:
                    names = [k.name for k in gemmgen.list_kernels() if k.spec.family == "moe"
                             and any(s in k.name for s in a.kernels)]
                for kname in names:
                    fn = B.gemmgen_fn(w.packed, inp, kname)
                    times = {b: [] for b in a.budgets}
                    try:
                        for r in range(a.rounds):
                            order = a.budgets if r % 2 == 0 else a.budgets[::-1]
                            for b in order:
                                os.environ["GEMMGEN_MOE_QUANTIZE_AHEAD"] = b
                                times[b].append(graph_time_us(fn, rot, 7, stream)[0])
                    except Exception as exc:  # noqa
                        print(f"{dtype} {name} {tokens} {routing} {kname}: {str(exc).splitlines()[0]}")
                        continue
                    if a.profile:
                        from torch.profiler import profile, ProfilerActivity
                        for b in a.budgets:
                            os.environ["GEMMGEN_MOE_QUANTIZE_AHEAD"] = b
                            for i in range(3):
                                fn(i)
                            torch.cuda.synchronize()
                            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                                for i in range(10):
                                    fn(i)
                                torch.cuda.synchronize()
                            for ev in prof.key_averages():
                                tot = getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0)
                                nm = ev.key
                                if tot and ev.count and any(s in nm for s in ("quantize_rows", "group_setup", "device_kernel")):
                                    short = "quantize_rows" if "quantize_rows" in nm else ("group_setup" if "group_setup" in nm else ("GEMM" if "GroupedSwiglu" in nm else nm[:30]))
                                    print(f"   budget {b}: {short:15s} x{ev.count:3d} {tot / ev.count:8.1f} us")
                    med = {b: statistics.median(v) for b, v in times.items()}
                    base = med[a.budgets[0]]
                    kshort = (kname or "dispatched").replace("sm90a_grouped_matmul_swiglu_quant_", "")
                    line = f"{dtype:5s} {name:17s} {tokens:5d} {routing:8s} m={m:5d} {kshort:45s} " + \
                        " ".join(f"b{b}={med[b]:8.1f}" for b in a.budgets) + "  " + \
                        " ".join(f"{base / med[b]:.3f}" for b in a.budgets[1:])
                    print(line, flush=True)
                    rows.append(dict(dtype=dtype, model=name, tokens=tokens, routing=routing, m=m,
                                     kernel=kshort, us=med, all=times))
        del w
        torch.cuda.empty_cache()
if a.json:
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, open(a.json, "w"), indent=1)
