"""The app's side of a run's product: disk use, prune and delete with a confirm."""

from __future__ import annotations

from ui_support import SIZE, wait_for

from grpo_tui.dashboard.screens.confirm import ConfirmScreen
from grpo_tui.dashboard.screens.runs import RunsScreen
from grpo_tui.dashboard.widgets.runs_table import RunsTable


def _checkpoint_and_model(run) -> None:
    (run / "checkpoints" / "checkpoint-300").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-300" / "optimizer.pt").write_bytes(b"x" * 4096)
    (run / "model").mkdir()
    (run / "model" / "model.safetensors").write_bytes(b"w" * 2048)


async def test_p_prunes_and_shift_d_deletes_after_a_confirm(app_factory, recorded_run, second_run) -> None:
    _checkpoint_and_model(recorded_run)
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("r")
        table = app.screen.query_one(RunsTable)
        await wait_for(pilot, lambda: len(table.runs) == 2)
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
