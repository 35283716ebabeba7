"""Listing run folders for the runs screen, fast: run.json plus only the tail of metrics.jsonl.

A run.json that says the run is active while its processes are gone is judged from the stream's
last events (finished / stopped / failed), else reported as "lost" (crashed or killed unrecorded).
"""

from __future__ import annotations

import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from grpo_tui.runs.folder import list_runs, read_json
from grpo_tui.runs.metrics import as_float, as_int, is_step, parse_lines

# Bytes read from the end of metrics.jsonl by run_info (enough for several step records).
SCAN_TAIL_BYTES = 64 * 1024
# Bytes read from the start of metrics.jsonl to find the start event.
HEAD_BYTES = 16 * 1024
# Seconds a run.json may say "starting" without a pid before the run counts as lost.
STARTING_GRACE_S = 30.0
# Run states that mean a process should still be alive.
LIVE_STATES = frozenset({"starting", "running"})
SUBMITTED = "submitted"  # written by `grpo-tui slurm`: the job is queued or runs on other hosts
# Slack (s) between run.json's start time and the process's create time before a pid counts as reused.
PID_REUSE_SLACK_S = 5.0


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config.toml as a dict ({} when missing or unreadable)."""
    try:
        with open(Path(run_dir) / "config.toml", "rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


@dataclass(frozen=True)
class RunInfo:
    """One row of the runs list."""

    path: Path
    name: str
    status: str  # starting | running | finished | failed | stopped | lost (said running, process gone)
    preset: str
    started: float | None
    steps: int
    last_reward: float | None
    loss_impl: str
    pid: int | None


def pid_alive(pid: Any, identity: float | None = None, started: float | None = None) -> bool:
    """True when `pid` runs (not a zombie) and is the process meant, not a later one reusing the id.

    Args:
        pid: The process id.
        identity: Its recorded create time (run.json's `pid_started`): must match within 1 s.
        started: Else, a time it was known to run (run.json's `started`): it must have been created by then.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not psutil.pid_exists(pid):
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created = proc.create_time()
    except (psutil.Error, OSError):
        return False
    if identity is not None:
        return abs(created - identity) < 1.0
    return started is None or created <= started + PID_REUSE_SLACK_S


def tail_records(path: Path, nbytes: int = SCAN_TAIL_BYTES) -> list[dict[str, Any]]:
    """The complete records in the last `nbytes` of a metrics file (a long run's file can be large)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - nbytes))
            data = handle.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > nbytes:
        lines = lines[1:]  # the first line is cut by the seek
    lines = lines[:-1]  # an unterminated last line (or b"" after the final newline)
    return list(parse_lines(lines))


def _start_event_alive(path: Path) -> bool:
    """Whether a rank listed by the stream's start event (its first record) still runs: for runs
    started without the runner, which have no pids in run.json."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return False
    for record in parse_lines(head.split(b"\n")[:-1]):
        if record.get("event") == "start":
            ranks = record.get("ranks") if isinstance(record.get("ranks"), list) else [record]
            when = as_float(record.get("time"))
            return any(pid_alive(r.get("pid"), None, when) for r in ranks if isinstance(r, dict))
    return False


def run_info(run_path: Path) -> RunInfo:
    """Status, preset, start time, steps so far and last reward of one run folder.

    run.json (written by the runner) gives the state; a state that says the run is active whose
    processes (the supervisor `pid`, the trainer `child_pid`) are gone is judged from the stream's
    last events (finished / stopped / failed), else "lost" (crashed or killed without a last record).
    """
    meta = read_json(run_path / "run.json") or {}
    tail = tail_records(run_path / "metrics.jsonl")
    steps = [r for r in tail if is_step(r)]
    last = steps[-1] if steps else {}
    started = as_float(meta.get("started"))
    pid = as_int(meta.get("pid"))
    state = str(meta.get("status") or meta.get("state") or "")
    if state == SUBMITTED:
        status = submitted_status(tail)
    elif state in LIVE_STATES or not state:
        alive = (
            pid_alive(meta.get("pid"), as_float(meta.get("pid_started")), started)
            or pid_alive(meta.get("child_pid"), as_float(meta.get("child_started")), started)
            or (not isinstance(meta.get("pid"), int) and _start_event_alive(run_path / "metrics.jsonl"))
        )
        events = [(str(r["event"]), r) for r in tail if "event" in r]
        status = "running" if alive else stream_status(events)
        created = as_float(meta.get("created"))
        if status == "running" and not alive:
            # the runner writes "starting" before it has a pid: give it a moment before calling it lost
            young = state == "starting" and created is not None and time.time() - created < STARTING_GRACE_S
            status = "starting" if young else "lost"
    else:
        status = state
    preset = str(meta.get("preset") or "") or read_config(run_path).get("name", "")
    if started is None:
        starts = [r for r in tail if r.get("event") == "start"]
        started = as_float(starts[0].get("time")) if starts else as_float(meta.get("created"))
    return RunInfo(
        path=run_path,
        name=run_path.name,
        status=status,
        preset=str(preset),
        started=started,
        steps=as_int(last.get("step")) or 0,
        last_reward=as_float(last.get("reward")),
        loss_impl=str(last.get("loss_impl", "")),
        pid=pid,
    )


def submitted_status(tail: list[dict[str, Any]]) -> str:
    """A run handed to a batch system (`grpo-tui slurm`): its ranks run on other hosts, so no local
    process tells whether it lives. "submitted" while its stream is empty (the trainer's first record
    is its start event), then what the stream's last records (`tail_records`) say."""
    if not tail:
        return SUBMITTED
    return stream_status([(str(r["event"]), r) for r in tail if "event" in r])


def stream_status(events: list[tuple[str, dict[str, Any]]]) -> str:
    """From (kind, fields) of a run's events: failed (error / oom), stopped (a finish after a stop
    request, or saying stopped), finished, or running (no end yet)."""
    kinds = {kind for kind, _ in events}
    if kinds & {"error", "oom"}:
        return "failed"
    finish = [fields for kind, fields in events if kind == "finish"]
    if finish:
        return "stopped" if "stop_requested" in kinds or finish[-1].get("stopped") is True else "finished"
    return "running"


def scan_runs(runs_dir: str | os.PathLike[str]) -> list[RunInfo]:
    """Every run folder under `runs_dir`, newest first."""
    return [run_info(run.path) for run in list_runs(Path(runs_dir))]
