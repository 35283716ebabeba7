"""Runs list, compare view, help and the app-level bindings."""

from __future__ import annotations

import os

import pytest
from rich.console import Console
from ui_support import SIZE, plain, wait_for, wait_for_exit

from grpo_tui.dashboard.app import binding_owners
from grpo_tui.dashboard.screens.compare import CompareScreen, OverlayChart
from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.dashboard.screens.help import HelpScreen, bindings_of, bindings_table, key_text
from grpo_tui.dashboard.screens.presets import PresetScreen
from grpo_tui.dashboard.screens.runs import RunsScreen
from grpo_tui.dashboard.widgets.runs_table import RunsTable


async def runs_table(pilot, key: str) -> RunsTable:
    """Press `key` on the start screen and wait until its runs table lists both recorded runs."""
    await pilot.pause()
    await pilot.press(key)
    table = pilot.app.screen.query_one(RunsTable)
    await wait_for(pilot, lambda: len(table.runs) == 2)
    return table


async def test_runs_screen_lists_status_and_opens_a_run(app_factory, recorded_run, second_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        table = await runs_table(pilot, "r")
        assert isinstance(app.screen, RunsScreen)
        assert [r.path for r in table.runs] == [second_run, recorded_run]  # newest first
        assert {r.status for r in table.runs} == {"finished"}
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        assert app.screen.run_path == recorded_run
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)
        await pilot.press("f5")
        await pilot.press("escape")
        assert isinstance(app.screen, PresetScreen)


async def test_mark_two_runs_and_compare_them(app_factory, recorded_run, second_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        table = await runs_table(pilot, "r")
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
        await runs_table(pilot, "c")
        assert isinstance(app.screen, CompareScreen)
        await pilot.press("enter")  # fewer than two marked: a warning, no load
        assert app.screen.data is None
        await pilot.press("space", "down", "space", "enter")
        await wait_for(pilot, lambda: app.screen.data is not None)
        assert app.screen.data.names == (second_run.name, recorded_run.name)


def _squeezed_lines(text: str) -> set[str]:
    return {" ".join(line.split()) for line in text.splitlines()}


async def test_question_mark_lists_every_binding_without_internal_ids(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=(80, 24)) as pilot:  # the footer hides keys at 80 columns; help lists them
        await pilot.pause()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = plain(app.screen.query_one("#help-table"))
        rows = _squeezed_lines(text)
        for where, owner in binding_owners():
            for binding in bindings_of(owner):
                assert binding.description, binding
                assert f"{where} {key_text(binding)} {binding.description}" in rows, binding
                assert binding.id and binding.id not in text, binding  # ids are for code, not users
        await pilot.press("escape")
        assert isinstance(app.screen, PresetScreen)


def _classes_with_bindings() -> set[type]:
    """Every screen, app and widget class in the dashboard package that declares keys of its own."""
    import importlib
    import inspect
    import pkgutil

    from textual.dom import DOMNode

    import grpo_tui.dashboard as package

    found: set[type] = set()
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, DOMNode) and vars(cls).get("BINDINGS"):
                found.add(cls)
    return found


def test_the_help_screen_lists_every_key_of_every_screen() -> None:
    """A key added to any screen (or a new screen with keys) shows in `?` without anyone remembering to."""
    owners = binding_owners()
    declared = _classes_with_bindings()
    assert {PresetScreen, DashboardScreen, RunsScreen, HelpScreen} <= declared  # the search finds screens
    missing = declared - {owner for _, owner in owners}
    assert not missing, f"not on the help screen: {sorted(c.__qualname__ for c in missing)}"
    console = Console(width=300, record=True, color_system=None, file=open(os.devnull, "w"))
    console.print(bindings_table(owners))
    rows = _squeezed_lines(console.export_text())
    for where, owner in owners:
        for binding in bindings_of(owner):
            assert f"{where} {key_text(binding)} {binding.description}" in rows, binding


def test_every_binding_has_a_unique_id_and_a_description() -> None:
    ids = [b.id for _, owner in binding_owners() for b in bindings_of(owner)]
    assert all(ids) and len(ids) == len(set(ids))


async def test_q_quits_at_once_without_live_runs(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await wait_for_exit(app)


def test_the_ui_never_imports_torch() -> None:
    """Start-up stays fast: the app, every screen and the pre-launch checks import no torch/transformers."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import grpo_tui.dashboard.app\n"
        "from grpo_tui.dashboard.app import binding_owners\n"
        "binding_owners()\n"
        "import grpo_tui.dashboard.feed, grpo_tui.tools.screenshots\n"
        "from grpo_tui.config.checks import check_preset\n"
        "from grpo_tui.config.store import load_preset\n"
        "check_preset(load_preset('tiny-cpu')[0])\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'accelerate') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("key", "answer"), [("y", True), ("enter", True), ("n", False), ("escape", False)])
async def test_confirm_dialog_keys(app_factory, key: str, answer: bool) -> None:
    from grpo_tui.dashboard.screens.confirm import ConfirmScreen

    app = app_factory()
    answers: list[bool] = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.push_screen(ConfirmScreen("Stop this run?"), answers.append)
        await pilot.pause()
        await pilot.press(key)
        await wait_for(pilot, lambda: answers == [answer])
        assert isinstance(app.screen, PresetScreen)


async def test_presets_c_and_f5(app_factory, tmp_path) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        user = tmp_path / "user-presets"
        user.mkdir()
        (user / "extra.toml").write_text('description = "added while the app runs"\n')
        assert "extra" not in [e.name for e in app.screen.entries]
        await pilot.press("f5")
        assert "extra" in [e.name for e in app.screen.entries]
        assert app.screen.selected_name == "tiny-cpu"  # the selection survives a reload
        await pilot.press("c")
        assert isinstance(app.screen, CompareScreen)


async def test_a_click_on_a_run_opens_it(app_factory, recorded_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("r")
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 1)
        await pilot.click(RunsTable, offset=(10, 1))  # the first row (row 0 is the header)
        await pilot.click(RunsTable, offset=(10, 1))
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        assert app.screen.run_path == recorded_run
