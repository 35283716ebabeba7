"""A run's claim: one exclusive lock on RUN/run.lock, held by the one supervisor that drives the run.

Whoever starts a supervisor for a run folder (`run`, `resume`, the app's start and resume keys) takes
the lock before it checks or changes anything, and hands the open descriptor to the supervisor, which
holds it until it exits. Checking a run's state and starting its trainer are then one step: a second
`resume` (or the app's resume key) racing the first gets one line naming the holder, and two process
trees never write one folder. The kernel drops the lock when its last holder is gone, however it
ends (kill -9 included), so a stale lock never outlives its run.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from grpo_tui.config.schema import PresetError
from grpo_tui.runs.folder import PRIVATE_FILE_MODE, RunDir
from grpo_tui.userinput import clip

# What the holder is doing, as the refusal names it.
RESUMING = "resumed"
RUNNING = "run"
SETTLING = "settled"  # a reader recording the outcome of a run no supervisor drives (status.settle)
# Largest holder record read back: a pid and a word.
MAX_HOLDER_BYTES = 256
# How long a claimant waits for a holder that has the lock but has not written its record yet.
HOLDER_WAIT_S = 1.0


class RunClaim:
    """The lock on one run folder, held through an open descriptor (`fd`) until released or handed on."""

    def __init__(self, run: RunDir, fd: int, action: str) -> None:
        self.run = run
        self.fd: int | None = fd
        self.action = action

    def release(self) -> None:
        """Drop the lock (a no-op once released or handed on)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def handed_on(self) -> None:
        """A child process holds the descriptor now: close this process's copy, the lock stays."""
        self.release()

    def __enter__(self) -> RunClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_run(run: RunDir, action: str) -> RunClaim:
    """Take `run`'s lock for `action` (RESUMING or RUNNING); PresetError (one line) when someone holds it."""
    try:
        fd = os.open(run.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    except OSError as exc:
        raise PresetError([f"{clip(str(run.path))}: cannot open {run.lock.name} ({exc.strerror})"]) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # The holder writes its record just after taking the lock: a claimant racing it may read nothing yet
        deadline = time.monotonic() + HOLDER_WAIT_S
        while not (holder := _read_holder(fd)) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.close(fd)
        raise PresetError([busy_message(run.path, holder)]) from None
    except OSError as exc:
        os.close(fd)
        raise PresetError([f"{clip(str(run.path))}: cannot lock {run.lock.name} ({exc.strerror})"]) from None
    _write_holder(fd, action)
    return RunClaim(run, fd, action)


def adopt_claim(run: RunDir, fd: int) -> RunClaim:
    """The claim a parent handed to this process as descriptor `fd`; records this process as the holder.

    Raises PresetError when `fd` does not hold `run`'s lock (a bad --lock-fd).
    """
    try:
        same = os.fstat(fd).st_ino == os.stat(run.lock).st_ino
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours already: succeeds at once
    except OSError:
        same = False
    if not same:
        raise PresetError([f"{clip(str(run.path))}: descriptor {fd} is not this run's {run.lock.name}"])
    holder = _read_holder(fd)
    action = holder.get("action") if isinstance(holder.get("action"), str) else RUNNING
    os.set_inheritable(fd, False)  # the trainer must not hold it: the lock ends with the supervisor
    _write_holder(fd, action)
    return RunClaim(run, fd, action)


def busy_message(path: Path, holder: dict[str, object]) -> str:
    """The one line a claimant gets when the run is held."""
    pid = holder.get("pid")
    action = holder.get("action") if holder.get("action") in (RESUMING, RUNNING, SETTLING) else RUNNING
    who = f"pid {pid}" if isinstance(pid, int) and not isinstance(pid, bool) else "another process"
    return f"{clip(str(path))} is being {action} by {who}"


def _write_holder(fd: int, action: str) -> None:
    # Written over the old record, then cut to its length: a reader never finds the file empty, and its first
    # line is always one whole record. Best effort: on a full disk the lock holds, only the refusal's pid is missing.
    record = (json.dumps({"pid": os.getpid(), "action": action}) + "\n").encode()
    try:
        os.pwrite(fd, record, 0)
        os.ftruncate(fd, len(record))
    except OSError:
        pass


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, MAX_HOLDER_BYTES, 0).split(b"\n", 1)[0].decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
