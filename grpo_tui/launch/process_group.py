"""A run's process group: the launcher leads it (its own session), every rank accelerate starts is in it.

Finding the group of a run folder (never a stranger's: pid + create time), listing its live members
and ending it (SIGTERM, a grace period, SIGKILL) are here; the supervisor and `control --stop --force` use them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.status import live_rank_pids, pid_alive


def terminate_group(pgid: int, still_there: Callable[[], bool], grace: float) -> None:
    """SIGTERM the process group, wait up to `grace` seconds while `still_there()`, then SIGKILL it."""
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and still_there():
        time.sleep(0.05)
    # The leader may be gone while ranks linger: the group still gets the final signal.
    signal_group(pgid, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """Pids of the live (not zombie) processes in process group `pgid`."""
    import psutil

    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except OSError:  # gone meanwhile
            continue
    return members


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_group(run: RunDir) -> int | None:
    """run.json's `pgid` when that group still is this run's, else None (never signal a stranger).

    The group is the run's when its leader (the launcher, pid == pgid) is the process recorded, by pid
    and create time; or, once the leader is gone, when a rank named by the stream's start event still
    runs in it (a rank started after run.json's `started`, so not a reused pid).
    """
    status = run.read_status()
    pgid, started = status.get("pgid"), status.get("child_started")
    if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1 or not isinstance(started, (int, float)):
        return None
    if status.get("child_pid") == pgid and same_process(pgid, started) and _group_of(pgid) == pgid:
        return pgid
    if any(_created_after(pid, started) and _group_of(pid) == pgid for pid in live_rank_pids(run.metrics)):
        return pgid
    return None


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _created_after(pid: int, when: float) -> bool:
    created = process_identity(pid)
    return created is not None and created >= when - 1.0


def process_identity(pid: int) -> float | None:
    """The process's start time: with the pid, it tells a live process from a reused pid."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # psutil missing or the process already gone
        return None


def same_process(pid: Any, started: Any) -> bool:
    """`pid` is alive and was created at `started` (run.json's record), not a later process reusing the id."""
    return pid_alive(pid, float(started) if isinstance(started, (int, float)) else None)
