"""The dashboard's `d` key: asks every rank of the run for its stacks (launch/stacks.py) and says so."""

from __future__ import annotations

from pathlib import Path

from ui_support import SIZE, mark_running, wait_for

from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.launch import stacks
from grpo_tui.tools.demo import make_run


async def test_d_asks_the_runs_ranks_for_their_stacks(app_factory, runs_dir: Path, monkeypatch) -> None:
    run = make_run(runs_dir / "live", steps=10, finished=False).path
    mark_running(run)
    asked: list[Path] = []

    def fake_dump(path: Path) -> stacks.StacksAsked:
        asked.append(Path(path))
        return stacks.StacksAsked(Path(path).name, [4242])

    monkeypatch.setattr(stacks, "dump_stacks", fake_dump)
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        await pilot.press("d")
        await wait_for(pilot, lambda: any("pid 4242" in str(n.message) for n in app._notifications))
        assert asked == [run]


def test_no_stacks_are_asked_of_a_folder_without_live_ranks(tmp_path: Path) -> None:
    # The recorded run's start event names pids that are not trainers here: none is signalled
    run = make_run(tmp_path / "old", steps=5).path
    result = stacks.dump_stacks(run)
    assert result.pids == [] and "no live rank" in result.message
