"""run.json's outcome is written by whoever ends the run last: a killed supervisor or a full disk at its
last write leaves no run that says "running" for ever."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_runner import fake_run, steps_logged, wait_for

from grpo_tui.launch.supervisor import Supervisor
from grpo_tui.runs.claim import RUNNING, claim_run
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.listing import run_info
from grpo_tui.runs.status import judge, settle

DETACH = "import sys; from grpo_tui.launch.supervisor import spawn_detached; print(spawn_detached(sys.argv[1]))"


def test_a_killed_supervisor_gets_its_outcome_recorded_by_the_next_reader(tmp_path: Path) -> None:
    run = fake_run(tmp_path, steps=40, step_s=0.05)
    started = subprocess.run([sys.executable, "-c", DETACH, str(run.path)], capture_output=True, text=True, timeout=60)
    supervisor = int(started.stdout)
    wait_for(lambda: steps_logged(run) >= 1, "a step")
    os.kill(supervisor, signal.SIGKILL)
    # The trainer runs on to its end with nobody to record it.
    wait_for(lambda: judge(run.path).state == "finished", "the trainer's finish")
    assert run.read_status()["status"] == "running"
    listed = subprocess.run(
        [sys.executable, "-m", "grpo_tui.cli", "runs", "--runs-dir", str(run.path.parent)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0 and "finished" in listed.stdout, listed
    status = run.read_status()
    assert status["status"] == "finished" and status["pid"] == supervisor, status


def test_a_full_disk_at_the_supervisors_last_write_is_recorded_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = fake_run(tmp_path, steps=2, mode="error")
    supervisor = Supervisor(run)
    with claim_run(run, RUNNING):
        supervisor.start()
        original = RunDir.update_status

        def full_at_the_end(self: RunDir, **fields):
            if fields.get("status") == "failed":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.status))
            return original(self, **fields)

        with monkeypatch.context() as patch:
            patch.setattr(RunDir, "update_status", full_at_the_end)
            assert supervisor.wait() == 1
        assert run.read_status()["status"] == "running"
        # While the supervisor holds the run, a reader leaves run.json to it.
        assert settle(run.path).state == "failed" and run.read_status()["status"] == "running"
    # Disk space back, the supervisor gone: the first reader records the one verdict.
    info = run_info(run.path)
    status = run.read_status()
    assert info.status == status["status"] == "failed"
    assert info.reason == status["reason"] == "RuntimeError: reward function raised at step 2"
