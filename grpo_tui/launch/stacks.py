"""Ask a run's ranks for their Python stacks: STACK_DUMP_SIGNAL to each, which prints them into stdout.log.

The signal's default action kills, so it goes only to a pid that is surely one of this run's ranks: named
by the stream's start event (published after the rank registered its handler), alive, created before
that event (not a later process reusing the id) and running the trainer module (a pid from another host
of a multi-node run may name a stranger here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.heartbeat import STACK_DUMP_SIGNAL
from grpo_tui.runs.status import live_rank_pids

# What a rank's command line holds (launch/command.py starts `-m grpo_tui.train`).
TRAIN_MODULE_ARG = "grpo_tui.train"


def rank_pids(run_path: Path) -> list[int]:
    """The pids of the run's ranks that run here and may be signalled (see the module docstring)."""
    return [pid for pid in live_rank_pids(RunDir(Path(run_path)).metrics) if _runs_trainer(pid)]


def _runs_trainer(pid: int) -> bool:
    try:
        import psutil

        return TRAIN_MODULE_ARG in psutil.Process(pid).cmdline()
    except Exception:  # gone, or not ours to inspect: not signalled
        return False


class StacksAsked(NamedTuple):
    """What `dump_stacks` did: the run and the pids it signalled."""

    run_name: str
    pids: list[int]

    @property
    def message(self) -> str:
        if not self.pids:
            return f"{self.run_name}: no live rank of this run on this machine; nothing to ask for stacks"
        pids = ", ".join(map(str, self.pids))
        return f"{self.run_name}: asked {len(self.pids)} rank(s) (pid {pids}) to dump their stacks into stdout.log"


def dump_stacks(run_path: Path) -> StacksAsked:
    """Send STACK_DUMP_SIGNAL to every rank of the run here (the stacks land in stdout.log)."""
    run = RunDir(Path(run_path))
    sent = []
    for pid in rank_pids(run.path):
        try:
            os.kill(pid, STACK_DUMP_SIGNAL)
            sent.append(pid)
        except OSError:  # ended meanwhile
            continue
    return StacksAsked(run.name, sent)
