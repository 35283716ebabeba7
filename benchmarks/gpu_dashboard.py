"""The dashboard on a real GPU run: screenshots before and after a live chunked -> naive switch, the
cost of one NVML sample per GPU, and the app's CPU use while it watches.

Run from the repository root on a CUDA machine (`bash benchmarks/gpu_e2e.sh dashboard` does, with the
Qwen3-0.6B-shape setup of the other GPU phases):

    python benchmarks/gpu_dashboard.py --out OUT [--set KEY=VALUE ...]

A real run of `qwen3-0.6b-gsm8k` is started detached (exactly as the app's `s` does), the app is driven
headless at 150x48 with the real NVML monitor, and `t` switches the loss live. Writes
OUT/dashboard-gpu-before.svg, OUT/dashboard-gpu-after.svg and OUT/dashboard-gpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import psutil

from grpo_tui.config.store import load_preset
from grpo_tui.dashboard.app import create_app
from grpo_tui.dashboard.monitor import Monitor
from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.launch import supervisor
from grpo_tui.runs.metrics import read_records, step_records

SIZE = (150, 48)


def nvml_cost(samples: int) -> dict:
    """Milliseconds per `Monitor.sample()` (all GPUs and the host), and per GPU."""
    monitor = Monitor()
    first = monitor.sample()
    gpus = len(first.gpus)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        monitor.sample()
        times.append((time.perf_counter() - start) * 1e3)
    median = statistics.median(times)
    return {
        "gpus": gpus,
        "samples": samples,
        "ms_per_sample_median": median,
        "ms_per_sample_p90": sorted(times)[int(0.9 * len(times))],
        "ms_per_gpu_median": median / max(gpus, 1),
        "nvml_ok": first.nvml_ok,
    }


def steps_of(run: Path) -> list[dict]:
    return step_records(read_records(run / "metrics.jsonl"))


async def drive(run: Path, out: Path, watch_s: float, poll: float) -> dict:
    app = create_app(runs_dir=run.parent, auto_attach=False, poll_interval=poll)
    me = psutil.Process()
    result: dict = {}

    async def until(predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            await pilot.pause(0.2)
        return True

    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run)
        await until(lambda: isinstance(app.screen, DashboardScreen), 30)
        await until(lambda: len(steps_of(run)) >= 3, 600)
        await pilot.pause(2 * poll + 0.5)
        # The app's own CPU while it watches a live run (the trainer is another process).
        cpu0, wall0, updates0 = me.cpu_times(), time.monotonic(), app.screen.updates
        await pilot.pause(watch_s)
        cpu1, wall1 = me.cpu_times(), time.monotonic()
        used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
        result["app_cpu"] = {
            "window_s": wall1 - wall0,
            "cpu_s": used,
            "percent_of_one_core": 100 * used / (wall1 - wall0),
            "refresh_hz": (app.screen.updates - updates0) / (wall1 - wall0),
            "poll_interval_s": poll,
        }
        app.save_screenshot("dashboard-gpu-before.svg", str(out))
        switch_from = len(steps_of(run))
        await pilot.press("t")
        await until(lambda: sum(1 for r in steps_of(run) if r.get("loss_impl") == "naive") >= 3, 600)
        await pilot.pause(2 * poll + 0.5)
        app.save_screenshot("dashboard-gpu-after.svg", str(out))
        result["switch_requested_after_step"] = switch_from
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="qwen3-0.6b-gsm8k", help="tiny-cpu for a CPU smoke test")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/runs-dashboard"))
    parser.add_argument("--watch", type=float, default=20.0, help="seconds over which the app's CPU is measured")
    parser.add_argument("--poll", type=float, default=0.5, help="the dashboard's poll interval (s)")
    parser.add_argument("--nvml-samples", type=int, default=200)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict = {"command": " ".join(["python", *sys.argv]), "host": platform.node()}
    record["nvml"] = nvml_cost(args.nvml_samples)
    preset, _ = load_preset(args.preset, ["loss.impl=chunked", *args.overrides])
    run = supervisor.prepare_run(preset, [], args.runs_dir).path
    supervisor.spawn_detached(run)
    try:
        record.update(asyncio.run(drive(run, args.out, args.watch, args.poll)))
    finally:
        supervisor.stop_run(run, force=True)
    steps = steps_of(run)
    record["steps"] = [
        {k: r.get(k) for k in ("step", "loss_impl", "step_time", "reward", "loss") if k in r} for r in steps
    ]
    gpus = Monitor().sample().gpus
    record["gpu"] = gpus[0].name if gpus else None
    (args.out / "dashboard-gpu.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    nv, cpu = record["nvml"], record.get("app_cpu", {})
    print(f"NVML: {nv['ms_per_gpu_median']:.3f} ms per GPU per sample (median of {nv['samples']}, {nv['gpus']} GPU)")
    if cpu:
        print(
            f"app CPU while watching: {cpu['percent_of_one_core']:.1f}% of one core at "
            f"{cpu['refresh_hz']:.2f} Hz refresh over {cpu['window_s']:.0f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
