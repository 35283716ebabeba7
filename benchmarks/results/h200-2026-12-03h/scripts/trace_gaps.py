"""Where a bench rep's idle time sits (call P): the loss + backward of `chunked` (and the floor) as the bench times
them (one rep = events around run_step, then a sync), 3 reps under torch.profiler. Per rep: wall (events),
device busy, the time from the rep's start to its first kernel and to its first GEMM, every gap > 30 us with the
kernels around it and the CPU ops running then, and the time after the last kernel. Writes gaps.json and a
chrome trace."""
import json
import sys

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from grpo_kernels import bench, bench_padded, bench_providers

out_dir = sys.argv[1]
res = {}
for tokens, pct in ((32768, 0), (4096, 0)):
    lengths = bench_padded.draw_lengths(tokens, 512, 512 * (1 - pct / 100), seed=0)
    inp = bench_padded.padded_inputs(lengths, 512, 1024, 151936, seed=0)
    for provider in ("chunked", "floor"):
        step = bench_providers.loss_fn(provider, inp, beta=0.04)
        for _ in range(3):
            bench.run_step(step, inp)
        torch.cuda.synchronize()
        marks = []
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for rep in range(3):
                with torch.profiler.record_function(f"rep{rep}"):
                    bench.run_step(step, inp)
                    torch.cuda.synchronize()
        events = prof.events()
        kern = sorted((e for e in events if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
        reps = sorted((e for e in events if e.name.startswith("rep") and e.device_type == DeviceType.CPU), key=lambda e: e.time_range.start)
        cpu_ops = [e for e in events if e.device_type == DeviceType.CPU and not e.name.startswith("rep")]
        rows = []
        for r in reps:
            a, b = r.time_range.start, r.time_range.end
            ks = [k for k in kern if a <= k.time_range.start < b]
            if not ks:
                continue
            busy, reach = 0.0, a
            gaps = []
            prev = None
            for k in ks:
                s, e = k.time_range.start, k.time_range.end
                if s > reach + 30 and prev is not None:
                    during = sorted({c.name for c in cpu_ops if c.time_range.start < s and c.time_range.end > reach and c.name.startswith(("aten::", "grpo", "cuda"))})[:12]
                    gaps.append({"us": round(s - reach, 1), "after": prev.name[:60], "before": k.name[:60], "cpu_ops": during})
                if e > reach:
                    busy += e - max(s, reach)
                    reach = e
                prev = k
            first_gemm = next((k for k in ks if "gemm" in k.name.lower() or "nvjet" in k.name.lower() or "sm90" in k.name.lower()), None)
            rows.append({
                "rep_us": round(b - a, 1),
                "busy_us": round(busy, 1),
                "to_first_kernel_us": round(ks[0].time_range.start - a, 1),
                "to_first_gemm_us": None if first_gemm is None else round(first_gemm.time_range.start - a, 1),
                "kernels_before_first_gemm": sum(1 for k in ks if first_gemm is not None and k.time_range.start < first_gemm.time_range.start),
                "after_last_kernel_us": round(b - reach, 1),
                "gaps_over_30us": sorted(gaps, key=lambda g: -g["us"])[:15],
                "gap_total_us": round(sum(g["us"] for g in gaps), 1),
            })
        res[f"{provider}-{tokens}-{pct}"] = rows
        if provider == "chunked" and tokens == 32768:
            prof.export_chrome_trace(f"{out_dir}/trace-{tokens}.json")
        print(provider, tokens, pct, [(r["rep_us"], r["busy_us"], r["to_first_gemm_us"], r["gap_total_us"], r["after_last_kernel_us"]) for r in rows], flush=True)
    del inp
    torch.cuda.empty_cache()
json.dump(res, open(f"{out_dir}/gaps.json", "w"), indent=1)
