"""Keeping a runs list live cheaply: stat each run's run.json and metrics.jsonl, and re-read (with
`runs.listing.run_info`) only the runs whose files changed, plus the live ones (a process may die
without a file changing). Call `scan` from a thread worker about once a second."""

from __future__ import annotations

from pathlib import Path

from grpo_tui.runs.folder import file_stamp, list_runs
from grpo_tui.runs.listing import RunInfo, run_info
from grpo_tui.runs.status import LIVE_STATES

# (mtime_ns, size) of run.json and metrics.jsonl; None for a file that is missing.
FileKey = tuple[tuple[int, int] | None, tuple[int, int] | None]


class RunsWatcher:
    """Remembers what it last read of each run of one folder."""

    def __init__(self) -> None:
        self.seen: dict[Path, tuple[FileKey, RunInfo]] = {}
        self.folder: Path | None = None
        self.reads = 0  # run_info calls so far (tests check that unchanged runs are not re-read)

    def scan(self, runs_dir: Path, force: bool = False) -> list[RunInfo] | None:
        """Every run of `runs_dir`, newest first; None when nothing changed since the last scan."""
        runs_dir = Path(runs_dir)
        if runs_dir != self.folder:
            self.seen.clear()
            self.folder = runs_dir
            force = True
        changed = force
        seen: dict[Path, tuple[FileKey, RunInfo]] = {}
        for run in list_runs(runs_dir):
            key = (file_stamp(run.status), file_stamp(run.metrics))
            old = self.seen.get(run.path)
            if old is not None and old[0] == key and old[1].status not in LIVE_STATES:
                seen[run.path] = old
                continue
            info = run_info(run.path)
            self.reads += 1
            changed = changed or old is None or old[1] != info
            seen[run.path] = (key, info)
        changed = changed or seen.keys() != self.seen.keys()
        self.seen = seen
        return [info for _, info in seen.values()] if changed else None
