"""Run faults that need no real trainer: control.json whatever it holds,
failure reasons, a full disk, the process-group check, file modes and the rendezvous port.
The kill -9 tests on real tiny-cpu runs are in test_faults_e2e.py."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_runner import fake_run, steps_logged, wait_for

from grpo_tui import cli
from grpo_tui.config.store import load_preset
from grpo_tui.launch import supervisor as supervisor_module
from grpo_tui.launch.command import build_accelerate_config
from grpo_tui.launch.supervisor import Supervisor, run_foreground, stop_run
from grpo_tui.runs.failures import exception_line, failure_reason
from grpo_tui.runs.folder import RunDir, read_json, write_json_atomic
from grpo_tui.runs.metrics import MetricsWriter
from grpo_tui.train import control as control_module
from grpo_tui.train.control import MAX_CONTROL_BYTES, ControlReader, SupervisorWatch
from grpo_tui.train.entry import EXIT_ERROR, _report_failure

BAD_CONTROL = {
    "binary": bytes(range(256)) * 4,
    "deep": b"[" * 100_000,
    "huge": json.dumps({"request_id": 1, "stop": True, "pad": "x" * (MAX_CONTROL_BYTES + 1)}).encode(),
    "id_string": b'{"request_id": "abc", "loss_impl": "naive"}',
    "id_list": b'{"request_id": [1]}',
    "not_an_object": b"[1]",
    "stop_string": b'{"request_id": 7, "stop": "yes"}',
    "truncated": b'{"request_id": 7, "st',
}


@pytest.mark.parametrize("name", sorted(BAD_CONTROL))
def test_any_control_json_is_one_error_and_the_run_goes_on(tmp_path: Path, name: str) -> None:
    path = tmp_path / "control.json"
    reader = ControlReader(path)
    path.write_bytes(BAD_CONTROL[name])
    first = reader.poll()
    assert first.error and not first.stop and first.loss_impl is None
    assert len(first.error) < 200 and "\n" not in first.error
    assert reader.poll().empty  # reported once, not at every step
    write_json_atomic(path, {"request_id": 99, "stop": True})
    assert reader.poll().stop  # the next good request still works


def test_control_json_is_read_only_when_it_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "control.json"
    write_json_atomic(path, {"request_id": 1, "loss_impl": "naive"})
    reader, opened = ControlReader(path), []
    real_open = open
    monkeypatch.setattr(control_module, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k), raising=False)
    assert reader.poll().loss_impl == "naive"
    for _ in range(5):
        assert reader.poll().empty
    assert len(opened) == 1
    os.replace(tmp_path / "control.json", tmp_path / "old.json")
    (tmp_path / "control.json").mkdir()  # not a regular file: never opened (a FIFO would block)
    assert "not a regular file" in (reader.poll().error or "") and len(opened) == 1


@pytest.mark.parametrize(
    "content", [b'{"request_id": "abc"}', b"[1]", b'{"request_id": [1]}', b"\xff\xfe", b"[" * 100_000]
)
def test_the_escape_hatches_rewrite_any_control_json(tmp_path: Path, content: bytes, capsys) -> None:
    run = RunDir.create(tmp_path / "runs", "x")
    run.update_status(status="running", pid=os.getpid(), pid_started=psutil.Process().create_time())
    reader = ControlReader(run.control)
    run.control.write_bytes(content)
    reader.poll()  # the trainer saw the bad file (its error)
    assert cli.main(["control", str(run.path), "--loss-impl", "naive"]) == 0
    decision = reader.poll()
    assert decision.loss_impl == "naive" and not decision.error
    assert cli.main(["control", str(run.path), "--stop", "--force"]) == 0
    assert reader.poll().stop
    assert "Traceback" not in capsys.readouterr().err
    assert read_json(run.control)["kill"] is True


def test_a_kept_bad_request_does_not_spoil_the_next(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "runs", "x")
    write_json_atomic(run.control, {"request_id": 3, "stop": "maybe", "loss_impl": "fast"})
    control = run.request(loss_impl="trl")
    assert control["request_id"] == 4 and "stop" not in control and control["loss_impl"] == "trl"


def test_read_json_never_raises_for_content(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    for content in (b"[" * 100_000, bytes(range(256)), b'{"a": "' + b"x" * 200_000 + b'"}'):
        path.write_bytes(content)
        assert read_json(path) is None


def test_kill_signals_and_errno_are_named_in_the_reason(tmp_path: Path) -> None:
    log, metrics = tmp_path / "stdout.log", tmp_path / "metrics.jsonl"
    log.write_text(
        "Traceback (most recent call last):\n  ...\nRuntimeError:\n"
        "subprocess.CalledProcessError: Command '['python', '-m', 'grpo_tui.train']' died with <Signals.SIGKILL: 9>.\n"
    )
    assert failure_reason(metrics, log, 1).startswith("the trainer was killed by SIGKILL")
    log.write_text(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n  error_file: <N/A>\n"
        "  traceback : Signal 15 (SIGTERM) received by PID 4242\n"
    )
    assert failure_reason(metrics, log, 1) == "the trainer was killed by SIGTERM"
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/r/metrics.jsonl")
    assert exception_line(full) == "ENOSPC: No space left on device: /runs/r/metrics.jsonl"
    try:
        next(iter([]))
    except StopIteration as exc:
        line = exception_line(exc)
    assert "StopIteration" not in line and "test_faults.py" in line


def test_a_full_disk_is_one_line_not_a_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    run = fake_run(tmp_path, steps=2, mode="error")
    supervisor = Supervisor(run)
    supervisor.start()

    def no_space(self, **fields):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.status))

    monkeypatch.setattr(RunDir, "update_status", no_space)
    assert supervisor.wait() == 1
    err = capsys.readouterr().err
    assert "ENOSPC" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


class _Usage:
    total, used, free = 10**9, 10**9, 0


def test_a_full_disk_names_enospc_in_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = fake_run(tmp_path, steps=2, mode="crash")
    monkeypatch.setattr(supervisor_module.shutil, "disk_usage", lambda path: _Usage())
    assert run_foreground(run.path, out=open(os.devnull, "w")) == 1
    assert "ENOSPC" in run.read_status()["reason"]


def test_the_trainer_survives_failing_to_record_its_error(tmp_path: Path, capsys) -> None:
    class FullWriter(MetricsWriter):
        def write(self, record):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    writer = FullWriter(tmp_path / "metrics.jsonl")
    try:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "metrics.jsonl"))
    except OSError as exc:
        assert _report_failure(exc, writer, None) == EXIT_ERROR
    assert "ENOSPC" in capsys.readouterr().err


def test_supervisor_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SupervisorWatch({}).lost() is None  # started by hand: never told to stop
    me = psutil.Process()
    env = {"GRPO_TUI_SUPERVISOR_PID": str(me.pid), "GRPO_TUI_SUPERVISOR_STARTED": repr(me.create_time())}
    assert SupervisorWatch(env).lost() is None
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(gone.pid).create_time()
    gone.wait()
    env = {"GRPO_TUI_SUPERVISOR_PID": str(gone.pid), "GRPO_TUI_SUPERVISOR_STARTED": repr(started)}
    assert f"pid {gone.pid}" in SupervisorWatch(env).lost()
    env["GRPO_TUI_SUPERVISOR_PID"] = str(me.pid)  # a live pid, but not the process recorded
    assert SupervisorWatch(env).lost() is not None


@pytest.fixture
def stranger():
    """A process group that is not any run's."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("record", ["no_identity", "stale_pgid"])
def test_force_never_signals_a_group_that_is_not_the_runs(tmp_path: Path, stranger, record: str) -> None:
    run = RunDir.create(tmp_path / "runs", "x")
    me = psutil.Process()
    if record == "no_identity":  # an old or hand-edited run.json: a pid, nothing to check it against
        run.update_status(status="running", pgid=stranger.pid, child_pid=stranger.pid, child_started=None)
    else:  # the launcher recorded is alive, but the pgid beside it is stale
        run.update_status(status="running", pgid=stranger.pid, child_pid=me.pid, child_started=me.create_time())
    message = stop_run(run.path, force=True, grace=0.5)
    assert "nothing to kill" in message
    time.sleep(0.2)
    assert stranger.poll() is None


def test_run_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        run = fake_run(tmp_path, steps=2)
        assert run_foreground(run.path, out=open(os.devnull, "w")) == 0
        run.request(stop=True)
        with MetricsWriter(run.path / "completions-like.jsonl"):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700
    for path in run.path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_one_machine_runs_get_a_free_port_not_29500() -> None:
    preset, _ = load_preset("tiny-cpu")
    two = preset.model_copy(update={"distributed": preset.distributed.model_copy(update={"num_processes": 2})})
    assert build_accelerate_config(two)["main_process_port"] == 0  # accelerate picks a free one per run
    chosen = two.model_copy(update={"distributed": two.distributed.model_copy(update={"main_process_port": 29731})})
    assert build_accelerate_config(chosen)["main_process_port"] == 29731


def test_the_launcher_killed_leaves_no_rank_behind(tmp_path: Path) -> None:
    """The fake trainer in place of the launcher's child: kill -9 the launcher, its ranks must go too."""
    run = fake_run(tmp_path, steps=10_000, step_s=0.05, mode="hang")
    command = json.loads(run.command.read_text())
    # a stand-in launcher: starts the trainer as its child (same process group) and waits
    launcher = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
    command["argv"] = [sys.executable, "-c", launcher, *command["argv"]]
    run.command.write_text(json.dumps(command))
    supervisor = Supervisor(run)
    supervisor.start()
    try:
        wait_for(lambda: steps_logged(run) >= 1, "a step")
        trainer = [p.pid for p in psutil.Process(supervisor.proc.pid).children()]
        os.kill(supervisor.proc.pid, signal.SIGKILL)
        assert supervisor.wait() == 128 + signal.SIGKILL
        status = run.read_status()
        assert status["status"] == "failed" and "SIGKILL" in status["reason"]
        assert trainer and not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in trainer)
    finally:  # a failing run of this test leaves no trainer behind either
        try:
            os.killpg(supervisor.proc.pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("launcher_started", ["before", "after"])
def test_force_signals_ranks_in_their_own_sessions_only_when_they_are_the_runs(
    tmp_path: Path, stranger, launcher_started: str
) -> None:
    """torchrun starts each rank of a multi-process run in a session of its own: `--stop --force` signals those
    groups too, but only for a rank named by the start event and created after the launcher."""
    run = RunDir.create(tmp_path / "runs", "x")
    created = psutil.Process(stranger.pid).create_time()
    launcher = created - 0.5 if launcher_started == "before" else created + 5.0
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # the launcher: already exited, its pid recorded
    gone.wait()
    run.update_status(status="running", pgid=gone.pid, child_pid=gone.pid, child_started=launcher)
    start = {"v": 1, "time": created + 10.0, "event": "start", "ranks": [{"rank": 0, "pid": stranger.pid}]}
    run.metrics.write_text(json.dumps(start) + "\n")
    message = stop_run(run.path, force=True, grace=0.5)
    if launcher_started == "before":  # the rank of this run: its own group is ended
        assert message.endswith(f"process group {stranger.pid} killed")
        assert stranger.wait(timeout=5) != 0
    else:  # a process older than the run's launcher is not its rank, whatever the stream says
        assert "nothing to kill" in message
        time.sleep(0.2)
        assert stranger.poll() is None
