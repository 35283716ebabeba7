"""Failure wording shared by the trainer, the supervisor, the status judgement and the dashboard.

Lives in the run-folder layer so that the trainer (which writes the events) and the UI (which shows
them) use the same words without importing each other.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import traceback
from pathlib import Path
from typing import Any

from grpo_tui.runs.metrics import read_records

# What to try when a phase runs out of memory, in the order that usually helps most.
OOM_ADVICE = (
    "try a smaller grpo.per_device_batch_size (with more grpo.gradient_accumulation_steps), "
    "loss.impl=chunked, or LoRA (peft.enabled=true)"
)
# Launcher wrappers whose "error" only says that the child failed: the cause is further up.
_WRAPPER_ERRORS = ("CalledProcessError", "ChildFailedError")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit))(:.*)?$")
# How launchers report a rank killed by a signal: accelerate's CalledProcessError ("died with
# <Signals.SIGKILL: 9>") and torchrun's ChildFailedError ("Signal 9 (SIGKILL) received by PID").
_SIGNAL_IN_LOG = re.compile(r"died with <Signals\.(SIG[A-Z0-9]+)|\((SIG[A-Z0-9]+)\) received by PID")


# The rollout's own knobs, for the phases they bound (the loss and optimizer phases hold one micro-batch).
OOM_PHASE_ADVICE = {
    "generation": "set grpo.generation_sub_batch (generate fewer completions at a time), or ",
    "scoring": "set grpo.scoring_sub_batch (score fewer sequences per forward), or ",
}


def oom_message(phase: str | None, step: int | None) -> str:
    """The one line for running out of memory: where, and what to try (the trainer's event says the same)."""
    where = f"the {phase} phase" if phase else "an unknown phase"
    advice = OOM_PHASE_ADVICE.get(phase or "", "") + OOM_ADVICE
    return f"out of memory in {where} at step {'?' if step is None else step}: {advice}"


def failure_reason(metrics_path: Path, stdout_path: Path, exit_code: int | None = None) -> str:
    """One line: the last error/oom event of the metrics stream, else the cause found in stdout.log.

    A negative `exit_code` (killed by that signal, as Popen reports it) is said when no event explains it.
    """
    for record in reversed(read_records(metrics_path)):
        reason = event_reason(record)
        if reason is not None:
            return reason
    if exit_code is not None and exit_code < 0:
        return _killed_by(signal_name(-exit_code))
    return _log_reason(stdout_path)


def event_reason(record: dict[str, Any]) -> str | None:
    """The one line for an error, oom or supervisor_lost event of the metrics stream; None for any other."""
    if record.get("event") == "oom":
        return oom_message(record.get("phase"), record.get("step"))
    if record.get("event") == "error":
        return _error_text(record)
    if record.get("event") == "supervisor_lost":
        return one_line(str(record.get("message") or "the supervisor process is gone; the trainer stopped itself"))
    return None


def exception_line(exc: BaseException) -> str:
    """The trainer's one line for an exception: its message, or where it came from when it has none.

    An OSError names its errno (ENOSPC: a full disk); `StopIteration()` (empty data) says where it was
    raised rather than repeating its type.
    """
    if isinstance(exc, OSError) and exc.errno is not None:
        code = errno.errorcode.get(exc.errno, str(exc.errno))
        where = f": {exc.filename}" if exc.filename else ""
        return one_line(f"{code}: {exc.strerror or os.strerror(exc.errno)}{where}", limit=400)
    text = one_line(str(exc), limit=400)
    if text:
        return text
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "raised without a message"
    last = frames[-1]
    return f"raised without a message in {Path(last.filename).name}:{last.lineno} ({last.name})"


def labelled_failure(what: str, exc: BaseException) -> str:
    """`what (ExcType: the first line of its message)`: for a fallback that lets the run go on. Unlike
    `exception_line`, only the first line: compilers (torch.compile, Triton) follow it with pages of output."""
    return f"{what} ({type(exc).__name__}: {one_line((str(exc).strip() or '?').splitlines()[0], limit=200)})"


def _killed_by(name: str) -> str:
    hint = " (the system may have run out of host memory)" if name == "SIGKILL" else ""
    return f"the trainer was killed by {name}{hint}"


def signal_name(number: int) -> str:
    """SIGKILL for 9; "signal N" for a number that names no signal here."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _error_text(record: dict[str, Any]) -> str:
    kind = record.get("type") or "error"
    message = record.get("message") or ""
    text = f"{kind}: {message}" if message else str(kind)
    return one_line(text)


def _log_reason(stdout_path: Path) -> str:
    try:
        lines = stdout_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "the trainer exited without output"
    lines = [line.strip() for line in lines if line.strip()]
    for line in reversed(lines):
        killed = _SIGNAL_IN_LOG.search(line)
        if killed:  # the launcher's own "error" hides that a rank was killed: say by what
            return _killed_by(killed.group(1) or killed.group(2))
    for line in reversed(lines):
        match = _EXCEPTION_LINE.match(line)
        if match and not match.group(1).endswith(_WRAPPER_ERRORS):
            return one_line(line)
    return one_line(lines[-1]) if lines else "the trainer exited without output"


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line (whitespace runs become one space), cut to `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
