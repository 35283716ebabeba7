"""Run folders, the supervisor around the accelerate subprocess, detached start and stop.

The supervisor (`supervise`) is the one piece that starts the trainer: in the foreground (`grpo-tui
run --headless`) it runs in this process; for the TUI it runs as `python -m grpo_tui.cli supervise
RUN_DIR` in its own session (`spawn_detached`), so closing the app leaves the run going. Either way
the trainer runs in its own process group, its output goes to stdout.log, and run.json records
pids, status and the exit code. Whether a run is alive, and its status, is `runs.status.judge`'s
to say: this module only supervises.

No trainer outlives its run's tracking: when the launcher exits (or is killed) the supervisor ends
whatever is left in the run's process group, and the trainer stops itself at its next step boundary
when the supervisor is gone (its pid and create time are passed in the environment).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from grpo_tui.config.checks import check_preset
from grpo_tui.config.overrides import apply_overrides
from grpo_tui.config.schema import Preset, PresetError
from grpo_tui.config.store import dump_preset
from grpo_tui.launch.command import build_launch_command, launch_env, per_node_commands, write_accelerate_config
from grpo_tui.launch.process_group import group_members, process_identity, rank_groups, run_group, terminate_groups
from grpo_tui.launch.progress import ProgressPrinter
from grpo_tui.runs.claim import RUNNING, RunClaim, claim_run
from grpo_tui.runs.failures import failure_reason, signal_name
from grpo_tui.runs.folder import RunDir, open_private, read_json, write_private_text
from grpo_tui.runs.metrics import MetricsTail
from grpo_tui.runs.status import SUPERVISOR_PID_ENV, SUPERVISOR_STARTED_ENV, RunStatus
from grpo_tui.userinput import clip, user_path

# Seconds between SIGTERM and SIGKILL when a process group is killed.
KILL_GRACE_S = 5.0
# How often the supervisor polls the child and the metrics file.
POLL_S = 0.2
STOP_HINT = "stopping at the next step boundary (Ctrl-C again to kill)"


def prepare_run(
    preset: Preset, overrides: list[str] | None = None, runs_dir: Path | str | None = None, check: bool = True
) -> RunDir:
    """Create runs/<timestamp>-<preset>/ with config.toml, accelerate.yaml, command.json and run.json.

    Raises PresetError (one line per problem) for bad overrides, failed cross-field checks or a runs
    folder that cannot be written; then no run folder is left behind.
    """
    preset = apply_overrides(preset, overrides or [])
    preset = _absolute_paths(preset, runs_dir)
    if check:
        result = check_preset(preset)
        if result.errors:
            raise PresetError(result.errors)
    # Encoded before the folder exists: text that cannot be written refuses the start, leaving nothing.
    config = dump_preset(preset)
    config.encode("utf-8")
    where = clip(preset.logging.runs_dir)
    try:
        run = RunDir.create(Path(preset.logging.runs_dir), preset.name)
    except OSError as exc:
        raise PresetError([f"logging.runs_dir: cannot create a run folder in {where}: {exc.strerror}"]) from None
    try:
        write_private_text(run.config, config)
        write_accelerate_config(preset, run.accelerate_config)
        command: dict[str, Any] = {
            "argv": build_launch_command(preset, run.path),
            "env": launch_env(preset),
            "cwd": os.getcwd(),
        }
        if preset.distributed.num_machines > 1:
            command["per_node"] = per_node_commands(preset, run.path)
        write_private_text(run.command, json.dumps(command, indent=1) + "\n")
        run.update_status(preset=preset.name, status=RunStatus.STARTING, created=time.time())
    except BaseException as exc:
        shutil.rmtree(run.path, ignore_errors=True)  # a half-written folder would list as a run that never starts
        if isinstance(exc, OSError):
            raise PresetError([f"logging.runs_dir: cannot write the run folder in {where}: {exc.strerror}"]) from None
        raise
    return run


def _absolute_paths(preset: Preset, runs_dir: Path | str | None) -> Preset:
    """Resolve paths the trainer reads: it may run with another working directory."""
    logging = preset.logging.model_copy(update={"runs_dir": str(Path(runs_dir or preset.logging.runs_dir).resolve())})
    update: dict[str, Any] = {"logging": logging}
    source = user_path(preset.data.source)
    if not preset.data.source.startswith("builtin:") and source.exists():
        update["data"] = preset.data.model_copy(update={"source": str(source.resolve())})
    model = user_path(preset.model.name_or_path)
    if not preset.model.name_or_path.startswith("builtin:") and model.exists():
        update["model"] = preset.model.model_copy(update={"name_or_path": str(model.resolve())})
    return preset.model_copy(update=update)


class Supervisor:
    """Starts the trainer for a prepared run folder, waits for it, and records the outcome."""

    def __init__(self, run: RunDir, on_records: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.run = run
        self.on_records = on_records
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False
        self._kill_lock = threading.Lock()
        self._stream_offset = 0  # where this attempt's records start (a resumed run's stream has earlier ones)

    def start(self) -> None:
        command = read_json(self.run.command) or {}
        argv = command.get("argv")
        if not isinstance(argv, list) or not argv:
            raise PresetError([f"{self.run.command}: no launch command recorded"])
        env = {**os.environ, **{str(k): str(v) for k, v in (command.get("env") or {}).items()}}
        cwd = command.get("cwd") if command.get("cwd") and Path(command["cwd"]).is_dir() else None
        me = process_identity(os.getpid())
        if me is not None:  # the trainer stops itself once this process is gone (train/control.py)
            env.update({SUPERVISOR_PID_ENV: str(os.getpid()), SUPERVISOR_STARTED_ENV: repr(me)})
        self.run.update_status(status=RunStatus.STARTING, pid=os.getpid(), pid_started=me, started=time.time())
        if self.killed:  # killed before it started: start nothing
            raise OSError("the run was killed before the trainer started")
        try:
            self._stream_offset = self.run.metrics.stat().st_size
        except FileNotFoundError:
            self._stream_offset = 0
        with open_private(self.run.stdout, "ab") as log:
            # Own session = own process group: a terminal's Ctrl-C reaches only us, and one killpg
            # reaches every rank accelerate starts.
            self.proc = subprocess.Popen(
                [str(a) for a in argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )
        child = self.proc.pid
        self.run.update_status(
            status=RunStatus.RUNNING, child_pid=child, child_started=process_identity(child), pgid=child
        )

    def wait(self) -> int:
        """Wait for the trainer; returns this command's exit code and writes the final status."""
        assert self.proc is not None, "start() first"
        tail = MetricsTail(self.run.metrics, offset=self._stream_offset)
        while True:
            try:
                code = self.proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            finally:
                if self.on_records is not None:
                    self.on_records(tail.read_new())
        # The launcher is gone; ranks it left behind (it was killed) must not train on untracked, in its group
        # or (multi-process runs) in the sessions torchrun gave them.
        groups = [self.proc.pid, *rank_groups(self.run, self.proc.pid)]
        orphans = bool(group_members(*groups))
        if orphans:
            terminate_groups(groups, lambda: bool(group_members(*groups)), KILL_GRACE_S)
        return self._finish(code, orphans)

    def _finish(self, code: int, orphans: bool = False) -> int:
        control = read_json(self.run.control) or {}
        stop_requested = control.get("stop") is True
        fields: dict[str, Any] = {"ended": time.time(), "exit_code": code}
        if code == 0:
            status, result = (RunStatus.STOPPED if stop_requested else RunStatus.FINISHED), 0
            fields["reason"] = "stopped on request" if stop_requested else None
        elif self.killed or (stop_requested and control.get("kill") is True):
            status, result = RunStatus.STOPPED, _shell_code(code)
            fields["reason"] = "killed on request before the trainer finished"
        elif code < 0 and orphans:
            status, result = RunStatus.FAILED, _shell_code(code)
            fields["reason"] = f"the launcher was killed by {signal_name(-code)}; the ranks it left were stopped"
        else:
            status, result = RunStatus.FAILED, _shell_code(code)
            fields["reason"] = _with_disk_note(failure_reason(self.run.metrics, self.run.stdout, code), self.run.path)
        record_status(self.run, status=status, **fields)
        return result

    def request_stop(self) -> None:
        self.run.request(stop=True)

    def kill(self, grace: float = KILL_GRACE_S) -> None:
        """SIGTERM the trainer's process group, SIGKILL it after `grace` seconds if still there."""
        with self._kill_lock:
            self.killed = True
            if self.proc is None or self.proc.poll() is not None:
                return
            proc = self.proc
        terminate_groups([proc.pid, *rank_groups(self.run, proc.pid)], lambda: proc.poll() is None, grace)


def record_status(run: RunDir, **fields: Any) -> bool:
    """`run.update_status`, but a failed write (a full disk) is one line on stderr, not a traceback."""
    try:
        run.update_status(**fields)
        return True
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, "error")
        print(
            f"grpo-tui: cannot record {fields.get('status')} in {run.status} ({name}: {exc.strerror})", file=sys.stderr
        )
        return False


# Free bytes under which a failed run's reason says the disk is full (reserved blocks leave a little).
DISK_FULL_BYTES = 1024 * 1024


def _with_disk_note(reason: str, path: Path) -> str:
    """The reason, naming ENOSPC when the run folder's disk is full and the reason does not say so."""
    try:
        full = shutil.disk_usage(path).free < DISK_FULL_BYTES
    except OSError:
        full = False
    if full and "ENOSPC" not in reason and "No space left" not in reason:
        return f"{reason} (ENOSPC: the disk holding the run folder is full)"
    return reason


def _shell_code(code: int) -> int:
    """A child killed by signal N (Popen's -N) exits 128 + N, as a shell reports it."""
    return 128 - code if code < 0 else code


def supervise(
    run_dir: Path, echo: TextIO | None = None, interactive: bool = False, claim: RunClaim | None = None
) -> int:
    """Run the trainer of a prepared folder to the end; the body of `run` and of a detached run.

    `claim` is the run's lock taken by the caller (runs/claim.py); without one it is taken here
    (PresetError, one line, when another process holds it). It is released when the run has ended
    and its final status is written. With `echo`, progress lines go there. With `interactive`, the first SIGINT asks for a graceful
    stop and the second kills; otherwise SIGINT and SIGTERM kill at once (a detached supervisor is
    only signalled by someone who wants it gone). SIGHUP always kills: the terminal is gone.
    """
    run = RunDir(Path(run_dir).resolve())
    claim = claim if claim is not None else claim_run(run, RUNNING)
    try:
        return _supervise(run, echo, interactive)
    finally:
        claim.release()


def _supervise(run: RunDir, echo: TextIO | None, interactive: bool) -> int:
    printer: ProgressPrinter | None = None
    if echo is not None:
        printer = ProgressPrinter(run.load_preset().grpo.max_steps, echo)
    supervisor = Supervisor(run, printer.feed if printer else None)
    interrupts = 0
    killers: list[threading.Thread] = []

    def on_interrupt(signum: int, frame: object) -> None:
        nonlocal interrupts
        interrupts += 1
        if interactive and signum == signal.SIGINT and interrupts == 1:
            supervisor.request_stop()
            if echo is not None:
                print(STOP_HINT, file=echo, flush=True)
            return
        if echo is not None:
            print("killing the run's process group", file=echo, flush=True)
        # Off the signal handler: kill() sleeps through the grace period.
        killers.append(threading.Thread(target=supervisor.kill, daemon=True))
        killers[-1].start()

    previous = _install_handlers(on_interrupt)
    try:
        try:
            supervisor.start()
        except OSError as exc:  # the interpreter or launcher could not be started at all
            status = RunStatus.STOPPED if supervisor.killed else RunStatus.FAILED
            record_status(
                run, status=status, ended=time.time(), exit_code=None, reason=f"cannot start the trainer: {exc}"
            )
            print(f"run {status}: cannot start the trainer: {exc}", file=sys.stderr, flush=True)
            return 1
        code = supervisor.wait()
        # The launcher may exit before its ranks: let the kill reach its final SIGKILL.
        for killer in killers:
            killer.join(KILL_GRACE_S + 1.0)
    finally:
        _restore_handlers(previous)
    if printer is not None and echo is not None:
        status = run.read_status()
        print(printer.summary(str(status.get("status"))), file=echo, flush=True)
        if status.get("status") == RunStatus.FAILED and status.get("reason"):
            print(f"run failed: {status['reason']}", file=sys.stderr, flush=True)
    return code


def _install_handlers(handler: Callable[[int, object], None]) -> dict[int, Any]:
    previous = {}
    if threading.current_thread() is not threading.main_thread():
        return previous  # signals can only be handled in the main thread
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, handler)
    return previous


def _restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def run_foreground(
    run_dir: Path, headless: bool = True, out: TextIO | None = None, claim: RunClaim | None = None
) -> int:
    """Supervise in this process, printing progress (headless) to `out` (stdout by default)."""
    run = RunDir(Path(run_dir).resolve())
    claim = claim if claim is not None else claim_run(run, RUNNING)  # before the first line: a refusal is one line
    echo = (out or sys.stdout) if headless else None
    if echo is not None:
        print(f"run folder: {run_dir}", file=echo, flush=True)
    return supervise(run.path, echo=echo, interactive=True, claim=claim)


def spawn_detached(run_dir: Path, claim: RunClaim | None = None) -> int:
    """Start `python -m grpo_tui.cli supervise RUN_DIR` in its own session; returns its pid.

    The run's claim (taken here when the caller holds none; PresetError when someone else does) passes
    to that process, which holds it for the run's life.
    """
    run = RunDir(Path(run_dir).resolve())
    claim = claim if claim is not None else claim_run(run, RUNNING)
    assert claim.fd is not None, "a released claim"
    try:
        with open_private(run.stdout, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "grpo_tui.cli", "supervise", str(run.path), "--lock-fd", str(claim.fd)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(claim.fd,),
            )
    finally:
        claim.handed_on()
    # Reap it when it ends, so a long-lived parent (the TUI) keeps no zombie around. The supervisor
    # records its own pid in run.json (writing it here too would race with its updates).
    threading.Thread(target=proc.wait, daemon=True).start()
    return proc.pid


def stop_run(run_dir: Path, force: bool = False, grace: float = KILL_GRACE_S) -> str:
    """Ask a run to stop at its next step boundary; with `force`, kill its process group.

    Returns a one-line description of what was done.
    """
    run = RunDir(Path(run_dir).resolve())
    if not force:
        run.request(stop=True)
        return f"{run.name}: stop requested; the trainer stops at its next step boundary"
    run.request(stop=True, kill=True)
    pgid = run_group(run)
    groups = ([] if pgid is None else [pgid]) + rank_groups(run, pgid)
    if not groups:
        return f"{run.name}: no live process group of this run found; nothing to kill"
    terminate_groups(groups, lambda: bool(group_members(*groups)), grace)
    return f"{run.name}: process group{'s' if len(groups) > 1 else ''} {', '.join(map(str, groups))} killed"
