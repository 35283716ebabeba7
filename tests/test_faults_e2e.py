"""kill -9 of the launcher, the trainer and the supervisor of real tiny-cpu runs:
no trainer outlives its run's tracking, and the recorded reason names the signal."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from test_cli_e2e import grpo_tui_argv, the_run
from test_runner import wait_for

from grpo_tui.runs.folder import RunDir, list_runs
from grpo_tui.runs.metrics import read_records, start_event, step_records
from grpo_tui.runs.status import judge

pytestmark = pytest.mark.slow


def start_real_run(tmp_path: Path, processes: int = 1) -> tuple[subprocess.Popen[bytes], RunDir, list[int]]:
    """`grpo-tui run tiny-cpu --headless` (the supervisor) in its own session, once a step is logged."""
    sets = ["--set", "grpo.max_steps=500", "--set", f"distributed.num_processes={processes}"]
    proc = subprocess.Popen(
        [*grpo_tui_argv(), "run", "tiny-cpu", "--headless", *sets],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for(lambda: len(list_runs(tmp_path / "runs")) == 1, "the run folder")
    run = the_run(tmp_path / "runs")
    wait_for(lambda: len(step_records(read_records(run.metrics))) >= 1 or proc.poll() is not None, "a step")
    assert proc.poll() is None, run.stdout.read_text()[-2000:]
    ranks = [r["pid"] for r in start_event(run.metrics)["ranks"]]
    return proc, run, ranks


def gone(pids: list[int]) -> bool:
    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return not any(map(alive, pids))


@pytest.fixture
def cleanup():
    """Whatever a failed test leaves running is killed."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("processes", [1, 2])  # 2: torchrun gives each rank a session of its own
def test_kill_9_of_the_launcher_ends_its_trainer(tiny_model_path: Path, tmp_path: Path, cleanup, processes) -> None:
    proc, run, ranks = start_real_run(tmp_path, processes)
    assert len(ranks) == processes
    launcher = run.read_status()["child_pid"]
    cleanup += [proc.pid, launcher, *ranks]
    os.kill(launcher, signal.SIGKILL)
    assert proc.wait(timeout=30) != 0
    wait_for(lambda: gone(ranks), "the trainer to end with its launcher")
    status = run.read_status()
    assert status["status"] == "failed", status
    assert status["reason"] == "the launcher was killed by SIGKILL; the ranks it left were stopped"
    assert judge(run.path).state == "failed"


def test_kill_9_of_the_trainer_is_named_in_the_reason(tiny_model_path: Path, tmp_path: Path, cleanup) -> None:
    proc, run, ranks = start_real_run(tmp_path)
    cleanup += [proc.pid, run.read_status()["child_pid"]]
    os.kill(ranks[0], signal.SIGKILL)
    assert proc.wait(timeout=60) != 0
    status = run.read_status()
    assert status["status"] == "failed" and status["reason"].startswith("the trainer was killed by SIGKILL"), status


def test_kill_9_of_the_supervisor_stops_the_trainer(tiny_model_path: Path, tmp_path: Path, cleanup) -> None:
    proc, run, ranks = start_real_run(tmp_path)
    launcher = run.read_status()["child_pid"]
    cleanup += [launcher]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_for(lambda: gone([launcher, *ranks]), "the trainer to stop itself")
    events = [r["event"] for r in read_records(run.metrics) if "event" in r]
    assert events[-3:] == ["supervisor_lost", "checkpoint", "finish"]  # every stop leaves a checkpoint
    state, reason = judge(run.path)
    assert state == "stopped" and "supervisor" in reason
    # The trainer ended last, so it recorded the outcome: run.json agrees with every reader.
    status = run.read_status()
    assert status["status"] == "stopped" and status["reason"] == reason, status
