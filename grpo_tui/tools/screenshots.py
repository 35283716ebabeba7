"""`grpo-tui screenshots`: SVG (and PNG when a headless chromium is installed) of the presets screen,
a live dashboard mid-run and the compare view, taken from real runs.

By default two real `tiny-cpu` runs are trained on this machine (one starting with `chunked` and
switched to the baseline mid-run through control.json, exactly as the `t` key does; one on the
baseline throughout); the dashboard is captured while the first is still training. `--recorded`
uses the recorded fixture (`grpo_tui.tools.demo`) instead and says so in the output.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from grpo_tui.runs.metrics import MetricsTail, is_step

if TYPE_CHECKING:  # demo is imported only for --recorded
    from grpo_tui.tools.demo import LiveWriter

SIZE = (150, 48)
SHOTS = ("presets", "dashboard", "compare")


def _wait_step(run: Path, step: int, timeout: float) -> int:
    """Block until the run logged `step` (returns the last step seen)."""
    tail, last, deadline = MetricsTail(run / "metrics.jsonl"), 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in tail.read_new():
            if is_step(record):
                last = int(record["step"])
            if record.get("event") in ("finish", "error", "oom"):
                return last
        if last >= step:
            return last
        time.sleep(0.2)
    return last


def real_runs(workdir: Path, steps: int, switch_at: int, started: list[Path]) -> tuple[Path, Path]:
    """Start run A (chunked → baseline at `switch_at`) and run B (baseline); return once A is past
    the switch, B finished. A keeps training (the dashboard is captured live)."""
    from grpo_tui.config.store import load_preset
    from grpo_tui.launch import supervisor
    from grpo_tui.runs.folder import RunDir

    preset, _ = load_preset("tiny-cpu")
    runs = workdir / "runs"
    baseline = preset.loss.baseline
    run_b = supervisor.prepare_run(preset, [f"loss.impl={baseline}", f"grpo.max_steps={steps // 2}"], runs)
    supervisor.spawn_detached(run_b.path)
    started.append(run_b.path)
    print(f"run B ({baseline}): {run_b.path}", flush=True)
    _require(run_b.path, _wait_step(run_b.path, steps // 2, timeout=600), steps // 2)
    time.sleep(1.0)  # a new run folder name needs a new second
    run_a = supervisor.prepare_run(preset, ["loss.impl=chunked", f"grpo.max_steps={steps}"], runs)
    supervisor.spawn_detached(run_a.path)
    started.append(run_a.path)
    print(f"run A (chunked → {baseline}): {run_a.path}", flush=True)
    _require(run_a.path, _wait_step(run_a.path, switch_at, timeout=600), switch_at)
    RunDir(run_a.path).request(loss_impl=baseline)
    target = switch_at + (steps - switch_at) // 4
    _require(run_a.path, _wait_step(run_a.path, target, timeout=600), target)
    return run_a.path, run_b.path


def _require(run: Path, reached: int, wanted: int) -> None:
    """Stop (keeping the screenshots already committed) when a real run died before `wanted`."""
    if reached < wanted:
        tail = (run / "stdout.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise SystemExit(
            f"screenshots: {run.name} stopped at step {reached} (< {wanted}): "
            f"{tail[0] if tail else 'see its stdout.log'}; no screenshot written"
        )


def recorded_runs(workdir: Path) -> tuple[Path, Path, LiveWriter]:
    """The recorded fixture: A switched chunked → naive at step 150 (still live), B naive."""
    import psutil

    from grpo_tui.tools.demo import LiveWriter, make_run

    runs = workdir / "runs"
    # A names this process as its supervisor, so it reads as live while the writer appends steps.
    a = make_run(
        runs / "20260101-010000-tiny-cpu",
        steps=200,
        max_steps=400,
        switch_step=150,
        finished=False,
        pid=os.getpid(),
        pid_started=psutil.Process().create_time(),
    ).path
    b = make_run(runs / "20260101-000000-tiny-cpu", steps=400, loss_impl="naive", seed=3).path
    writer = LiveWriter(a, hz=4.0, start_step=201, loss_impl="naive").start()
    return a, b, writer


async def capture(workdir: Path, run_a: Path, run_b: Path, out: Path, note: str) -> list[Path]:
    """Drive the app headless at 150x48 and save one SVG per screen."""
    from grpo_tui.dashboard.app import create_app
    from grpo_tui.dashboard.screens.compare import CompareScreen
    from grpo_tui.dashboard.screens.dashboard import DashboardScreen

    app = create_app(runs_dir=Path("runs"), auto_attach=False, poll_interval=0.5)
    app.title = f"grpo-tui{note}"
    saved: list[Path] = []

    async def settle(pilot, predicate, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate() and time.monotonic() < deadline:
            await pilot.pause(0.1)

    def shot(name: str) -> None:
        saved.append(Path(app.save_screenshot(f"{name}.svg", str(out))))

    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        await settle(pilot, lambda: len(screen.query_one("#runs-table").runs) == 2)
        await settle(pilot, lambda: "checking" not in str(screen.query_one("#preset-checks").content))
        await pilot.pause(0.3)
        shot("presets")
        app.open_run(run_a)
        await settle(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 4)
        await pilot.pause(0.5)
        shot("dashboard")
        await pilot.press("escape")
        app.action_compare(run_a, run_b)
        await settle(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.data is not None)
        await pilot.pause(0.5)
        shot("compare")
    return saved


def to_png(svg: Path) -> Path | None:
    """Render an SVG with headless chromium (the only renderer that draws Textual SVGs faithfully)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        return None
    import re

    box = re.search(r'viewBox="[\d.]+ [\d.]+ ([\d.]+) ([\d.]+)"', svg.read_text(encoding="utf-8"))
    width, height = (int(float(v) + 0.999) for v in box.groups()) if box else (1848, 1222)
    png = svg.with_suffix(".png")
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            svg.resolve().as_uri(),
        ],
        check=False,
        capture_output=True,
        timeout=120,
    )
    return png if png.exists() else None


def main(argv: list[str] | None = None) -> int:
    # The docstring's whole first paragraph: its first line alone stops mid-sentence.
    summary = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="grpo-tui screenshots", description=summary)
    parser.add_argument("--out", type=Path, default=Path("screenshots"), help="folder for the SVG/PNG files")
    parser.add_argument("--recorded", action="store_true", help="use the recorded fixture instead of real runs")
    parser.add_argument("--steps", type=int, default=600, help="steps of the real run captured live")
    parser.add_argument("--keep", action="store_true", help="keep the temporary run folders")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="grpo-tui-shots-"))
    cwd = Path.cwd()
    os.chdir(workdir)  # the app shows run paths relative to here
    run_a = None
    writer: LiveWriter | None = None
    started: list[Path] = []  # real runs to stop on the way out, whatever happens
    try:
        if args.recorded:
            print("screenshots from the RECORDED fixture (grpo_tui.tools.demo), not a real run", flush=True)
            run_a, run_b, writer = recorded_runs(workdir)
            note = " (recorded fixture)"
        else:
            run_a, run_b = real_runs(workdir, args.steps, args.steps // 4, started)
            note = ""
        saved = asyncio.run(capture(workdir, run_a, run_b, out, note))
    finally:
        os.chdir(cwd)
        if writer is not None:
            writer.stop()
        if started:
            from grpo_tui.launch import supervisor

            for run in started:
                supervisor.stop_run(run, force=True)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for svg in saved:
        png = to_png(svg)
        print(f"{svg}" + (f"\n{png}" if png else "  (no chromium: SVG only)"))
    return 0 if len(saved) == len(SHOTS) else 1


if __name__ == "__main__":
    sys.exit(main())
