"""One supervisor per run folder: the claim on RUN/run.lock, with real processes racing for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_runner import fake_run, steps_logged, wait_for

from grpo_tui.config.schema import PresetError
from grpo_tui.launch.supervisor import stop_run
from grpo_tui.runs.claim import RESUMING, RUNNING, claim_run
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import read_records
from grpo_tui.userinput import clip

# `grpo-tui resume RUN --detach` whose state check takes a second (a slow disk): two of them started
# together both pass the check unless something makes check-and-start one step.
SLOW_RESUME = """
import sys, time
from grpo_tui.launch import resume
judge = resume.judge
def slow_judge(*args, **kwargs):
    verdict = judge(*args, **kwargs)
    time.sleep(1.0)
    return verdict
resume.judge = slow_judge
from grpo_tui.cli import main
sys.exit(main(["resume", sys.argv[1], "--detach"]))
"""


def stopped_with_checkpoint(tmp_path: Path) -> RunDir:
    """A stopped fake-trainer run with a checkpoint: resumable; its resumed trainer steps until stopped."""
    run = fake_run(tmp_path, steps=10_000, step_s=0.05, mode="hang")
    run.update_status(status="stopped", ended=1.0, exit_code=0)
    (run.checkpoints / "checkpoint-3").mkdir(parents=True)
    (run.checkpoints / "checkpoint-3" / "trainer_state.json").write_text("{}")
    return run


def test_two_resumes_at_once_start_one_run(tmp_path: Path) -> None:
    run = stopped_with_checkpoint(tmp_path)
    try:
        race(run)
    finally:
        stop_run(run.path, force=True, grace=1.0)  # whatever a failed assertion left running


def race(run: RunDir) -> None:
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", SLOW_RESUME, str(run.path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=120) for proc in racers]
    results = [(proc.pid, proc.returncode, out, err) for proc, (out, err) in zip(racers, outputs, strict=True)]
    winners = [r for r in results if r[1] == 0]
    losers = [r for r in results if r[1] != 0]
    assert len(winners) == 1 and len(losers) == 1, results
    winner_pid, _, out, _ = winners[0]
    supervisor_pid = int(out.strip().rsplit("pid ", 1)[1].rstrip(")"))
    _, _, _, err = losers[0]
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0] in {f"{clip(str(run.path))} is being resumed by pid {pid}" for pid in (winner_pid, supervisor_pid)}

    wait_for(lambda: steps_logged(run) >= 2, "the resumed run's steps")
    # The supervisor holds the claim for the run's life: a resume now names it.
    with pytest.raises(PresetError) as info:
        claim_run(run, RESUMING)
    assert info.value.lines == [f"{clip(str(run.path))} is being resumed by pid {supervisor_pid}"]
    late = subprocess.run(
        [sys.executable, "-m", "grpo_tui.cli", "resume", str(run.path), "--detach"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert late.returncode != 0, late.stderr
    assert late.stderr.splitlines() == [f"{clip(str(run.path))} is being resumed by pid {supervisor_pid}"]

    stop_run(run.path)
    wait_for(lambda: run.read_status().get("status") == "stopped" and run.read_status().get("ended") != 1.0, "the stop")
    starts = [r for r in read_records(run.metrics) if r.get("event") == "start"]
    assert len(starts) == 1  # one process tree wrote the folder
    assert run.read_status()["pid"] == supervisor_pid
    wait_for(lambda: _claimable(run), "the claim to end with the supervisor")


def _claimable(run: RunDir) -> bool:
    try:
        claim_run(run, RUNNING).release()
    except PresetError:
        return False
    return True


def test_a_killed_supervisor_leaves_no_stale_claim(tmp_path: Path) -> None:
    run = fake_run(tmp_path, steps=10_000, step_s=0.05, mode="hang")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from grpo_tui.launch.supervisor import spawn_detached; print(spawn_detached(sys.argv[1]))",
            str(run.path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    pid = int(done.stdout)
    wait_for(lambda: steps_logged(run) >= 1, "a step")
    with pytest.raises(PresetError) as info:
        claim_run(run, RESUMING)
    assert info.value.lines == [f"{clip(str(run.path))} is being run by pid {pid}"]
    import os
    import signal

    os.kill(pid, signal.SIGKILL)
    try:
        wait_for(lambda: _claimable(run), "the kernel to drop the dead supervisor's claim")
        assert json.loads(run.lock.read_text())["pid"] == os.getpid()  # the last claimant, this test
    finally:
        os.killpg(run.read_status()["pgid"], signal.SIGKILL)  # the fake trainer does not watch its supervisor


def test_a_claimant_racing_the_holders_record_still_names_it(tmp_path: Path) -> None:
    import fcntl
    import os
    import threading

    from grpo_tui.runs import claim

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.lock.write_bytes(b"\xff\xfe{not a record")  # a previous holder's bytes, unreadable
    holder = os.open(run.lock, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the lock is taken, its record not written yet
        threading.Timer(0.2, claim._write_holder, (holder, RESUMING)).start()
        with pytest.raises(PresetError) as info:
            claim_run(run, RUNNING)
        assert info.value.lines == [f"{clip(str(run.path))} is being resumed by pid {os.getpid()}"]
        claim._write_holder(holder, RUNNING)  # a shorter record over a longer one reads whole
        assert claim._read_holder(holder) == {"pid": os.getpid(), "action": RUNNING}
    finally:
        os.close(holder)
