"""The app as a user runs it, in a real terminal (tmux), measured from outside (not a test).

    python benchmarks/bench_ui_live.py                 # writes benchmarks/results/ui-live-cpu/ui-live.json (the raw file beside result.json)

1. live: `python -m grpo_tui.dashboard.app --open RUN` in a 150x48 tmux pane while a separate process
   (`python -m grpo_tui.tools.demo live`) appends steps at --hz. For --seconds: the app process's CPU
   (user + system, all threads, from psutil) as % of one core, and how often the step counter on
   screen changes (tmux capture-pane at 20 Hz), i.e. the redraw rate a user sees.
   Target: >= 2 Hz at < 10% of one core.
2. open: a finished run with --steps logged steps (100,000 by default) in the runs list; the time
   from pressing Enter on it to its dashboard showing the last step on screen. Target: < 1 s.
   (benchmarks/bench_ui.py measures the same in-process, headless, split into its parts.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from grpo_tui.tools.demo import make_run

ROOT = Path(__file__).resolve().parents[1]

SIZE = (150, 48)
STEP_RE = re.compile(r"step (\d+)/")


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def start_app(session: str, argv: list[str], cwd: Path) -> psutil.Process:
    """The app in its own tmux pane; returns its process (the pane runs it directly, via exec)."""
    command = "exec " + shlex.join([sys.executable, "-m", "grpo_tui.dashboard.app", *argv])
    tmux("new-session", "-d", "-s", session, "-x", str(SIZE[0]), "-y", str(SIZE[1]), "-c", str(cwd), command)
    return psutil.Process(int(tmux("display", "-p", "-t", session, "#{pane_pid}").strip()))


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def wait_screen(session: str, pattern: str, timeout: float) -> float | None:
    """Seconds until `pattern` is on screen (polling every 10 ms), or None."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if re.search(pattern, screen(session)):
            return time.perf_counter() - start
        time.sleep(0.01)
    return None


def bench_live(work: Path, seconds: float, hz: float, base_steps: int) -> dict[str, Any]:
    run = make_run(
        work / f"live-{base_steps}",
        steps=base_steps,
        finished=False,
        max_steps=100_000,
        completions=base_steps <= 20_000,
    ).path
    writer = subprocess.Popen(
        [sys.executable, "-m", "grpo_tui.tools.demo", "live", str(run), "--hz", str(hz)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    meta = json.loads((run / "run.json").read_text())  # the writer plays the trainer: a live pid
    meta.update(pid=writer.pid, pid_started=psutil.Process(writer.pid).create_time(), child_pid=None)
    (run / "run.json").write_text(json.dumps(meta))
    session = f"bench-live-{os.getpid()}"
    try:
        app = start_app(session, ["--open", str(run), "--runs-dir", str(run.parent)], work)
        if wait_screen(session, r"● running\s+step \d+/", 60) is None:
            return {"result": "n/a (the dashboard did not show within 60 s)", "screen": screen(session)}
        time.sleep(2.0)  # let start-up work (imports, the first full read) finish
        cpu0, wall0 = sum(app.cpu_times()[:2]), time.perf_counter()
        seen, changes, last = [], 0, None
        while time.perf_counter() - wall0 < seconds:
            match = STEP_RE.search(screen(session))
            if match and match.group(1) != last:
                changes += last is not None
                last = match.group(1)
                seen.append(int(last))
            time.sleep(0.05)
        wall = time.perf_counter() - wall0
        cpu = sum(app.cpu_times()[:2]) - cpu0
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
        writer.terminate()
        writer.wait()
    return {
        "base_steps": base_steps,
        "writer_hz": hz,
        "seconds": round(wall, 2),
        "screen_updates_per_s": round(changes / wall, 2),
        "steps_seen": [seen[0], seen[-1]] if seen else [],
        "ui_process_cpu_pct_of_one_core": round(100 * cpu / wall, 1),
        "note": "capture-pane's own cost is in tmux, not the app; the step counter changes at most at the writer's rate",
        "target": ">= 2 Hz redraw at < 10% of one core",
    }


def bench_open(work: Path, steps: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    run = make_run(work / "runs" / f"20260101-000000-long-{steps}", steps=steps, completions=False).path
    generate_s = time.perf_counter() - t0
    session = f"bench-open-{os.getpid()}"
    try:
        start_app(session, ["--runs-dir", str(run.parent)], work)
        if wait_screen(session, re.escape(run.name), 60) is None:
            return {"result": "n/a (the runs list did not show the run)", "screen": screen(session)}
        time.sleep(1.0)
        tmux("send-keys", "-t", session, "r")  # the runs screen (its table has focus)
        time.sleep(1.0)
        tmux("send-keys", "-t", session, "Enter")
        first = wait_screen(session, rf"step {steps}/", 30)
        full = wait_screen(session, r"● finished", 30) if first is not None else None
        loaded = None
        if first is not None:  # until the whole history is drawn (the title's loading note is gone)
            start = time.perf_counter()
            while "loading the full history" in screen(session) and time.perf_counter() - start < 30:
                time.sleep(0.01)
            loaded = first + (time.perf_counter() - start)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    size_mb = (run / "metrics.jsonl").stat().st_size / 1e6
    return {
        "steps": steps,
        "metrics_mb": round(size_mb, 1),
        "generate_s": round(generate_s, 1),
        "enter_to_dashboard_s": None if first is None else round(first, 3),
        "enter_to_full_history_s": None if loaded is None else round(loaded, 3),
        "finished_shown": full is not None,
        "target": "dashboard open < 1 s",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--hz", type=float, default=4.0, help="steps per second the fake trainer writes")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "ui-live-cpu" / "ui-live.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "command": "python benchmarks/bench_ui_live.py " + shlex.join(argv or sys.argv[1:]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        },
    }
    with tempfile.TemporaryDirectory(prefix="grpo-tui-bench-") as tmp:
        work = Path(tmp)
        results["live"] = [bench_live(work, args.seconds, args.hz, base) for base in (50, 20_000)]
        print("live:", json.dumps(results["live"]), flush=True)
        results["open"] = bench_open(work, args.steps)
        print("open:", json.dumps(results["open"]), flush=True)
    results["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
