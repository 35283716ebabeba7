"""The dashboard's `R` key: a stopped run with a checkpoint starts again; anything else says why not."""

from __future__ import annotations

from pathlib import Path

from ui_support import SIZE, wait_for

from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.launch import resume
from grpo_tui.runs.folder import RunDir
from grpo_tui.tools.demo import make_run


async def _press_r(app, run: Path) -> None:
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        await pilot.press("R")
        await wait_for(pilot, lambda: any(n.title in ("Resumed", "Not resumed") for n in app._notifications))
        return [str(n.message) for n in app._notifications]


def fake_spawn(started: list[Path]):
    """spawn_detached without a process: records the folder and drops the claim it was handed."""

    def spawn(path: Path, claim) -> int:
        claim.release()
        started.append(Path(path))
        return 4242

    return spawn


def stopped_run(path: Path) -> RunDir:
    """A stopped run of 10 steps with a checkpoint to resume from and the command it was launched with."""
    folder = RunDir(make_run(path, steps=10, finished=False).path)
    folder.update_status(status="stopped", pid=None, child_pid=None)
    (folder.checkpoints / "checkpoint-10").mkdir(parents=True)
    (folder.checkpoints / "checkpoint-10" / "trainer_state.json").write_text("{}")
    folder.command.write_text('{"argv": ["python", "-m", "grpo_tui.train", "--run-dir", "x"]}')
    return folder


async def test_r_resumes_a_stopped_run_from_its_checkpoint(app_factory, runs_dir: Path, monkeypatch) -> None:
    folder = stopped_run(runs_dir / "stopped")
    run = folder.path
    started: list[Path] = []
    monkeypatch.setattr(resume, "spawn_detached", fake_spawn(started))
    messages = await _press_r(app_factory(), run)
    assert started == [run], messages
    assert "--resume" in folder.command.read_text()


async def test_r_on_a_finished_run_says_why_not(app_factory, runs_dir: Path, monkeypatch) -> None:
    run = make_run(runs_dir / "done", steps=10).path
    started: list[Path] = []
    monkeypatch.setattr(resume, "spawn_detached", fake_spawn(started))
    messages = await _press_r(app_factory(), run)
    assert started == [] and any("finished" in m for m in messages), messages


async def test_r_on_a_run_another_process_holds_names_it(app_factory, runs_dir: Path, monkeypatch) -> None:
    from grpo_tui.runs.claim import RUNNING, claim_run

    folder = stopped_run(runs_dir / "held")
    run = folder.path
    started: list[Path] = []
    monkeypatch.setattr(resume, "spawn_detached", fake_spawn(started))
    import os

    with claim_run(folder, RUNNING):  # a `grpo-tui run` of this folder between its check and its start
        messages = await _press_r(app_factory(), run)
    assert started == [] and any(f"is being run by pid {os.getpid()}" in m for m in messages), messages
    assert "--resume" not in folder.command.read_text()
