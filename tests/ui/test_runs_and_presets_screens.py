"""The app's runs and presets screens: live runs lists, a stream's end judged at once, the runs table's
columns, editing / overwriting / deleting / renaming user presets, the editor's cross-field checks, and words."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList
from ui_support import SIZE, mark_running, plain, wait_for

from grpo_tui.config import store
from grpo_tui.config.preset_admin import rename_user_preset
from grpo_tui.config.schema import PresetError
from grpo_tui.dashboard.paths import shown_path
from grpo_tui.dashboard.runs_watch import RunsWatcher
from grpo_tui.dashboard.screens.confirm import ConfirmScreen
from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.dashboard.screens.preset_editor import PresetEditorScreen
from grpo_tui.dashboard.screens.presets import PresetScreen
from grpo_tui.dashboard.screens.rename import RenamePresetScreen
from grpo_tui.dashboard.screens.runs import RunsScreen
from grpo_tui.dashboard.widgets.runs_table import RunsTable
from grpo_tui.runs.status import judge
from grpo_tui.tools.demo import make_run, step_record


def _append_step(run: Path, step: int) -> None:
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(step_record(step, random.Random(step))) + "\n")


def _append_event(run: Path, **record: object) -> None:
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


# ---- 4: live lists, the stream's end wins -------------------------------------------------------
def test_a_finish_in_the_stream_wins_over_a_live_supervisor(runs_dir: Path) -> None:
    run = make_run(runs_dir / "r", steps=5, finished=True, status="running").path
    mark_running(run)  # the supervisor (this process) still lives: it writes run.json seconds later
    assert judge(run).state == "finished"
    stopped = make_run(runs_dir / "s", steps=5, finished=False, status="running").path
    mark_running(stopped)
    _append_event(stopped, event="stop_requested", step=5)
    assert judge(stopped).state == "running"  # a request is not an end
    _append_event(stopped, event="finish", step=5, stopped=True)
    assert judge(stopped).state == "stopped"


def test_the_watcher_rereads_only_changed_runs(runs_dir: Path) -> None:
    make_run(runs_dir / "20260101-000000-a", steps=5)
    b = make_run(runs_dir / "20260101-000001-b", steps=5).path
    watcher = RunsWatcher()
    assert len(watcher.scan(runs_dir) or []) == 2 and watcher.reads == 2
    assert watcher.scan(runs_dir) is None and watcher.reads == 2  # nothing changed: nothing read
    _append_step(b, 6)
    runs = watcher.scan(runs_dir)
    assert runs is not None and watcher.reads == 3
    assert {r.name: r.steps for r in runs} == {"20260101-000000-a": 5, "20260101-000001-b": 6}


async def test_the_runs_lists_follow_a_live_run_without_f5(app_factory, runs_dir: Path) -> None:
    run = make_run(runs_dir / "20260101-000000-tiny-cpu", steps=5, finished=False, status="running").path
    mark_running(run)
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 1 and table.runs[0].steps == 5)
        _append_step(run, 6)
        await wait_for(pilot, lambda: table.runs[0].steps == 6, timeout=5)
        await pilot.press("r")
        assert isinstance(app.screen, RunsScreen)
        runs_table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: runs_table.runs and runs_table.runs[0].steps == 6)
        _append_event(run, event="finish", step=6)
        await wait_for(pilot, lambda: runs_table.runs[0].status == "finished", timeout=5)


async def test_the_dashboard_shows_a_finish_at_once(app_factory, runs_dir: Path) -> None:
    run = make_run(runs_dir / "20260101-000000-tiny-cpu", steps=5, finished=False, status="running").path
    mark_running(run)
    app = app_factory(poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.view is not None)
        screen = app.screen
        assert screen.view.status == "running"
        _append_event(run, event="finish", step=5)
        # Within a few polls, not at the next 2-second liveness check (the supervisor still lives).
        await wait_for(pilot, lambda: screen.view.status == "finished", timeout=1.0)


# ---- 5: the runs table's columns ---------------------------------------------------------------
async def test_the_runs_table_shows_loss_reward_and_impl(app_factory, recorded_run: Path) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 1)
        labels = [str(c.label) for c in table.columns.values()]
        assert labels == ["", "run", "preset", "status", "step", "last reward", "loss", "impl", "disk", "started"]
        info = table.runs[0]
        row = [str(cell) for cell in table.get_row_at(0)]
        assert info.last_loss is not None and row[6] == f"{info.last_loss:.4f}"
        assert row[5] == f"{info.last_reward:.3f}" and row[7] == "naive"  # switched chunked -> naive


# ---- 7: words ----------------------------------------------------------------------------------
async def test_titles_say_where_and_what_enter_does(app_factory, recorded_run: Path, second_run: Path) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: len(screen.query_one(RunsTable).runs) == 2)
        assert screen.query_one("#runs-box").border_title == "Runs · runs"  # cwd is the runs' parent
        assert screen.query_one("#runs-box").border_subtitle == "2 run(s) · Enter opens"
        assert screen.query_one("#preset-detail-box").border_subtitle == "built-in"
        await pilot.press("c")
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 2)
        assert app.screen.query_one("#compare-pick").border_subtitle == "2 run(s) · Enter compares"


def test_paths_are_shown_as_a_user_types_them(tmp_path: Path) -> None:
    assert shown_path(tmp_path / "runs") == "runs"  # cwd is tmp_path (conftest)
    assert shown_path(Path.home() / ".config" / "x.toml") == os.path.join("~", ".config", "x.toml")
    assert shown_path(Path("/")) == "/"


async def test_alert_words_and_an_empty_alerts_tab(app_factory, recorded_run: Path) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(recorded_run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        await pilot.press("3")
        await pilot.pause()
        empty = app.screen.query_one("#alerts-empty")
        assert empty.display and "no alerts yet" in plain(empty)
        assert not app.screen.query_one("#alerts-table").display
        assert "no alerts" in plain(app.screen.query_one("#run-title"))


def test_long_keys_are_never_broken_mid_word() -> None:
    from rich.console import Console

    from grpo_tui.dashboard.screens.presets import preset_fields_table

    console = Console(width=60, record=True, color_system=None, file=open(os.devnull, "w"))
    console.print(preset_fields_table(store.load_preset("tiny-cpu")[0]))
    assert "  gradient_accumulation_steps " in console.export_text()  # one piece, at 60 columns


# ---- 2 and 6: the editor's checks; overwrite and delete user presets ---------------------------
async def _edit(pilot, app, name: str) -> PresetEditorScreen:
    screen = app.screen
    names = [e.name for e in screen.entries]
    screen.query_one(OptionList).highlighted = names.index(name)
    await pilot.pause()
    await pilot.press("e")
    await wait_for(pilot, lambda: isinstance(app.screen, PresetEditorScreen))
    return app.screen


async def test_the_editor_runs_the_start_checks_before_it_says_valid(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        editor = await _edit(pilot, app, "tiny-cpu")
        editor.query_one("#f-grpo--num_generations", Input).value = "3"
        await pilot.pause()
        errors = editor.validate_form()
        assert errors and errors[0].startswith("grpo.num_generations: got 3; must divide the generation batch")
        assert plain(editor.query_one("#editor-status")).startswith("✗ 1 problem(s): grpo.num_generations")
        assert "must divide" in plain(editor.query_one("#err-f-grpo--num_generations"))
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, PresetEditorScreen)  # not saved
        assert not (store.user_presets_dir() / "tiny-cpu-custom.toml").exists()


async def test_a_user_preset_is_saved_over_itself_after_a_confirm(app_factory) -> None:
    base = store.load_preset("tiny-cpu")[0]
    path = store.save_user_preset(base.model_copy(update={"description": "old"}), "mine")
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        editor = await _edit(pilot, app, "mine")
        assert editor.query_one("#f-name", Input).value == "mine"  # not mine-custom
        editor.query_one("#f-description", Input).value = "new"
        await pilot.pause()
        assert "replaces user preset mine" in plain(editor.query_one("#editor-status"))
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")  # no: nothing written, still editing
        assert isinstance(app.screen, PresetEditorScreen) and "old" in path.read_text()
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, PresetScreen))
        assert store.load_preset("mine")[0].description == "new"


async def test_a_built_in_cannot_be_saved_over_or_deleted(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        editor = await _edit(pilot, app, "tiny-cpu")
        assert editor.query_one("#f-name", Input).value == "tiny-cpu-custom"
        editor.query_one("#f-name", Input).value = "tiny-cpu"
        await pilot.pause()
        assert any("built-in preset (read-only)" in e for e in editor.validate_form())
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, PresetScreen))
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, PresetScreen)  # refused without asking
        assert (store.BUILTIN_DIR / "tiny-cpu.toml").is_file()


async def test_d_deletes_a_user_preset_after_a_confirm(app_factory) -> None:
    path = store.save_user_preset(store.load_preset("tiny-cpu")[0], "mine")
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        names = [e.name for e in screen.entries]
        screen.query_one(OptionList).highlighted = names.index("mine")
        await pilot.pause()
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: "mine" not in [e.name for e in screen.entries])
        assert not path.exists()


# ---- renaming user presets in the app -----------------------------------------------------------
async def _rename_dialog(pilot, app, name: str) -> RenamePresetScreen:
    screen = app.screen
    screen.query_one(OptionList).highlighted = [e.name for e in screen.entries].index(name)
    await pilot.pause()
    await pilot.press("n")
    await wait_for(pilot, lambda: isinstance(app.screen, RenamePresetScreen))
    return app.screen


async def _submit(pilot, dialog, name: str) -> None:
    dialog.query_one(Input).value = name
    await pilot.pause()
    await pilot.press("enter")
    await pilot.pause()


def _cli_refusal(old: str, new: str) -> str:
    with pytest.raises(PresetError) as refused:
        rename_user_preset(old, new)
    return refused.value.lines[0]


async def test_n_renames_a_user_preset_refusing_bad_names_inside_the_dialog(app_factory) -> None:
    base = store.load_preset("tiny-cpu")[0]
    mine = store.save_user_preset(base.model_copy(update={"description": "mine"}), "mine")
    store.save_user_preset(base, "other")
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        dialog = await _rename_dialog(pilot, app, "mine")
        for bad in ("bad name!", "other"):  # a name the schema refuses; a user preset that exists
            await _submit(pilot, dialog, bad)
            assert app.screen is dialog
            assert plain(dialog.query_one("#rename-error")).strip() == _cli_refusal("mine", bad)
        assert mine.is_file()
        await _submit(pilot, dialog, "renamed")
        await wait_for(pilot, lambda: app.screen is screen and "renamed" in [e.name for e in screen.entries])
        assert not mine.exists() and "mine" not in [e.name for e in screen.entries]
        assert store.load_preset("renamed")[0].description == "mine"
        assert store.load_preset("renamed")[0].name == "renamed"
        assert screen.selected_name == "renamed"


async def test_renaming_to_a_built_ins_name_asks_first_and_the_list_says_it_shadows(app_factory) -> None:
    mine = store.save_user_preset(store.load_preset("tiny-cpu")[0].model_copy(update={"description": "x"}), "mine")
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        dialog = await _rename_dialog(pilot, app, "mine")
        await _submit(pilot, dialog, "tiny-cpu")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")  # no: nothing renamed, the dialog stays
        await wait_for(pilot, lambda: app.screen is dialog)
        assert mine.is_file() and not (store.user_presets_dir() / "tiny-cpu.toml").exists()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: app.screen is screen and "mine" not in [e.name for e in screen.entries])
        assert store.find_preset("tiny-cpu").origin == "user" and store.load_preset("tiny-cpu")[0].description == "x"
        listed = screen.query_one(OptionList).get_option("tiny-cpu").prompt.plain
        assert listed == "tiny-cpu  user (shadows built-in)"
        assert screen.query_one("#preset-detail-box").border_title == "tiny-cpu · user (shadows built-in)"
        assert (store.BUILTIN_DIR / "tiny-cpu.toml").is_file()


async def test_n_on_a_built_in_is_refused_without_a_dialog(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        screen.query_one(OptionList).highlighted = [e.name for e in screen.entries].index("tiny-cpu")
        await pilot.pause()
        await pilot.press("n")
        await pilot.pause()
        assert app.screen is screen
        assert [e.name for e in screen.entries] == [e.name for e in store.list_presets()]


async def test_a_failed_write_while_renaming_is_one_line_in_the_dialog(app_factory, monkeypatch) -> None:
    import errno

    from grpo_tui.config import preset_admin

    mine = store.save_user_preset(store.load_preset("tiny-cpu")[0], "mine")
    target = store.user_presets_dir() / "renamed.toml"

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    monkeypatch.setattr(preset_admin, "save_user_preset", full_disk)
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        dialog = await _rename_dialog(pilot, app, "mine")
        await _submit(pilot, dialog, "renamed")
        assert app.screen is dialog
        assert plain(dialog.query_one("#rename-error")).strip() == f"{target}: No space left on device"
        assert mine.is_file() and not target.exists()
