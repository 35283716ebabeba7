"""Dashboard speed measurements (not tests): opening a long run, NVML sampling, a live run's redraw.

    python benchmarks/bench_ui.py                       # all, writes benchmarks/results/ui-cpu/ui.json (the raw file beside result.json)
    python benchmarks/bench_ui.py --only load nvml      # a subset
    python benchmarks/bench_ui.py --out /tmp/ui-gpu.json --steps 100000 --live-seconds 10

1. load: `load_run` of a generated 100,000-step run (target < 1 s), split into JSON decoding and
   the model's column building; `load_recent` (every event + the newest ~1 MB of steps, for a
   first view while the history loads); the first dashboard view (`DashboardFeed.poll`) when the
   UI is installed. Wall and CPU seconds: on a shared machine wall time includes waiting for a core.
2. nvml: `Monitor.sample()` cost per GPU (target < 1 ms); without NVML, the cost of the host-only path.
3. runs: finding the running runs among --runs run folders (the app's re-attach on start): the full
   `scan_runs` against `scan_live_runs`.
4. live: the app headless on a run that a separate process (`python -m grpo_tui.tools.demo live`) extends
   at --live-hz, for --live-seconds: dashboard updates per second, chart redraws per second and the
   UI process's CPU use (target >= 2 Hz at < 10% of one core). Also on top of a --steps-long run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_tui.dashboard.loading import load_recent, load_run
from grpo_tui.dashboard.monitor import Monitor
from grpo_tui.dashboard.state import RunState
from grpo_tui.runs import metrics
from grpo_tui.tools.demo import make_run

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn: Any, repeats: int) -> tuple[dict[str, float], Any]:
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {
        "wall_s_median": round(statistics.median(walls), 6),
        "wall_s_min": round(min(walls), 6),
        "cpu_s_median": round(statistics.median(cpus), 6),
    }, result


def bench_load(steps: int, repeats: int, work: Path) -> dict[str, Any]:
    run = make_run(work / f"long-{steps}", steps=steps, switch_step=steps // 2, completions=False)
    path = run.path / "metrics.jsonl"
    data = path.read_bytes()

    def decode() -> int:  # block by block, as load_run does, keeping nothing (no GC pressure from a huge list)
        return sum(len(block) for block in metrics.MetricsTail(path).read_blocks())  # the file is in the page cache

    parse, _ = _timed(decode, repeats)
    records = metrics.read_records(path)

    def build() -> RunState:
        state = RunState()
        for i in range(0, len(records), 2000):  # as load_run applies them: block by block
            state.apply(records[i : i + 2000])
        return state

    apply_t, _ = _timed(build, repeats)
    load, state = _timed(lambda: load_run(run.path), repeats)
    recent, quick = _timed(lambda: load_recent(run.path), repeats)
    out: dict[str, Any] = {
        "steps": len(state),
        "file_mb": round(len(data) / 1e6, 1),
        "decoder": getattr(metrics._DECODERS[0], "__module__", "?"),
        "load_run": load,
        "json_decode_only": parse,
        "columns_only": apply_t,
        "load_recent (first look: all events + newest steps)": {**recent, "steps_loaded": len(quick)},
        "target": "load_run < 1 s",
    }
    out["first_view"] = _first_view(run.path, repeats)
    out["feed_poll_per_new_step"] = _feed_poll(run.path)
    ds, _ = _timed(lambda: [state.downsampled(n, 400) for n in ("reward", "loss", "kl", "entropy")], 1)
    cached, _ = _timed(lambda: [state.downsampled(n, 400) for n in ("reward", "loss", "kl", "entropy")], repeats)
    out["downsample_4_series_first_ms"] = round(ds["wall_s_median"] * 1e3, 2)
    out["downsample_4_series_cached_ms"] = round(cached["wall_s_median"] * 1e3, 3)
    return out


def _first_view(run_path: Path, repeats: int) -> dict[str, Any] | str:
    """Time to the dashboard's first complete view (load + charts + alerts), if the UI is installed."""
    try:
        from grpo_tui.dashboard.feed import DashboardFeed
    except ImportError as exc:
        return f"n/a ({exc})"
    timing, _ = _timed(lambda: DashboardFeed(run_path, Monitor()).poll(), repeats)
    return timing


def _feed_poll(run_path: Path, polls: int = 20) -> dict[str, Any] | str:
    """The data side of one live update (tail, apply, alerts, downsampled charts) with one new step
    each time, after the whole history is loaded: the dashboard worker's CPU per update."""
    try:
        from grpo_tui.dashboard.feed import DashboardFeed
    except ImportError as exc:
        return f"n/a ({exc})"
    import random

    from grpo_tui.tools.demo import step_record

    feed = DashboardFeed(run_path, Monitor())
    for _ in range(10):  # first the recent steps, then the whole history
        if not feed.poll().partial:
            break
    rng, step, cpus = random.Random(3), feed.state.last_step, []
    with open(run_path / "metrics.jsonl", "a") as handle:
        for _ in range(polls):
            step += 1
            handle.write(json.dumps(step_record(step, rng)) + "\n")
            handle.flush()
            cpu = time.process_time()
            feed.poll()
            cpus.append(time.process_time() - cpu)
    return {
        "cpu_ms_median": round(statistics.median(cpus) * 1e3, 3),
        "cpu_ms_max": round(max(cpus) * 1e3, 3),
        "polls": polls,
    }


def bench_runs(count: int, repeats: int, work: Path) -> dict[str, Any]:
    """Finding the live runs among `count` run folders (two live, the rest finished), as the app does on
    start: the full `scan_runs` against `scan_live_runs`, which passes over recorded outcomes."""
    from grpo_tui.runs import listing

    folder = work / f"runs-{count}"
    for i in range(count):
        live = {"finished": False, "pid": os.getpid(), "pid_started": _create_time()} if i >= count - 2 else {}
        make_run(folder / f"20260101-{i:06d}-tiny-cpu", steps=200, **live)  # this process stands in for a live one
    out: dict[str, Any] = {"runs": count}
    for name in ("scan_runs", "scan_live_runs"):
        scan = getattr(listing, name, None)
        if scan is not None:
            timing, found = _timed(functools.partial(scan, folder), repeats)
            out[name] = {**timing, "running": sum(r.status == "running" for r in found)}
    return out


def bench_nvml(samples: int) -> dict[str, Any]:
    monitor = Monitor()
    first = time.perf_counter()
    snap = monitor.sample([os.getpid()])
    init_ms = (time.perf_counter() - first) * 1e3
    timing, snap = _timed(lambda: monitor.sample([os.getpid()]), samples)
    per_sample_ms = timing["wall_s_median"] * 1e3
    out: dict[str, Any] = {
        "nvml_ok": snap.nvml_ok,
        "gpus": len(snap.gpus),
        "note": snap.note,
        "first_sample_ms (includes nvmlInit)": round(init_ms, 3),
        "sample_ms_median": round(per_sample_ms, 4),
        "target": "< 1 ms per GPU",
    }
    if snap.gpus:
        out["per_gpu_ms"] = round(per_sample_ms / len(snap.gpus), 4)
        out["gpu_names"] = sorted({g.name or "?" for g in snap.gpus})
    else:
        out["per_gpu_ms"] = "n/a (no GPU)"
        out["host_only_sample_ms"] = round(per_sample_ms, 4)
    monitor.close()
    return out


def bench_live(seconds: float, hz: float, base_steps: int, work: Path) -> dict[str, Any]:
    """The app headless on a growing run; needs the Textual app (grpo_tui.dashboard.app)."""
    try:
        from grpo_tui.dashboard.app import GrpoTuiApp
        from grpo_tui.dashboard.screens.dashboard import DashboardScreen
    except ImportError as exc:
        return {"result": f"n/a (the app is not importable: {exc})"}
    run = make_run(
        work / f"live-{base_steps}",
        steps=base_steps,
        finished=False,
        pid=os.getpid(),
        pid_started=_create_time(),
        completions=base_steps <= 20_000,
    )
    writer = subprocess.Popen(
        [sys.executable, "-m", "grpo_tui.tools.demo", "live", str(run.path), "--hz", str(hz)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        return asyncio.run(_drive(GrpoTuiApp, DashboardScreen, run.path, seconds, hz, base_steps))
    finally:
        writer.terminate()
        writer.wait()


def _create_time() -> float:
    import psutil

    return psutil.Process(os.getpid()).create_time()


async def _drive(
    app_cls: Any, screen_cls: Any, run_path: Path, seconds: float, hz: float, base_steps: int
) -> dict[str, Any]:
    app = app_cls(runs_dir=run_path.parent, open_run=run_path, auto_attach=False)
    opened = time.perf_counter()
    async with app.run_test(size=(160, 50)) as pilot:
        screen = None
        while time.perf_counter() - opened < 60:
            screen = app.screen if isinstance(app.screen, screen_cls) else None
            if screen is not None and getattr(screen, "updates", 0) > 0:
                break
            await pilot.pause(0.02)
        if screen is None:
            return {"result": "n/a (the dashboard did not open within 60 s)"}
        first_view_s = time.perf_counter() - opened
        updates0, gen0 = screen.updates, getattr(screen, "_drawn_generation", 0)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        updates, gens = screen.updates - updates0, getattr(screen, "_drawn_generation", 0) - gen0
    return {
        "base_steps": base_steps,
        "writer_hz": hz,
        "seconds": round(wall, 2),
        "time_to_first_view_s": round(first_view_s, 3),
        "dashboard_updates_per_s": round(updates / wall, 2),
        "chart_redraws_per_s": round(gens / wall, 2),
        "ui_process_cpu_pct_of_one_core": round(100 * cpu / wall, 1),
        "target": ">= 2 Hz redraw at < 10% of one core",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="*", choices=("load", "nvml", "live", "runs"), default=("load", "nvml", "live", "runs")
    )
    parser.add_argument("--steps", type=int, default=100_000, help="logged steps of the long run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nvml-samples", type=int, default=200)
    parser.add_argument("--runs", type=int, default=200, help="run folders for the live-runs lookup")
    parser.add_argument("--live-seconds", type=float, default=10.0)
    parser.add_argument("--live-hz", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ui-cpu" / "ui.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "command": "python "
        + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        work = Path(tmp)
        if "load" in args.only:
            results["load"] = bench_load(args.steps, args.repeats, work)
            print("load:", json.dumps(results["load"]), flush=True)
        if "nvml" in args.only:
            results["nvml"] = bench_nvml(args.nvml_samples)
            print("nvml:", json.dumps(results["nvml"]), flush=True)
        if "runs" in args.only:
            results["runs"] = bench_runs(args.runs, args.repeats, work)
            print("runs:", json.dumps(results["runs"]), flush=True)
        if "live" in args.only:
            results["live"] = [bench_live(args.live_seconds, args.live_hz, base, work) for base in (50, args.steps)]
            print("live:", json.dumps(results["live"]), flush=True)
    results["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
