"""Providers timed in alternation, rep by rep, against the same providers timed one after another (call U).

python interleave.py OUT.json REPS CASES PROVIDERS
  CASES: e.g. 32768/0,32768/75,4096/0   PROVIDERS: e.g. floor,trl,chunked,chunked:opt_r48
  a chunked variant: tokens joined by "_": opt | rawfirst (the pass kernel), b{BLOCK}w{WARPS}, r{MAXNREG}
Each rep is timed as the bench times it (events around run_step from an idle device, then a sync). After each rep
the SM clock (MHz), power (W) and the active clock-throttle reasons are read through NVML."""
import json
import re
import statistics
import sys

import pynvml
import torch

from grpo_kernels import bench, bench_padded, bench_providers, probs

import pass_variants

out_path, reps, cases, providers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4].split(",")
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
DEFAULT = (probs._probs_kernel, probs.PROBS_BLOCK, probs.PROBS_WARPS)


def configure(variant):
    kernel, block, warps = DEFAULT
    reg, paired = None, False
    for tok in filter(None, variant.split("_")):
        if tok == "opt":
            kernel = pass_variants._opt_kernel
        elif tok == "two":
            paired = True
        elif tok == "rawfirst":
            kernel = pass_variants._rawfirst_kernel
        elif m := re.fullmatch(r"b(\d+)w(\d+)", tok):
            block, warps = int(m.group(1)), int(m.group(2))
        elif m := re.fullmatch(r"r(\d+)", tok):
            reg = int(m.group(1))
        else:
            raise SystemExit(f"unknown variant token {tok}")
    if paired:
        probs._probs_kernel = pass_variants.Paired(reg)
    else:
        probs._probs_kernel = kernel if reg is None else pass_variants.Capped(kernel, reg)
    probs.PROBS_BLOCK, probs.PROBS_WARPS = block, warps


def sample():
    return (pynvml.nvmlDeviceGetClockInfo(gpu, pynvml.NVML_CLOCK_SM), pynvml.nvmlDeviceGetPowerUsage(gpu) / 1000,
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(gpu))


def rep(step, inp, variant):
    configure(variant)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    bench.run_step(step, inp)
    end.record()
    end.synchronize()
    return start.elapsed_time(end), *sample()


res = []
for case in cases:
    tokens, pct = (int(x) for x in case.split("/"))
    lengths = bench_padded.draw_lengths(tokens, 512, 512 * (1 - pct / 100), seed=0)
    inp = bench_padded.padded_inputs(lengths, 512, 1024, 151936, seed=0)
    steps = {}
    for p in providers:
        base, _, variant = p.partition(":")
        steps[p] = (bench_providers.loss_fn(base, inp, beta=0.04), variant)
        for _ in range(3):
            rep(*steps[p][:1], inp, variant)
    seq = {p: [rep(steps[p][0], inp, steps[p][1]) for _ in range(reps)] for p in providers}
    alt = {p: [] for p in providers}
    for _ in range(reps):
        for p in providers:
            alt[p].append(rep(steps[p][0], inp, steps[p][1]))
    for p in providers:
        row = {"case": case, "provider": p}
        for name, runs in (("seq", seq[p]), ("alt", alt[p])):
            ms = [r[0] for r in runs]
            row[name] = {"median_ms": round(statistics.median(ms), 3), "min_ms": round(min(ms), 3),
                         "max_ms": round(max(ms), 3), "median_sm_mhz": statistics.median(r[1] for r in runs),
                         "median_w": round(statistics.median(r[2] for r in runs)), "throttle": sorted({r[3] for r in runs}),
                         "ms": [round(x, 3) for x in ms], "mhz": [r[1] for r in runs]}
        res.append(row)
        print(case, p.ljust(22), "seq", row["seq"]["median_ms"], row["seq"]["median_sm_mhz"], "MHz",
              "| alt", row["alt"]["median_ms"], row["alt"]["median_sm_mhz"], "MHz", row["alt"]["throttle"], flush=True)
    configure("")
    del inp, steps
    torch.cuda.empty_cache()
json.dump(res, open(out_path, "w"), indent=1)
fl = {(r["case"]): r for r in res if r["provider"] == "floor"}
for r in res:
    if r["provider"] != "floor" and r["case"] in fl:
        f = fl[r["case"]]
        print(f"{r['case']:>9} {r['provider']:<22} seq {r['seq']['median_ms'] / f['seq']['median_ms']:.3f}x"
              f"  alt {r['alt']['median_ms'] / f['alt']['median_ms']:.3f}x  (alt {r['alt']['median_ms']:.2f} vs floor {f['alt']['median_ms']:.2f})")
