"""A run's status: the one judgement from run.json, the run's processes and its metrics stream.

`grpo-tui runs`, `grpo-tui control`, the app's runs list and its dashboard all ask `judge`, so they
can never disagree about one run. The rules, in order:

- run.json says submitted (`grpo-tui slurm`): its ranks run on other hosts, so no local process
  tells; "submitted" while the stream is empty, then what the stream's last records say.
- run.json records an outcome (finished / failed / stopped, written by the supervisor): that.
- otherwise (said starting / running, or no run.json: a trainer started by hand) an end the
  stream records (finish / stop / error) wins, even while a process lives: the supervisor reaps
  the trainer and writes run.json seconds later. Without one, a live process (the supervisor
  `pid`, the trainer `child_pid`, else a rank named by the stream's start event) means the run
  goes on, and none alive means "lost" (crashed or killed without a last record), after a short
  grace for a run.json that says starting before its supervisor recorded a pid.

run.json's outcome is written by whoever ends the run last: the supervisor when it outlives the
trainer, else (the supervisor killed, or its last write refused by a full disk) `settle`, which the
trainer calls as it exits and readers call when run.json still says live about an ended run. `settle`
writes only while no supervisor holds the run's claim (runs/claim.py), so it never races one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from grpo_tui.config.schema import PresetError
from grpo_tui.runs.claim import SETTLING, claim_run
from grpo_tui.runs.failures import event_reason
from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.metrics import as_float, start_event, tail_records


class RunStatus(StrEnum):
    """A run's state; a str, so it prints, compares and serialises as its value."""

    SUBMITTED = "submitted"  # handed to a batch system; its stream has no record yet
    STARTING = "starting"  # the supervisor is preparing the trainer
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"  # on request (a graceful stop or a kill)
    LOST = "lost"  # said active, but no process of it lives and its stream has no end


# States in which a process of the run should be alive: the app polls it fast and offers stop / switch.
LIVE_STATES = frozenset({RunStatus.STARTING, RunStatus.RUNNING})
# Recorded outcomes: nothing reads control requests any more.
ENDED_STATES = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.STOPPED})
# Seconds a run.json may say "starting" without a pid before the run counts as lost.
STARTING_GRACE_S = 30.0
# Slack (s) between run.json's start time and the process's create time before a pid counts as reused.
PID_REUSE_SLACK_S = 5.0
# Environment variables through which the supervisor tells the trainer its pid and create time: a
# trainer whose supervisor is gone stops itself (train/control.py SupervisorWatch).
SUPERVISOR_PID_ENV = "GRPO_TUI_SUPERVISOR_PID"
SUPERVISOR_STARTED_ENV = "GRPO_TUI_SUPERVISOR_STARTED"

# Colour of each state wherever it is drawn (rich colour names): the runs list and the dashboard's badge.
STATUS_COLOURS: dict[str, str] = {
    RunStatus.RUNNING: "green",
    RunStatus.STARTING: "cyan",
    RunStatus.SUBMITTED: "cyan",
    RunStatus.FINISHED: "blue",
    RunStatus.FAILED: "red",
    RunStatus.STOPPED: "yellow",
    RunStatus.LOST: "red",
}
# States a list draws bold (they want attention); a badge is always bold.
EMPHASISED = frozenset({RunStatus.RUNNING, RunStatus.STARTING, RunStatus.FAILED})


class StatusVerdict(NamedTuple):
    state: RunStatus
    reason: str | None  # one line: why it failed / was lost (None when there is nothing to say)


def status_style(state: str, badge: bool = False) -> str:
    """The rich style of a state: its colour, bold in a badge or when the state wants attention."""
    parts = ("bold" if badge or state in EMPHASISED else "", STATUS_COLOURS.get(state, ""))
    return " ".join(part for part in parts if part)


def judge(
    run_dir: str | Path,
    meta: dict[str, Any] | None = None,
    tail: list[dict[str, Any]] | None = None,
    now: float | None = None,
) -> StatusVerdict:
    """The state of a run folder (see the module's rules).

    Args:
        run_dir: The run folder.
        meta: Its run.json when the caller has read it already (else read here).
        tail: The records at the end of its metrics.jsonl (`tail_records`) when read already.
        now: The time (for the starting grace); time.time() by default.
    """
    run = RunDir(Path(run_dir))
    meta = run.read_status() if meta is None else meta
    tail = tail_records(run.metrics) if tail is None else tail
    recorded = recorded_state(meta)
    if recorded is RunStatus.SUBMITTED:
        return stream_verdict(tail) if tail else StatusVerdict(RunStatus.SUBMITTED, None)
    if recorded in ENDED_STATES:
        reason = meta.get("reason")
        return StatusVerdict(recorded, reason if isinstance(reason, str) and reason else None)
    # The trainer's last record wins over a live process: the supervisor outlives the trainer by a
    # few seconds (reaping it, writing run.json), and "running" meanwhile would be a lie.
    verdict = stream_verdict(tail)
    if verdict.state is not RunStatus.RUNNING:
        return verdict
    if processes_alive(meta, run.metrics):
        return StatusVerdict(recorded or RunStatus.RUNNING, None)
    created = as_float(meta.get("created"))
    clock = time.time() if now is None else now
    if recorded is RunStatus.STARTING and created is not None and clock - created < STARTING_GRACE_S:
        return StatusVerdict(RunStatus.STARTING, None)  # the supervisor has not recorded its pid yet
    if "pid" in meta:
        return StatusVerdict(RunStatus.LOST, "the supervisor process is gone (killed or crashed)")
    return StatusVerdict(RunStatus.LOST, "no process of the run is alive and its stream has no end")


def settle(run_dir: str | Path) -> StatusVerdict:
    """`judge`, and when run.json still records a live state for a run whose stream has ended and no
    supervisor holds it, record the verdict there (the one judgement, now written down)."""
    run = RunDir(Path(run_dir))
    verdict = judge(run.path)
    if verdict.state not in ENDED_STATES or recorded_state(run.read_status()) not in LIVE_STATES:
        return verdict
    try:
        claim = claim_run(run, SETTLING)
    except PresetError:  # a supervisor drives the run: its outcome is its own to write
        return verdict
    with claim:
        meta = run.read_status()
        verdict = judge(run.path, meta=meta)
        if verdict.state in ENDED_STATES and recorded_state(meta) in LIVE_STATES:
            try:
                run.update_status(status=verdict.state, reason=verdict.reason, ended=time.time())
            except OSError:  # a full disk still: the next reader records it
                pass
    return verdict


def recorded_state(meta: dict[str, Any]) -> RunStatus | None:
    """run.json's state, or None when absent or not one the supervisor writes; a state in ENDED_STATES
    is the verdict (`judge` looks no further)."""
    try:
        state = RunStatus(str(meta.get("status") or meta.get("state") or ""))
    except ValueError:
        return None
    return None if state is RunStatus.LOST else state  # "lost" is a judgement, never recorded


def stream_verdict(records: Iterable[dict[str, Any]]) -> StatusVerdict:
    """What the stream's records say: `stream_status`, with the failure's one line when it failed."""
    events = current_attempt([(str(r["event"]), r) for r in records if "event" in r])
    state = stream_status(events)
    # A failure says why; so does a trainer that stopped itself because its supervisor was gone.
    explained = {RunStatus.FAILED: {"error", "oom"}, RunStatus.STOPPED: {"supervisor_lost"}}.get(state, set())
    reasons = [event_reason(fields) for kind, fields in events if kind in explained]
    return StatusVerdict(state, next((r for r in reversed(reasons) if r), None))


def current_attempt(events: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The events after the last `resume`: an earlier attempt's end (or its reason) is not the resumed run's."""
    events = list(events)
    resumed = [i for i, (kind, _) in enumerate(events) if kind == "resume"]
    return events[resumed[-1] + 1 :] if resumed else events


def stream_status(events: Iterable[tuple[str, dict[str, Any]]]) -> RunStatus:
    """From (kind, fields) of a run's events: failed (error / oom), stopped (a finish after a stop
    request or a lost supervisor, or saying stopped), finished, or running (no end yet). Only the events
    after the last resume count: the earlier attempt's end is not the resumed run's."""
    current = current_attempt(events)
    kinds = {kind for kind, _ in current}
    if kinds & {"error", "oom"}:
        return RunStatus.FAILED
    finish = [fields for kind, fields in current if kind == "finish"]
    if finish:
        stopped = bool(kinds & {"stop_requested", "supervisor_lost"}) or finish[-1].get("stopped") is True
        return RunStatus.STOPPED if stopped else RunStatus.FINISHED
    return RunStatus.RUNNING


def processes_alive(meta: dict[str, Any], metrics: Path) -> bool:
    """Whether the supervisor or the trainer recorded in run.json runs; without a recorded supervisor
    (a trainer started by hand), whether a rank listed by the stream's start event runs."""
    started = as_float(meta.get("started"))
    if pid_alive(meta.get("pid"), as_float(meta.get("pid_started")), started):
        return True
    if pid_alive(meta.get("child_pid"), as_float(meta.get("child_started")), started):
        return True
    if isinstance(meta.get("pid"), int):
        return False
    return bool(live_rank_pids(metrics))


def live_rank_pids(metrics: Path) -> list[int]:
    """The pids of the ranks the stream's start event names that run here: alive, not zombies, and
    created by that event's time (a later process reusing the id is not the rank). The one reading
    of "the run's live ranks" for the status, the process group check and the stack dump."""
    start = start_event(metrics)
    if start is None:
        return []
    # A start event without a `ranks` list (a single process) names its own pid.
    ranks = start.get("ranks") if isinstance(start.get("ranks"), list) else [start]
    when = as_float(start.get("time"))
    return [r["pid"] for r in ranks if isinstance(r, dict) and pid_alive(r.get("pid"), None, when)]


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
