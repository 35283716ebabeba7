"""The newcomer's path on a real tiny-cpu run (slow-ish, < 60 s): presets → s → dashboard moves →
t switches the loss implementation (marked on the charts) → x stops the run gracefully."""

from __future__ import annotations

import json
import time

import pytest
from ui_support import SIZE, plain, wait_for

from grpo_tui.dashboard.screens.dashboard import DashboardScreen

pytestmark = pytest.mark.slow


async def test_tiny_cpu_start_watch_toggle_stop(app_factory, runs_dir) -> None:
    from grpo_tui.dashboard.monitor import Monitor

    app = app_factory(monitor=Monitor(), clock=time.time, poll_interval=0.3)  # the real launcher
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.selected_name == "tiny-cpu")
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), timeout=30)
        screen = app.screen
        run = screen.run_path
        assert run.parent == runs_dir and (run / "config.toml").is_file()
        # training starts (model build + accelerate launch) and the dashboard follows it
        await wait_for(pilot, lambda: screen.view is not None and screen.view.progress.step >= 3, timeout=45)
        assert screen.view.status == "running" and screen.view.charts.reward[0]
        assert "RAM" in plain(screen.query_one("#gpu-panel")) or "GPU0" in plain(screen.query_one("#gpu-panel"))
        before = screen.view.loss_impl
        await pilot.press("t")
        await wait_for(pilot, lambda: screen.view.charts.switches, timeout=30)
        assert screen.view.loss_impl != before
        switch = screen.view.charts.switches[0]
        assert f"at step {switch}" in screen.view.switch_label
        await pilot.press("x", "y")
        await wait_for(pilot, lambda: screen.view.status == "stopped", timeout=30)
    events = [json.loads(line).get("event") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "loss_impl_switch" in events and "stop_requested" in events and events[-1] == "finish"
