"""End to end: a real tiny-cpu trainer beats (heartbeat.json with its phase) and dumps its stacks into
stdout.log on `grpo-tui control RUN --dump-stacks` (SIGUSR1), then trains on and stops cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_trainer import make_run

from grpo_tui import cli
from grpo_tui.runs.heartbeat import COLLECTIVE, IDLE, heartbeat_path, read_heartbeat
from grpo_tui.runs.metrics import PHASES, read_records, step_records

pytestmark = pytest.mark.slow


def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the trainer ended before {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


def test_heartbeat_and_stack_dump_of_a_live_trainer(tiny_model_path: Path, tmp_path: Path, capsys) -> None:
    run = make_run(tmp_path, "watchdog", grpo={"max_steps": 5000}, loss={"impl": "naive"})
    with open(run.stdout, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_tui.train", "--run-dir", str(run.path)], stdout=log, stderr=log
        )
    try:
        beat_file = heartbeat_path(run.path, 0)

        def beat_after_a_step() -> bool:
            beat = read_heartbeat(beat_file)
            return beat is not None and beat.step >= 1

        _wait("heartbeat after step 1", beat_after_a_step, proc, run.stdout)
        beat = read_heartbeat(beat_file)
        assert beat.phase in (*PHASES, IDLE, COLLECTIVE) and beat.pid == proc.pid and beat.rank == 0
        assert beat.phase_started <= beat.time <= time.time() + 1

        assert cli.main(["control", str(run.path), "--dump-stacks"]) == 0
        assert f"pid {proc.pid}" in capsys.readouterr().out

        def stacks_logged() -> bool:
            # Every thread, the beating one too (the dump is written piecewise: wait for all of it)
            text = run.stdout.read_text(errors="replace")
            return "Thread 0x" in text and 'File "' in text and "grpo_tui/train/heartbeat.py" in text

        _wait("stack dump in stdout.log", stacks_logged, proc, run.stdout, timeout=30)

        steps = len(step_records(read_records(run.metrics)))
        _wait("a step after the dump", lambda: len(step_records(read_records(run.metrics))) > steps, proc, run.stdout)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, run.stdout.read_text()[-3000:]  # the dump did not hurt the rank
    finally:
        if proc.poll() is None:
            proc.kill()
    # Once ended, nothing is signalled: the pids may belong to anyone now
    assert cli.main(["control", str(run.path), "--dump-stacks"]) == 1
    assert "no live rank" in capsys.readouterr().err
