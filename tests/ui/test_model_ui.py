"""The app's side of a run's product: the model's path and held-out reward in the run view and Compare, the
export dialog, disk use, prune and delete with a confirm."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_runs_compare_help import runs_table
from textual.widgets import Input
from ui_support import SIZE, plain, wait_for

from grpo_tui.dashboard.screens.compare import CompareScreen
from grpo_tui.dashboard.screens.confirm import ConfirmScreen
from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.dashboard.screens.export import ExportScreen
from grpo_tui.dashboard.screens.runs import RunsScreen
from grpo_tui.launch import export as export_launch


def _checkpoint_and_model(run) -> None:
    (run / "checkpoints" / "checkpoint-300").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-300" / "optimizer.pt").write_bytes(b"x" * 4096)
    (run / "model").mkdir()
    (run / "model" / "model.safetensors").write_bytes(b"w" * 2048)


async def test_p_prunes_and_shift_d_deletes_after_a_confirm(app_factory, recorded_run, second_run) -> None:
    _checkpoint_and_model(recorded_run)
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        table = await runs_table(pilot, "r")
        disk = [str(table.get_cell_at((row, table.get_column_index("disk")))) for row in range(2)]
        assert disk[1].endswith("KiB") and float(disk[1].split()[0]) > 6  # the checkpoint and the model count
        await pilot.press("down", "p")
        assert isinstance(app.screen, ConfirmScreen) and "4 KiB" in app.screen.detail
        await pilot.press("n")  # no: nothing goes
        assert (recorded_run / "checkpoints").is_dir()
        await pilot.press("p")
        await pilot.press("y")
        await wait_for(pilot, lambda: not (recorded_run / "checkpoints").exists())
        assert (recorded_run / "model" / "model.safetensors").is_file()
        await pilot.press("up", "D")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        assert isinstance(app.screen, RunsScreen)
        await wait_for(pilot, lambda: len(table.runs) == 1)
        assert not second_run.exists() and recorded_run.is_dir()


def _evaluated(run, before: float, after: float, lora: bool = True) -> None:
    (run / "model").mkdir(exist_ok=True)
    (run / "model" / "adapter_model.safetensors").write_bytes(b"w" * 3000)
    (run / "model" / "grpo-tui.json").write_text(json.dumps({"kind": "lora" if lora else "full"}))
    scores = {"before": before, "after": after}
    (run / "eval.json").write_text(json.dumps({"rewards": {"addition_partial": scores}, "reward": scores}))


async def test_the_run_view_shows_the_model_and_reward_before_after_and_exports(
    app_factory, recorded_run, monkeypatch
) -> None:
    _evaluated(recorded_run, 0.288, 0.648)
    asked = []

    def fake_export(run, options):
        asked.append((run, options))
        return export_launch.ExportOutcome(True, f"wrote {options.to} (1 MiB)")

    monkeypatch.setattr(export_launch, "run_export", fake_export)
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(recorded_run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        line = plain(app.screen.query_one("#run-product"))
        assert f"model {recorded_run / 'model'} (" in line and "LoRA adapter" in line
        assert "held-out addition_partial 0.288 → 0.648" in line
        await pilot.press("e")
        assert isinstance(app.screen, ExportScreen)
        field = app.screen.query_one("#export-to")
        assert field.value.endswith(f"exports/{recorded_run.name}")
        field.value = "out/model"
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(asked))
        run, options = asked[0]
        assert run == recorded_run and options.merged is True and options.dtype is None and not options.force
        assert str(options.to) == "out/model"
        await pilot.press("e", "escape")  # cancelled: nothing more is exported
        await pilot.pause()
        assert len(asked) == 1 and isinstance(app.screen, DashboardScreen)


async def test_compare_shows_held_out_reward_before_and_after(app_factory, recorded_run, second_run) -> None:
    _evaluated(recorded_run, 0.30, 0.60)
    _evaluated(second_run, 0.30, 0.55, lora=False)
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await runs_table(pilot, "r")
        await pilot.press("space", "down", "space", "c")
        assert isinstance(app.screen, CompareScreen)
        await wait_for(pilot, lambda: app.screen.data is not None)
        text = plain(app.screen.query_one("#compare-table"))
        assert "held-out addition_partial" in text and "0.300 → 0.550" in text and "0.300 → 0.600" in text
        assert "+0.050" in text or "-0.050" in text


@pytest.fixture
def _stable_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")


def _open_evaluated(run, keys: tuple[str, ...] = ()):
    async def run_before(pilot) -> None:
        pilot.app.open_run(Path("runs") / run.name)
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, DashboardScreen) and pilot.app.screen.updates > 0)
        await pilot.press(*keys)
        # A blinking cursor would be drawn or not by when the snapshot is taken: hold it shown
        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False
        await pilot.pause(0.1)

    return run_before


@pytest.mark.parametrize("keys", [pytest.param((), id="run_view"), pytest.param(("e",), id="export_dialog")])
def test_snapshot_run_view_with_model_and_export_dialog(
    _stable_paths, snap_compare, app_factory, recorded_run, keys
) -> None:
    _evaluated(recorded_run, 0.288, 0.648)
    app = app_factory(runs_dir=Path("runs"), poll_interval=3600.0)
    assert snap_compare(app, terminal_size=SIZE, run_before=_open_evaluated(recorded_run, keys))
