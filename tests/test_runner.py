"""The runner and its supervisor, with tests/fake_trainer.py in place of the real trainer.

The fake keeps the trainer's side of the contract (metrics.jsonl records, control.json stop), so
these tests need no torch and take seconds. Waits poll for a state with a generous deadline; no
test asserts on durations.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from grpo_tui.config.schema import PresetError
from grpo_tui.config.store import load_preset
from grpo_tui.launch.progress import format_step
from grpo_tui.launch.supervisor import prepare_run, run_foreground, stop_run
from grpo_tui.runs.failures import failure_reason
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import read_records, step_records
from grpo_tui.runs.status import judge

FAKE = str(Path(__file__).with_name("fake_trainer.py"))
DEADLINE_S = 60.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def fake_run(tmp_path: Path, steps: int = 5, step_s: float = 0.02, mode: str = "", ignore_stop: bool = False) -> RunDir:
    """A prepared tiny-cpu run whose launch command starts the fake trainer."""
    preset, _ = load_preset("tiny-cpu")
    run = prepare_run(preset, [f"grpo.max_steps={steps}"], tmp_path / "runs")
    command = json.loads(run.command.read_text())
    command["argv"] = [sys.executable, FAKE, "--run-dir", str(run.path)]
    command["env"].update(FAKE_TRAINER_MODE=mode, FAKE_TRAINER_STEP_S=str(step_s))
    if ignore_stop:
        command["env"]["FAKE_TRAINER_IGNORE_STOP"] = "1"
    run.command.write_text(json.dumps(command))
    return run


def steps_logged(run: RunDir) -> int:
    return len(step_records(read_records(run.metrics)))


FOREGROUND = "import sys; from grpo_tui.launch.supervisor import run_foreground; sys.exit(run_foreground(sys.argv[1]))"


def start_foreground(run: RunDir) -> subprocess.Popen[str]:
    """`grpo-tui run --headless` minus preset resolution: the supervisor in a child we can signal."""
    return subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, str(run.path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_prepare_run_writes_the_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n')
    preset, _ = load_preset("tiny-cpu")
    run = prepare_run(preset, ["grpo.max_steps=3", "data.source=train.jsonl"])
    assert run.path.parent == tmp_path / "runs" and run.name.endswith("-tiny-cpu")

    resolved = run.load_preset()
    assert resolved.grpo.max_steps == 3
    assert resolved.data.source == str(data)  # made absolute: the trainer may run elsewhere
    assert resolved.logging.runs_dir == str(tmp_path / "runs")
    command = json.loads(run.command.read_text())
    assert command["argv"][-2:] == ["--run-dir", str(run.path)] and command["env"]["ACCELERATE_USE_CPU"] == "true"
    assert run.accelerate_config.is_file()
    assert run.read_status()["status"] == "starting"


def test_prepare_run_refuses_failed_checks(tmp_path: Path) -> None:
    preset, _ = load_preset("tiny-cpu")
    with pytest.raises(PresetError) as info:
        prepare_run(preset, ["grpo.per_device_batch_size=3"], tmp_path / "runs")
    assert info.value.lines[0].startswith("grpo.num_generations: got 8; must divide the generation batch")
    assert not (tmp_path / "runs").exists()


def test_run_to_completion(tmp_path: Path) -> None:
    run = fake_run(tmp_path, steps=5)
    out = io.StringIO()
    assert run_foreground(run.path, out=out) == 0
    status = run.read_status()
    assert status["status"] == "finished" and status["exit_code"] == 0
    assert status["child_pid"] == status["pgid"] and status["pid"] == os.getpid()
    lines = out.getvalue().splitlines()
    step_lines = [line for line in lines[:-1] if line.startswith("[")]
    assert [line.split()[1] for line in step_lines] == ["1/5", "2/5", "3/5", "4/5", "5/5"]
    assert lines[-1].startswith("[####################] 5/5 steps, finished")
    assert "fake trainer starting" in run.stdout.read_text()


def test_sigint_once_stops_gracefully(tmp_path: Path) -> None:
    run = fake_run(tmp_path, steps=10_000, step_s=0.05, mode="hang")
    proc = start_foreground(run)
    wait_for(lambda: steps_logged(run) >= 2, "two steps")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0, err
    assert "stopping at the next step boundary (Ctrl-C again to kill)" in out
    assert "Traceback" not in err
    status = run.read_status()
    assert status["status"] == "stopped" and status["exit_code"] == 0
    records = read_records(run.metrics)
    steps = [r["step"] for r in step_records(records)]
    assert steps == list(range(1, len(steps) + 1))  # every step intact, none torn
    assert records[-1]["event"] == "stop_requested"


def test_sigint_twice_kills_the_process_group(tmp_path: Path) -> None:
    run = fake_run(tmp_path, steps=10_000, step_s=0.05, mode="hang", ignore_stop=True)
    proc = start_foreground(run)
    wait_for(lambda: steps_logged(run) >= 2, "two steps")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: run.control.exists(), "the stop request")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode != 0
    assert "Traceback" not in err
    status = run.read_status()
    assert status["status"] == "stopped" and "killed" in status["reason"]
    with pytest.raises(ProcessLookupError):
        os.killpg(status["pgid"], 0)  # nothing left in the trainer's group


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("error", "run failed: RuntimeError: reward function raised at step 2"),
        (
            "oom",
            "run failed: out of memory in the generation phase at step 2: set grpo.generation_sub_batch "
            "(generate fewer completions at a time), or try a smaller grpo.per_device_batch_size",
        ),
        ("crash", "run failed: ValueError: fake trainer blew up at step 2"),
        ("selfkill", "run failed: the trainer was killed by SIGKILL (the system may have run out of host memory)"),
    ],
)
def test_failure_prints_one_line_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, expected: str
) -> None:
    run = fake_run(tmp_path, steps=5, mode=mode)
    code = run_foreground(run.path, out=io.StringIO())
    assert code != 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected), err
    status = run.read_status()
    assert status["status"] == "failed"
    assert code == (137 if mode == "selfkill" else status["exit_code"])  # 128 + SIGKILL, as a shell says
    assert f"run failed: {status['reason']}" == lines[0]


DETACH = "import sys; from grpo_tui.launch.supervisor import spawn_detached; print(spawn_detached(sys.argv[1]))"


def detach_from_short_lived_parent(run: RunDir) -> int:
    """spawn_detached from a parent process that exits at once, as the app does when it quits."""
    done = subprocess.run([sys.executable, "-c", DETACH, str(run.path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def test_detached_run_survives_its_parent(tmp_path: Path) -> None:
    run = fake_run(tmp_path, steps=20, step_s=0.05)
    pid = detach_from_short_lived_parent(run)
    wait_for(lambda: run.read_status().get("status") == "finished", "the detached run to finish")
    status = run.read_status()
    assert status["pid"] == pid and status["exit_code"] == 0
    assert steps_logged(run) == 20
    assert os.getsid(0) != status["pgid"]  # the trainer had its own session


def test_stop_run_graceful_and_forced(tmp_path: Path) -> None:
    graceful = fake_run(tmp_path, steps=10_000, step_s=0.05, mode="hang")
    detach_from_short_lived_parent(graceful)
    wait_for(lambda: steps_logged(graceful) >= 1, "a step")
    assert "stop requested" in stop_run(graceful.path)
    wait_for(lambda: graceful.read_status().get("status") == "stopped", "the graceful stop")
    assert graceful.read_status()["exit_code"] == 0

    stubborn = fake_run(tmp_path, steps=10_000, step_s=0.05, mode="hang", ignore_stop=True)
    detach_from_short_lived_parent(stubborn)
    wait_for(lambda: steps_logged(stubborn) >= 1, "a step")
    assert "killed" in stop_run(stubborn.path, force=True, grace=2.0)
    wait_for(lambda: stubborn.read_status().get("status") == "stopped", "the forced stop")
    assert "killed" in stubborn.read_status()["reason"]


def test_status_flags_a_vanished_supervisor(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "ghost")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run.update_status(status="running", pid=gone.pid, pid_started=time.time() - 3600)
    # "lost", as the runs list has always said (the old CLI-only judgement said "failed"): nothing
    # recorded an outcome, so the stream would tell, and it has no end
    state, reason = judge(run.path)
    assert state == "lost" and "supervisor" in reason
    run.update_status(pid=os.getpid(), pid_started=None)
    assert judge(run.path).state == "running"


def test_failure_reason_skips_launcher_wrappers(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_text(
        "Traceback (most recent call last):\n  File x\nKeyError: 'answer'\n"
        "Traceback (most recent call last):\nsubprocess.CalledProcessError: Command '[...]' returned non-zero exit status 1.\n"
    )
    assert failure_reason(tmp_path / "metrics.jsonl", log) == "KeyError: 'answer'"
    log.write_text("some output\nlast words\n")
    assert failure_reason(tmp_path / "metrics.jsonl", log) == "last words"


def test_format_step_shows_gpu_peak_and_impl() -> None:
    record = {
        "step": 3,
        "reward": 0.5,
        "loss": 0.25,
        "kl": 0.01,
        "step_time": 1.5,
        "loss_impl": "chunked",
        "memory": {"device": "cuda", "gpus": [{"peak_mib": 900.0}, {"peak_mib": 1200.4}], "rss_mib": 5.0},
    }
    assert format_step(record, 10) == (
        "[######..............] 3/10 reward 0.500 loss 0.25 kl 0.01 1.50 s/step peak 1200 MiB chunked"
    )
