"""Resume on tiny-cpu, in-process: stop at step N, resume, and the stream goes on at N+1 as if never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_trainer import ABS, REL, make_run

from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import read_records, step_records
from grpo_tui.runs.status import RunStatus, stream_status
from grpo_tui.train import entry
from grpo_tui.train.session import TrainingSession

STEPS, STOP_AT = 6, 3


def _stop_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """A stop request written when `step` ends (as `grpo-tui control --stop` would, but at a known step)."""
    original = TrainingSession.at_step_boundary

    def at_step_boundary(self: TrainingSession, control: Any) -> None:
        if self.step == step:
            self.run_dir.request(stop=True)
        original(self, control)

    monkeypatch.setattr(TrainingSession, "at_step_boundary", at_step_boundary)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    run = make_run(tmp_path_factory.mktemp("whole"), "whole", grpo={"max_steps": STEPS})
    assert entry.main(["--run-dir", str(run.path)]) == 0
    return step_records(read_records(run.metrics))


def test_stop_then_resume_continues_the_same_run(
    uninterrupted: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path, "resumed", grpo={"max_steps": STEPS})
    with monkeypatch.context() as patch:
        _stop_at(patch, STOP_AT)
        assert entry.main(["--run-dir", str(run.path)]) == 0
    assert run.latest_checkpoint() == run.checkpoints / f"checkpoint-{STOP_AT}"
    run.request(stop=False)  # what `grpo-tui resume` does before it starts the trainer again
    assert entry.main(["--run-dir", str(run.path), "--resume"]) == 0

    records = read_records(run.metrics)
    steps = step_records(records)
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # no gap, no step twice
    events = [(r["event"], r.get("step", r.get("from_step"))) for r in records if "event" in r]
    assert events == [
        ("start", None),
        ("stop_requested", STOP_AT),
        ("checkpoint", STOP_AT),
        ("finish", STOP_AT),
        ("start", None),
        ("resume", STOP_AT),
        ("finish", STEPS),
    ]
    resume = next(r for r in records if r.get("event") == "resume")
    assert resume["checkpoint"] == str(run.checkpoints / f"checkpoint-{STOP_AT}")
    assert stream_status([(r["event"], r) for r in records if "event" in r]) is RunStatus.FINISHED
    # Model, optimizer, scheduler, RNG (generation sampling) and data order come back from the
    # checkpoint: the resumed steps are the uninterrupted run's, to fp32 summation noise.
    for a, b in zip(steps, uninterrupted, strict=True):
        for key in ("loss", "reward", "grad_norm", "learning_rate"):
            assert a[key] == pytest.approx(b[key], rel=REL, abs=ABS), (a["step"], key)


def test_resume_without_a_checkpoint_is_one_error_line(tiny_model_path: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path, "bare", grpo={"max_steps": 2})
    assert entry.main(["--run-dir", str(run.path), "--resume"]) == entry.EXIT_ERROR
    errors = [r for r in read_records(run.metrics) if r.get("event") == "error"]
    assert len(errors) == 1 and "no checkpoint to resume from" in errors[0]["message"]


def test_latest_checkpoint_needs_the_trainer_state(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.latest_checkpoint() is None
    for step, complete in ((2, True), (10, True), (12, False)):
        folder = run.checkpoints / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    (run.checkpoints / "checkpoint-x").mkdir()
    assert run.latest_checkpoint() == run.checkpoints / "checkpoint-10"


def _resume_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    from grpo_tui.cli import main

    code = main(["resume", *argv])
    return code, capsys.readouterr().err.splitlines()


def test_resume_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import os

    code, err = _resume_cli([str(tmp_path / "missing")], capsys)
    assert code == 2 and len(err) == 1 and "no such run folder" in err[0]
    code, err = _resume_cli([str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and "not a run folder" in err[0]
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.update_status(status="stopped")
    code, err = _resume_cli([str(run.path)], capsys)
    assert code == 2 and len(err) == 1 and "no checkpoint to resume from" in err[0]
    (run.checkpoints / "checkpoint-2").mkdir(parents=True)
    (run.checkpoints / "checkpoint-2" / "trainer_state.json").write_text("{}")
    run.update_status(status="running", pid=os.getpid())  # this test's process: alive
    code, err = _resume_cli([str(run.path)], capsys)
    assert code == 2 and len(err) == 1 and "stop it before resuming" in err[0]
    run.update_status(status="finished", pid=None)
    code, err = _resume_cli([str(run.path)], capsys)
    assert code == 2 and len(err) == 1 and "the run finished" in err[0]

    from grpo_tui.launch import resume

    run.update_status(status="failed", started=1234.0)
    run.command.write_text(json.dumps({"argv": ["python", "-m", "grpo_tui.train", "--run-dir", str(run.path)]}))
    run.request(stop=True)
    started: list[Path] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(resume, "run_foreground", lambda path, headless, claim: started.append(path) or 0)
        code, err = _resume_cli([str(run.path)], capsys)
    assert code == 0 and err == [] and started == [run.path]
    assert json.loads(run.command.read_text())["argv"][-1] == "--resume"
    assert run.read_status()["status"] == "starting" and run.read_status()["resumed_from"].endswith("checkpoint-2")
    assert json.loads(run.control.read_text())["stop"] is False  # the old stop request would end it at once
    from grpo_tui.runs.listing import run_info

    run.update_status(started=5678.0)  # the resumed supervisor's start
    assert run_info(run.path).started == 1234.0  # the runs list's "started" is the run's first start


def test_the_dashboard_reads_a_resumed_run_as_its_latest_attempt(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from grpo_tui.dashboard.alerts import STALL, detect_alerts
    from grpo_tui.dashboard.feed import DashboardFeed

    run = make_run(tmp_path, "again", grpo={"max_steps": STEPS})
    with monkeypatch.context() as patch:
        _stop_at(patch, STOP_AT)
        assert entry.main(["--run-dir", str(run.path)]) == 0
    run.request(stop=False)
    time.sleep(1.5)  # the run stays stopped a while: that time is not training time
    seen: list[tuple[float, Any, Any]] = []
    original = TrainingSession.at_step_boundary

    def look(self: TrainingSession, control: Any) -> None:
        original(self, control)
        if self.step == STEPS - 1 and not seen:  # the resumed attempt is under way
            now = time.time()
            feed = DashboardFeed(run.path, monitor=None, clock=lambda: now)
            seen.append((now, feed.poll(), feed.state))

    with monkeypatch.context() as patch:
        patch.setattr(TrainingSession, "at_step_boundary", look)
        assert entry.main(["--run-dir", str(run.path), "--resume"]) == 0
    now, view, state = seen[0]
    assert view.status == RunStatus.RUNNING and state.status is RunStatus.RUNNING
    assert view.progress.state == RunStatus.RUNNING and view.progress.eta_s > 0
    first, second = view.progress.attempts
    assert (first.first_step, first.last_step, first.status) == (1, STOP_AT, RunStatus.STOPPED)
    assert first.ended is not None and second.ended is None
    assert second.first_step == STOP_AT + 1 and second.status is RunStatus.RUNNING
    # Elapsed adds the attempts up: the pause between them is left out.
    assert view.progress.elapsed_s == pytest.approx((first.ended - first.started) + (now - second.started))
    assert view.progress.elapsed_s < now - first.started - 1.0
    # The stall alert watches the live attempt.
    stalled = detect_alerts(state, None, now=state.last_time + 3600.0)
    assert any(alert.kind == STALL for alert in stalled)
