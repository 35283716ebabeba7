"""The trainer's heartbeat: what each rank is doing right now, beside (never in) the metrics stream.

Every rank rewrites its own small JSON file every HEARTBEAT_EVERY_S seconds (atomically):
RUN/heartbeat.json for rank 0, RUN/heartbeat-rank<N>.json for the others:
    {"time": 1718000000.0, "step": 41, "phase": "generation", "phase_started": 1717999580.2, "rank": 0, "pid": 1234}
`step` is the last optimizer step finished; `phase` is one of metrics.PHASES (the innermost running), or
SETUP (before the trainer exists), COLLECTIVE (waiting for the other ranks at a step boundary) or IDLE
(between phases). The trainer also dumps its stacks on STACK_DUMP_SIGNAL (launch/stacks.py sends it). metrics.jsonl stays one record per step: a beat every few seconds does not belong there.

The dashboard reads the files with `HeartbeatReader`, which re-parses a file only when its stat changed.
"""

from __future__ import annotations

import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_tui.runs.folder import read_json, write_json_atomic

# Seconds between beats: often enough to name a hang's phase, rarely enough to cost nothing.
HEARTBEAT_EVERY_S = 5.0
# A beat older than this means the writer itself stopped (a frozen or dead process), not a slow phase.
HEARTBEAT_STALE_S = 6 * HEARTBEAT_EVERY_S
# Asks a rank to print every thread's stack into stdout.log. Its default action kills the process, so the
# trainer registers it before its pid is published (the start event), and only such pids get it.
STACK_DUMP_SIGNAL = signal.SIGUSR1
# Phases that are no metrics.PHASES entry.
SETUP, COLLECTIVE, IDLE = "setup", "collective", "idle"


@dataclass(frozen=True)
class Heartbeat:
    """One rank's beat (see the module docstring)."""

    time: float  # when it was written (wall clock)
    step: int  # the last optimizer step finished
    phase: str
    phase_started: float  # wall clock
    rank: int
    pid: int

    @property
    def waiting(self) -> bool:
        """Waiting on others or on nothing: a rank in this state is not the one holding a stall up."""
        return self.phase in (COLLECTIVE, IDLE)


def heartbeat_path(run_path: Path, rank: int) -> Path:
    """The heartbeat file of `rank` in the run folder."""
    return Path(run_path) / ("heartbeat.json" if rank == 0 else f"heartbeat-rank{rank}.json")


def write_heartbeat(run_path: Path, beat: Heartbeat) -> None:
    write_json_atomic(heartbeat_path(run_path, beat.rank), asdict(beat))


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The beat in `path`, or None when missing or not one (the file is a hand-editable JSON)."""
    data = read_json(path)
    if data is None:
        return None
    numbers = {key: data.get(key) for key in ("time", "phase_started")}
    ints = {key: data.get(key) for key in ("step", "rank", "pid")}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers.values()):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints.values()):
        return None
    if not isinstance(data.get("phase"), str):
        return None
    return Heartbeat(
        time=float(numbers["time"]),  # type: ignore[arg-type]  # checked above
        step=ints["step"],  # type: ignore[arg-type]
        phase=data["phase"][:40],  # a label in one line of an alert, whatever the file holds
        phase_started=float(numbers["phase_started"]),  # type: ignore[arg-type]
        rank=ints["rank"],  # type: ignore[arg-type]
        pid=ints["pid"],  # type: ignore[arg-type]
    )


class HeartbeatReader:
    """The beats of a run's ranks, each file parsed again only when its (mtime, size) changed."""

    def __init__(self, run_path: Path) -> None:
        self.run_path = Path(run_path)
        self._cache: dict[int, tuple[tuple[int, int], Heartbeat | None]] = {}

    def read(self, ranks: list[int]) -> list[Heartbeat]:
        """The beats found for `ranks` (rank 0 when empty), by rank."""
        beats = []
        for rank in sorted(set(ranks) or {0}):
            path = heartbeat_path(self.run_path, rank)
            try:
                info = os.stat(path)
            except OSError:
                self._cache.pop(rank, None)
                continue
            key = (info.st_mtime_ns, info.st_size)
            cached = self._cache.get(rank)
            if cached is None or cached[0] != key:
                cached = self._cache[rank] = (key, read_heartbeat(path))
            if cached[1] is not None:
                beats.append(cached[1])
        return beats
