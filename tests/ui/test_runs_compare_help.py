"""Runs list, compare view, help and the app-level bindings."""

from __future__ import annotations

import pytest
from ui_support import SIZE, plain, wait_for

from grpo_tui.app import binding_owners
from grpo_tui.screens.compare import CompareScreen, OverlayChart
from grpo_tui.screens.dashboard import DashboardScreen
from grpo_tui.screens.help import HelpScreen, _bindings_of
from grpo_tui.screens.presets import PresetScreen
from grpo_tui.screens.runs import RunsScreen
from grpo_tui.widgets.runs_table import RunsTable

pytestmark = pytest.mark.anyio


async def test_runs_screen_lists_status_and_opens_a_run(app_factory, recorded_run, second_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("r")
        assert isinstance(app.screen, RunsScreen)
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 2)
        assert [r.path for r in table.runs] == [second_run, recorded_run]  # newest first
        assert {r.status for r in table.runs} == {"finished"}
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen))
        assert app.screen.run_path == recorded_run
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)
        await pilot.press("f5")
        await pilot.press("escape")
        assert isinstance(app.screen, PresetScreen)


async def test_mark_two_runs_and_compare_them(app_factory, recorded_run, second_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("r")
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 2)
        await pilot.press("c")  # nothing marked yet: only one run selected, refused
        assert isinstance(app.screen, RunsScreen)
        await pilot.press("space", "down", "space")
        assert table.marked == [second_run, recorded_run]
        await pilot.press("c")
        assert isinstance(app.screen, CompareScreen)
        await wait_for(pilot, lambda: app.screen.data is not None)
        text = plain(app.screen.query_one("#compare-table"))
        for row in ("peak · generation", "peak · loss", "step time (median)", "final reward", "loss impl"):
            assert row in text
        assert "chunked → naive" in text
        a, b = app.screen.data.table.rows
        assert a.steps == b.steps == 300
        chart = app.screen.query_one("#compare-reward", OverlayChart)
        assert chart.size.width > 0
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)


async def test_compare_screen_picks_runs_itself(app_factory, recorded_run, second_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("c")
        assert isinstance(app.screen, CompareScreen)
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 2)
        await pilot.press("enter")  # fewer than two marked: a warning, no load
        assert app.screen.data is None
        await pilot.press("space", "down", "space", "enter")
        await wait_for(pilot, lambda: app.screen.data is not None)
        assert app.screen.data.names == (second_run.name, recorded_run.name)


async def test_question_mark_lists_every_binding_with_its_id(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = plain(app.screen.query_one("#help-table"))
        for _, owner in binding_owners():
            for binding in _bindings_of(owner):
                assert binding.id and binding.id in text, binding
                assert binding.description
        await pilot.press("escape")
        assert isinstance(app.screen, PresetScreen)


def test_every_binding_has_a_unique_id_and_a_description() -> None:
    ids = [b.id for _, owner in binding_owners() for b in _bindings_of(owner)]
    assert all(ids) and len(ids) == len(set(ids))


async def test_q_quits_at_once_without_live_runs(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
