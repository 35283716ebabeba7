"""Shared helpers for the UI tests (imported by conftest and the test modules)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from grpo_tui.dashboard.monitor import GpuProcess, GpuSnapshot, HostSnapshot, MonitorSnapshot
from grpo_tui.tools.demo import T0

# The recorded run's clock: 20 s after its last step, so elapsed/ETA are fixed in the render.
FIXED_NOW = T0 + 300.0
SIZE = (150, 48)


class FakeMonitor:
    """Returns the same snapshot every time (deterministic renders); counts calls."""

    def __init__(self, snapshot: MonitorSnapshot) -> None:
        self.snapshot = snapshot
        self.calls: list[tuple[int, ...]] = []

    def sample(self, pids=()) -> MonitorSnapshot:  # mirrors Monitor.sample
        self.calls.append(tuple(pids))
        return self.snapshot


def host_only_snapshot() -> MonitorSnapshot:
    host = HostSnapshot(cpu_pct=37.0, ram_used_mib=6144.0, ram_total_mib=24064.0, process_rss_mib={424242: 912.0})
    return MonitorSnapshot(
        time=FIXED_NOW,
        gpus=(),
        host=host,
        nvml_ok=False,
        note="NVML unavailable: no NVIDIA driver (libnvidia-ml not found)",
    )


def gpu_snapshot(pids: tuple[int, ...] = (424242, 424243)) -> MonitorSnapshot:
    gpus = tuple(
        GpuSnapshot(
            index=i,
            name="NVIDIA H200",
            memory_used_mib=52000.0 + 1000 * i,
            memory_total_mib=143771.0,
            utilization_pct=87.0 - i,
            temperature_c=61.0,
            power_w=412.0,
            processes=(GpuProcess(pid=pid, used_mib=51200.0 + 1000 * i),),
        )
        for i, pid in enumerate(pids)
    )
    host = HostSnapshot(cpu_pct=12.0, ram_used_mib=40000.0, ram_total_mib=515000.0, process_rss_mib={})
    return MonitorSnapshot(time=FIXED_NOW, gpus=gpus, host=host, nvml_ok=True, note="")


def mark_running(run: Path, pid: int | None = None) -> None:
    """Make run.json say a live process (this test's, by default) runs the run."""
    import psutil

    pid = pid or os.getpid()
    meta = json.loads((run / "run.json").read_text())
    meta.update(
        status="running",
        pid=pid,
        pid_started=psutil.Process(pid).create_time(),
        started=time.time(),
        pgid=None,
        child_pid=None,
        child_started=None,
        exit_code=None,
    )
    (run / "run.json").write_text(json.dumps(meta))


async def wait_for(pilot, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Pause the pilot until `predicate()` holds (workers run in threads)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.05)


async def wait_for_exit(app, timeout: float = 10.0) -> None:
    """Wait until the app has quit. Polls the event loop, not the pilot: `pilot.pause` waits for the screen to
    drain its messages, and a screen that is being torn down may never do so (it times out after 30 s)."""
    deadline = time.monotonic() + timeout
    while app.is_running:
        if time.monotonic() > deadline:
            raise AssertionError("the app did not quit in time")
        await asyncio.sleep(0.05)


def plain(widget) -> str:
    """What a Static (or Label) shows, as plain text (Rich renderables rendered at 200 columns)."""
    from rich.console import Console

    content = widget.content
    if isinstance(content, str):
        return content
    console = Console(width=200, record=True, color_system=None, file=open(os.devnull, "w"))
    console.print(content)
    return console.export_text()
