"""A run's process groups: the launcher leads one (its own session). A one-process run's rank is in it; torchrun
starts each rank of a multi-process run in a session of its own, so those ranks lead groups of their own
(`rank_groups`), and ending a run signals them too.

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


def terminate_groups(groups: list[int], still_there: Callable[[], bool], grace: float) -> None:
    """SIGTERM the process groups, wait up to `grace` seconds while `still_there()`, then SIGKILL them."""
    for group in groups:
        signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and still_there():
        time.sleep(0.05)
    # The leader may be gone while ranks linger: the groups still get the final signal.
    for group in groups:
        signal_group(group, signal.SIGKILL)


def rank_groups(run: RunDir, launcher_pgid: int | None) -> list[int]:
    """The groups of the run's live ranks outside the launcher's group: each such rank leads its own (torchrun's
    sessions). Only ranks named by the stream's start event, created after the launcher (run.json's
    child_started) and leading their group are taken, so a reused pid never gets a stranger's group signalled."""
    started = run.read_status().get("child_started")
    if not isinstance(started, (int, float)) or isinstance(started, bool):
        return []
    groups = []
    for pid in live_rank_pids(run.metrics):
        group = _group_of(pid)
        if group == pid and group != launcher_pgid and group > 1 and _created_after(pid, started):
            groups.append(group)
    return groups


def group_members(*pgids: int) -> list[int]:
    """Pids of the live (not zombie) processes in the process groups `pgids` (one pass over the processes)."""
    import psutil

    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) in pgids and proc.info["status"] != psutil.STATUS_ZOMBIE:
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
