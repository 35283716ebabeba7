"""Where a head call's time goes: device busy vs idle, kernels per call, and the host's hot spots.

    python benchmarks/kernel/kernel_profile.py [--cases loss:32768:0,scoring:4096:75] [--providers chunked,trl] --out DIR

A case is MODE:VALID_TOKENS:PADDING% (mode loss = loss + backward, scoring = no-grad log-probs), built as
`python benchmarks/kernel/bench.py --padding` builds it (same length draw and seed, T = 512, Qwen3-0.6B's
H = 1024 and V = 151,936). Per case and provider, after warm-up: the mean wall time of a call (CUDA events),
one torch.profiler pass over `--calls` calls (the union of kernel intervals = the device's busy time; the
rest of the wall time is idle: launch gaps, host-bound stretches, the call's host sync), and one cProfile
pass over the same number of calls (host functions by own time). Prints one row per case and provider and
writes DIR/kernel-profile.json plus DIR/<case>-<provider>.txt (top kernels and host functions). CUDA only;
`--device cpu` runs a smoke pass at small sizes (no device times).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import bench_padded
import bench_providers
import timing
import torch

from grpo_tui.runs.failures import labelled_failure

MODES = ("loss", "scoring")
PROVIDERS = ("floor", "trl", "chunked", "chunked-lean")
TOP = 12


def parse_cases(text: str) -> list[tuple[str, int, int]]:
    cases = []
    for item in text.split(","):
        parts = item.strip().split(":")
        ok = len(parts) == 3 and parts[0] in MODES and parts[1].isdecimal() and parts[2].isdecimal()
        if not ok or int(parts[1]) == 0 or int(parts[2]) >= 100:
            raise ValueError(
                f"--cases: got {item!r}; allowed: MODE:VALID_TOKENS:PADDING with MODE loss or scoring, "
                "VALID_TOKENS > 0 and PADDING a percentage below 100, e.g. scoring:4096:75"
            )
        cases.append((parts[0], int(parts[1]), int(parts[2])))
    return cases


def parse_providers(text: str) -> list[str]:
    providers = [p for p in text.split(",") if p]
    if not providers or any(p not in PROVIDERS for p in providers):
        raise ValueError(f"--providers: got {text!r}; allowed: a comma-separated subset of {', '.join(PROVIDERS)}")
    return providers


def busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (microseconds in, milliseconds out)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total / 1e3


def device_profile(call: Any, calls: int, cuda: bool) -> tuple[dict[str, Any], str]:
    """({profiled_wall_ms, busy_ms, idle_fraction, kernels_per_call} per call, the top kernels' table) under
    torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3 / calls
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy = busy_ms(spans) / calls
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=TOP, max_name_column_width=60)
    summary = {
        "profiled_wall_ms": wall,
        "busy_ms": busy,
        "idle_fraction": max(0.0, 1 - busy / wall) if cuda and wall > 0 else None,
        "kernels_per_call": len(kernels) / calls,
    }
    return summary, table


def host_profile(call: Any, calls: int, cuda: bool) -> str:
    """cProfile of `calls` calls: host functions by own time (the device work they wait on shows in syncs)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    if cuda:
        torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(TOP)
    return text.getvalue()


def make_call(mode: str, provider: str, inp: dict) -> Any:
    """One call of `provider` on `inp` as `benchmarks/kernel/bench.py` times it: the loss and its backward, or scoring."""
    if mode == "scoring":
        step = bench_providers.score_fn(provider, inp)
    else:
        step = bench_providers.loss_fn(provider, inp, beta=0.04)
    return functools.partial(timing.run_step, step, inp)


def wall_ms(call: Any, reps: int, cuda: bool) -> float:
    if not cuda:
        start = time.perf_counter()
        for _ in range(reps):
            call()
        return (time.perf_counter() - start) * 1e3 / reps
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(reps):
        call()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / reps


def run_case(case: tuple[str, int, int], provider: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    mode, n_valid, pct = case
    seq, hidden, vocab = (args.seq, 1024, 151936) if args.device == "cuda" else (16, 32, 300)
    lengths = bench_padded.draw_lengths(n_valid, seq, seq * (1 - pct / 100), seed=0)
    inp = bench_padded.padded_inputs(lengths, seq, hidden, vocab, seed=0, device=args.device)
    cuda = args.device == "cuda"
    call = make_call(mode, provider, inp)
    for _ in range(3):
        call()
    row: dict[str, Any] = {"mode": mode, "valid_tokens": n_valid, "padding": pct, "provider": provider}
    row["batch"] = len(lengths)
    row["wall_ms"] = wall_ms(call, args.calls, cuda)
    summary, kernels = device_profile(call, args.calls, cuda)
    row.update(summary)
    host = host_profile(call, args.calls, cuda)
    name = f"{mode}-{n_valid}-{pct}-{provider}.txt"
    (out / name).write_text(f"# {name}\n\n## kernels (torch.profiler)\n{kernels}\n\n## host (cProfile)\n{host}")
    del inp, call
    if cuda:
        torch.cuda.empty_cache()
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | valid tokens | padding | provider | wall ms | busy ms | idle | kernels/call |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['mode']} | {r['valid_tokens']:,} | {r['padding']}% | {r['provider']} | {r['error']} ||||"
            )
            continue
        idle = "-" if r["idle_fraction"] is None else f"{r['idle_fraction']:.1%}"
        lines.append(
            f"| {r['mode']} | {r['valid_tokens']:,} | {r['padding']}% | {r['provider']} | {r['wall_ms']:.2f} | "
            f"{r['busy_ms']:.2f} | {idle} | {r['kernels_per_call']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="loss:32768:0,loss:4096:0,scoring:4096:0,scoring:4096:75,scoring:32768:0")
    parser.add_argument("--providers", default="chunked,trl", help="of floor, trl, chunked, chunked-lean")
    parser.add_argument("--calls", type=int, default=5, help="calls per profiled pass (default 5)")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        cases, providers = parse_cases(args.cases), parse_providers(args.providers)
    except ValueError as error:
        parser.error(str(error))
    if args.calls < 1:
        parser.error(f"--calls: got {args.calls}; allowed: an integer >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; allowed: --device cpu for a smoke pass")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for case in cases:
        for provider in providers:
            if provider == "trl" and args.device == "cpu":
                continue  # TRL's fused head needs Triton on a GPU
            try:
                rows.append(run_case(case, provider, args, args.out))
            except Exception as exc:  # one case failing (TRL not installed, out of memory) leaves the others
                mode, n_valid, pct = case
                error = labelled_failure("failed", exc)
                rows.append(
                    {"mode": mode, "valid_tokens": n_valid, "padding": pct, "provider": provider, "error": error}
                )
                if args.device == "cuda":
                    torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), flush=True)
    (args.out / "kernel-profile.json").write_text(
        json.dumps(
            {
                "command": " ".join(
                    ["python", "benchmarks/kernel/kernel_profile.py", *(sys.argv[1:] if argv is None else argv)]
                ),
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
