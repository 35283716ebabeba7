"""The stall watchdog's trainer side: a heartbeat thread per rank and stack dumps on SIGUSR1.

The beat (runs/heartbeat.py) names the phase in progress, so a run that stops logging steps says where
it is stuck. A daemon thread writes it: it keeps beating while the main thread waits in a collective or a
long generation, and stops beating only when the whole process is frozen (which the reader then tells).

`enable_stack_dumps` makes SIGUSR1 print every thread's Python stack to stderr (stdout.log under the
runner): `grpo-tui control RUN --dump-stacks` and the dashboard's `d` key send it to every rank.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from grpo_tui.runs.heartbeat import HEARTBEAT_EVERY_S, IDLE, SETUP, STACK_DUMP_SIGNAL, Heartbeat, write_heartbeat


def enable_stack_dumps() -> bool:
    """Dump every thread's stack to stderr on STACK_DUMP_SIGNAL; False where stderr has no file descriptor."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            # faulthandler writes from the signal handler to the fd: no Python code runs, so it works
            # even while the main thread is stuck in C (a collective, a CUDA sync).
            faulthandler.register(STACK_DUMP_SIGNAL, file=stream, all_threads=True, chain=False)
            return True
        except (AttributeError, ValueError, OSError, RuntimeError):  # no fileno (a captured stream)
            continue
    return False


class HeartbeatThread:
    """Writes this rank's beat every `every` seconds until `stop()`.

    Args:
        run_path: The run folder.
        rank: This process's rank.
        phases: Returns the PhaseMemory (or None before the trainer exists).
        step: Returns the last optimizer step finished.
        clock: Wall-clock seconds; a test passes a fake one.
    """

    def __init__(
        self,
        run_path: Path,
        rank: int,
        phases: Callable[[], Any],
        step: Callable[[], int],
        every: float = HEARTBEAT_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.run_path, self.rank, self.every = Path(run_path), rank, every
        self._phases, self._step, self._clock = phases, step, clock
        self._override: tuple[str, float] | None = None  # e.g. (COLLECTIVE, since)
        self._born = clock()
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"grpo-tui-heartbeat-{rank}", daemon=True)

    def start(self) -> HeartbeatThread:
        self.beat()  # the first beat at once: the dashboard knows the rank is alive from the start
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.every + 1)

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """Report `phase` (e.g. COLLECTIVE) while the block runs, over whatever phase is tracked."""
        self._override = (phase, self._clock())
        try:
            yield
        finally:
            self._override = None

    def current(self) -> tuple[str, float]:
        """(phase, wall-clock start) as the next beat reports it."""
        override = self._override
        if override is not None:
            return override
        phases = self._phases()
        if phases is None:
            return SETUP, self._born
        phase, since = phases.running
        return (phase or IDLE), since

    def beat(self) -> None:
        phase, since = self.current()
        try:
            step = int(self._step())
        except Exception:  # the trainer is half built: its step is not there yet
            step = 0
        beat = Heartbeat(self._clock(), step, phase, since, self.rank, os.getpid())
        try:
            write_heartbeat(self.run_path, beat)
        except OSError as exc:  # a full disk must not kill training: the next beat tries again
            if not self._warned:  # once: a beat every few seconds would flood stdout.log
                print(f"grpo-tui: cannot write the heartbeat: {exc}", file=sys.stderr)
                self._warned = True

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.beat()
