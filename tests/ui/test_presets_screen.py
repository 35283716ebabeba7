"""Presets screen (the start screen) and the preset editor, driven with Textual's pilot."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import Input, OptionList, Static
from ui_support import SIZE, plain, wait_for

from grpo_tui.config.schema import GrpoSection
from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.dashboard.screens.preset_editor import PresetEditorScreen
from grpo_tui.dashboard.screens.presets import PresetScreen
from grpo_tui.dashboard.widgets.runs_table import RunsTable
from grpo_tui.tools.demo import make_run


def _text(app, selector: str) -> str:
    return plain(app.screen.query_one(selector, Static))


async def test_opens_on_tiny_cpu_with_fields_and_command(app_factory, recorded_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PresetScreen)
        assert screen.selected_name == "tiny-cpu"
        fields = _text(app, "#preset-fields")
        assert "builtin:tiny-qwen3" in fields and "num_generations" in fields
        command = _text(app, "#preset-command")
        assert "grpo_tui.launch.launcher" in command and "--config_file" in command
        assert "ACCELERATE_USE_CPU=true" in command  # tiny-cpu trains on the CPU
        table = screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 1)
        assert table.runs[0].path == recorded_run and table.runs[0].status == "finished"
        await wait_for(pilot, lambda: "checking" not in _text(app, "#preset-checks"))


async def test_moving_the_selection_updates_the_detail(app_factory) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        options = app.screen.query_one(OptionList)
        names = [e.name for e in app.screen.entries]
        await pilot.press("up")
        expected = names[names.index("tiny-cpu") - 1]
        assert app.screen.selected_name == expected
        assert expected in str(app.screen.query_one("#preset-detail-box").border_title)
        assert options.highlighted == names.index(expected)


async def test_s_and_enter_start_the_selected_preset_and_open_its_dashboard(app_factory, runs_dir) -> None:
    started: list[str] = []

    def launcher(preset, runs_dir_arg):
        started.append(preset.name)
        run = make_run(runs_dir / f"2026010{len(started)}-000000-{preset.name}", steps=5)
        return run.path, None

    app = app_factory(launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        assert started == ["tiny-cpu"]
        assert app.screen.run_path.name == "20260101-000000-tiny-cpu"
        await pilot.press("escape")
        assert isinstance(app.screen, PresetScreen)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        assert started == ["tiny-cpu", "tiny-cpu"]


async def test_a_failed_start_says_why_in_one_line(app_factory) -> None:
    from grpo_tui.config.schema import PresetError

    def launcher(preset, runs_dir_arg):
        raise PresetError(["distributed.num_processes: got 8; 0 GPU(s) visible on this machine"])

    app = app_factory(launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("s")
        await wait_for(pilot, lambda: any("num_processes" in str(n.message) for n in app._notifications))
        assert isinstance(app.screen, PresetScreen)


async def test_an_invalid_user_preset_is_listed_with_its_error(app_factory, tmp_path) -> None:
    user = tmp_path / "user-presets"
    user.mkdir()
    (user / "broken.toml").write_text("[grpo]\nnum_generations = 1\n")
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "broken" in [e.name for e in app.screen.entries]
        names = [e.name for e in app.screen.entries]
        app.screen.query_one(OptionList).highlighted = names.index("broken")
        await pilot.pause()
        assert "grpo.num_generations" in _text(app, "#preset-fields")
        await pilot.press("s")  # refuses, with the error, instead of starting
        await pilot.pause()
        assert isinstance(app.screen, PresetScreen)
        assert any("num_generations" in str(n.message) for n in app._notifications)


async def test_editor_validates_inline_and_saves_a_user_preset(app_factory, tmp_path) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("e")
        await pilot.pause()
        editor = app.screen
        assert isinstance(editor, PresetEditorScreen)
        field = editor.query_one("#f-grpo--num_generations", Input)
        field.value = "1"
        await pilot.pause()
        error = plain(editor.query_one("#err-f-grpo--num_generations"))
        assert "greater than or equal to 2" in error
        await pilot.press("ctrl+s")  # invalid: nothing saved
        await pilot.pause()
        assert isinstance(app.screen, PresetEditorScreen)
        assert not (tmp_path / "user-presets").exists()
        field.value = "4"
        editor.query_one("#f-name", Input).value = "tiny-cpu"  # a built-in's name is refused
        await pilot.pause()
        assert "built-in" in plain(editor.query_one("#err-f-name"))
        editor.query_one("#f-name", Input).value = "my-tiny"
        await pilot.pause()
        # the error is gone: the line shows the field's description again
        hint = GrpoSection.model_fields["num_generations"].description
        assert hint and plain(editor.query_one("#err-f-grpo--num_generations")).strip() == hint
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, PresetScreen))
        saved = tmp_path / "user-presets" / "my-tiny.toml"
        assert saved.is_file() and "num_generations = 4" in saved.read_text()
        assert app.screen.selected_name == "my-tiny"


async def test_editor_escape_cancels(app_factory, tmp_path) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("e")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, PresetScreen)
        assert not (tmp_path / "user-presets").exists()


async def test_enter_on_the_runs_table_opens_that_run(app_factory, recorded_run) -> None:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 1)
        table.focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        assert app.screen.run_path == recorded_run


async def test_relative_runs_dir_shows_relative_paths(app_factory, tmp_path) -> None:
    app = app_factory(runs_dir=Path("runs"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "runs/<YYYYmmdd-HHMMSS>-tiny-cpu/accelerate.yaml" in _text(app, "#preset-command")


async def test_back_from_a_dashboard_the_runs_list_shows_the_new_run(app_factory, runs_dir) -> None:
    def launcher(preset, runs_dir_arg):
        return make_run(runs_dir / "20260105-000000-tiny-cpu", steps=5).path, None

    app = app_factory(launcher=launcher)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: table.runs == [] and "no runs yet" in str(table.parent.border_subtitle))
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        await pilot.press("escape")
        await wait_for(pilot, lambda: [r.name for r in table.runs] == ["20260105-000000-tiny-cpu"])


async def test_editor_reads_the_preset_folders_once_not_per_keystroke(app_factory, monkeypatch) -> None:
    from grpo_tui.config import store

    calls = []
    real = store.list_presets
    monkeypatch.setattr(store, "list_presets", lambda: calls.append(1) or real())
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, PresetEditorScreen)
        opened = len(calls)
        app.screen.query_one("#f-name", Input).focus()
        await pilot.press(*"tiny-cpu-x")
        await pilot.pause()
        assert app.screen.query_one("#f-name", Input).value.endswith("tiny-cpu-x")
        assert len(calls) == opened


async def test_editor_runs_the_cross_field_checks_off_the_ui_thread_once_typing_pauses(
    app_factory, monkeypatch
) -> None:
    import threading

    from grpo_tui.config import checks

    threads = []
    real = checks.check_preset
    monkeypatch.setattr(
        checks, "check_preset", lambda *a, **k: threads.append(threading.current_thread()) or real(*a, **k)
    )
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, PresetEditorScreen))
        editor = app.screen
        await wait_for(pilot, lambda: plain(editor.query_one("#editor-status")).startswith("✓ valid"))
        threads.clear()
        editor.query_one("#f-grpo--num_generations", Input).focus()
        await pilot.press("end", *["backspace"] * 3, "1", "3")  # 13 does not divide the generation batch
        status = editor.query_one("#editor-status")
        await wait_for(pilot, lambda: "must divide" in plain(editor.query_one("#err-f-grpo--num_generations")))
        assert plain(status).startswith("✗ 1 problem(s): grpo.num_generations")
        assert threads and threading.main_thread() not in threads  # never on the UI thread
        assert len(threads) < 6  # one run per pause in typing, not one per key


async def test_checks_finishing_after_the_app_closed_do_not_fail_it(app_factory) -> None:
    # The pre-launch checks run in a thread; on a loaded machine they can finish after the user quit or the
    # screen went (seen in CI: NoMatches from the worker while the app shut down). Their result then has
    # nowhere to go, which must not raise.
    from rich.text import Text

    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        await wait_for(pilot, lambda: "checking" not in _text(app, "#preset-checks"))
        preset = screen.selected_preset
    PresetScreen._check.__wrapped__(screen, preset)  # the worker's body: the app refuses the call back
    screen._show_checks(Text("late"))  # the UI-thread half: the dismantled screen has no #preset-checks
