"""Snapshot tests (pytest-textual-snapshot) of the main screens at 150x48, and of the presets,
dashboard and help screens at 80x24, 120x40 and 200x60 too (small terminals stack and shrink
panels: app.tcss), from recorded runs with a fixed clock and a fixed monitor sample, so the SVGs
are byte-stable. Update with --snapshot-update, and look at each changed SVG."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from ui_support import SIZE, FakeMonitor, gpu_snapshot, plain, wait_for

from grpo_tui.dashboard.screens.compare import CompareScreen
from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.tools.demo import make_run


@pytest.fixture(autouse=True)
def _stable_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    # The launch command shows the interpreter's path: make it the same on every machine.
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")


def _factory(app_factory, **kwargs):
    # One poll only (poll_interval is long): the memory history never grows between frames.
    return app_factory(runs_dir=Path("runs"), poll_interval=3600.0, **kwargs)


# Terminal sizes a user may have: the smallest usable, common ones, and a big one.
SIZES = [pytest.param(size, id=f"{size[0]}x{size[1]}") for size in [(80, 24), (120, 40), SIZE, (200, 60)]]


@pytest.mark.parametrize("size", SIZES)
def test_presets_screen(snap_compare, app_factory, recorded_run, second_run, size) -> None:
    async def run_before(pilot) -> None:
        screen = pilot.app.screen
        await wait_for(pilot, lambda: len(screen.query_one("#runs-table").runs) == 2)
        await wait_for(pilot, lambda: "checking" not in str(screen.query_one("#preset-checks").content))

    assert snap_compare(_factory(app_factory), terminal_size=size, run_before=run_before)


def _open(run: Path):
    async def run_before(pilot) -> None:
        pilot.app.open_run(run)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, DashboardScreen) and pilot.app.screen.updates > 0)
        await pilot.pause(0.1)

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_dashboard_recorded_run_no_gpu(snap_compare, app_factory, recorded_run, size) -> None:
    assert snap_compare(_factory(app_factory), terminal_size=size, run_before=_open(Path("runs") / recorded_run.name))


@pytest.mark.parametrize("size", [SIZES[0], SIZES[2]])
def test_dashboard_two_gpus(snap_compare, app_factory, runs_dir, size) -> None:
    run = make_run(
        runs_dir / "20260101-020000-qwen3-0.6b-gsm8k", steps=400, switch_step=250, n_gpus=2, preset="qwen3-0.6b-gsm8k"
    ).path
    app = _factory(app_factory, monitor=FakeMonitor(gpu_snapshot()))
    assert snap_compare(app, terminal_size=size, run_before=_open(Path("runs") / run.name))


def test_dashboard_completions_tab(snap_compare, app_factory, recorded_run) -> None:
    async def run_before(pilot) -> None:
        await _open(Path("runs") / recorded_run.name)(pilot)
        await pilot.press("2", "left_square_bracket")
        body = pilot.app.screen.query_one("#completions-body")
        await wait_for(
            pilot,
            lambda: "step 299" in plain(pilot.app.screen.query_one("#completions-head")) and "group 1/2" in plain(body),
        )
        await pilot.pause(0.2)

    assert snap_compare(_factory(app_factory), terminal_size=SIZE, run_before=run_before)


def test_compare_view(snap_compare, app_factory, recorded_run, second_run) -> None:
    async def run_before(pilot) -> None:
        pilot.app.action_compare(Path("runs") / recorded_run.name, Path("runs") / second_run.name)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, CompareScreen) and pilot.app.screen.data)
        await wait_for(pilot, lambda: len(pilot.app.screen.query_one("#compare-runs").runs) == 2)
        await pilot.pause(0.1)

    assert snap_compare(_factory(app_factory), terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("size", SIZES)
def test_help_screen(snap_compare, app_factory, size) -> None:
    async def run_before(pilot) -> None:
        screen = pilot.app.screen
        await wait_for(pilot, lambda: "checking" not in str(screen.query_one("#preset-checks").content))
        await pilot.press("question_mark")

    assert snap_compare(_factory(app_factory), terminal_size=size, run_before=run_before)
