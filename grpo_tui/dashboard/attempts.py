"""A run's attempts: its first start and each `grpo-tui resume` after it, read from the stream's events.

Each `start` event begins an attempt; its finish / error / oom record ends it. Status, ETA and the
stall alert follow the latest attempt (`runs.status.stream_status` reads only its events), elapsed
time adds the attempts up (a pause between them does not count), and the run view lists them.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from grpo_tui.runs.status import RunStatus, stream_status

# Events that end an attempt.
END_EVENTS = frozenset({"finish", "error", "oom"})


class Attempt(NamedTuple):
    """One start of the trainer on this run folder."""

    started: float | None
    ended: float | None  # its finish / error / oom record's time; None while it goes on (or was lost)
    first_step: int | None  # the steps it logged (None: none yet)
    last_step: int | None
    status: RunStatus  # what its own records say


class Event(Protocol):
    kind: str
    time: float | None
    data: dict[str, Any]


def run_attempts(events: Sequence[Event], steps: array, times: array | None) -> list[Attempt]:
    """The attempts of a stream with these events and step columns (`times`: each step's record time)."""
    groups: list[list[Event]] = []
    for event in events:
        if event.kind == "start" or not groups:
            groups.append([])
        groups[-1].append(event)
    if not groups:
        groups.append([])
    bounds = [group[0].time if group and group[0].kind == "start" else None for group in groups] + [None]
    found = []
    for i, group in enumerate(groups):
        ends = [e.time for e in group if e.kind in END_EVENTS and e.time is not None]
        logged = _steps_between(steps, times, bounds[i], bounds[i + 1])
        found.append(
            Attempt(
                started=bounds[i],
                ended=ends[-1] if ends else None,
                first_step=logged[0] if logged else None,
                last_step=logged[1] if logged else None,
                status=stream_status([(e.kind, e.data) for e in group]),
            )
        )
    return found


def elapsed_s(attempts: Sequence[Attempt], end: float) -> float | None:
    """Seconds spent training up to `end` (the live attempt's end): None when an attempt has no start time."""
    if not attempts or any(a.started is None for a in attempts):
        return None
    spans = [(a.ended if a.ended is not None else end) - a.started for a in attempts[:-1]]  # type: ignore[operator]
    return sum(max(0.0, span) for span in spans) + max(0.0, end - attempts[-1].started)  # type: ignore[operator]


def _steps_between(steps: array, times: array | None, start: float | None, end: float | None) -> tuple[int, int] | None:
    """(first, last) step whose record time is in [start, end) (an open bound when None)."""
    if not steps:
        return None
    if times is None or len(times) != len(steps):
        return (int(steps[0]), int(steps[-1])) if start is None and end is None else None
    lo = 0 if start is None else bisect.bisect_left(times, start)
    hi = len(times) if end is None else bisect.bisect_left(times, end)
    return (int(steps[lo]), int(steps[hi - 1])) if hi > lo else None
