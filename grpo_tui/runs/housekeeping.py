"""Disk use of run folders, and freeing it: delete a run, or prune it (drop its checkpoints, keep model/).

Used by `grpo-tui runs --delete/--prune` and the app's runs screen (which asks first). A run that is
starting or running is refused: its trainer writes into the folder. So is any folder holding something a run
does not write (a run.json alone does not make a run folder): a delete removes the whole tree, and a path
typed by mistake (`/`, a home folder, a project) must not go with it.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

from grpo_tui.runs.folder import RunDir
from grpo_tui.runs.model_dir import folder_bytes, human_bytes
from grpo_tui.runs.status import LIVE_STATES, judge
from grpo_tui.userinput import clip

# Characters of a refusal line: it names up to two paths, each of which may be long.
MESSAGE_LIMIT = 600


class HousekeepingError(ValueError):
    """A delete or prune that was refused (one user-facing line)."""


# What a run folder holds (runs/folder.py, the trainer, the SLURM script); dot-files are the atomic writers'
# temporary files and the final save's staging folders.
RUN_ENTRIES = (
    "config.toml",
    "accelerate.yaml",
    "command.json",
    "stdout.log",
    "metrics.jsonl",
    "completions.jsonl",
    "control.json",
    "run.json",
    "run.lock",
    "checkpoints",
    "model",
    "eval.json",
    "job.sbatch",
    "slurm-*.log",
    "heartbeat*.json",
    "profile-step*.txt",
    ".*",
)


def foreign_entry(folder: Path) -> str | None:
    """The name of an entry of `folder` that no run writes (None: every entry is a run's)."""
    for entry in os.scandir(folder):
        if not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in RUN_ENTRIES):
            return entry.name
    return None


class Freed(NamedTuple):
    """What a delete or prune removed: the folder acted on and its bytes freed."""

    path: Path
    bytes: int

    def line(self, verb: str) -> str:
        return f"{verb} {self.path} ({human_bytes(self.bytes)} freed)"


def checked_run(path: Path) -> RunDir:
    """`path` as a run folder that is not live, or HousekeepingError."""
    run = RunDir(Path(path).resolve())
    if not run.is_run:
        raise HousekeepingError(f"{path}: not a run folder (no run.json or metrics.jsonl)")
    home = Path(os.path.expanduser("~")).resolve()
    if os.path.ismount(run.path) or run.path == home or Path.cwd().resolve().is_relative_to(run.path):
        raise HousekeepingError(f"{path}: a file system root, the home folder or the current folder, not a run folder")
    try:
        foreign = foreign_entry(run.path)
    except OSError as exc:
        raise HousekeepingError(f"{path}: cannot list it ({exc.strerror or exc})") from None
    if foreign is not None:
        raise HousekeepingError(f"{path}: holds {foreign!r}, which no run writes; not a run folder (remove it by hand)")
    state = judge(run.path).state
    if state in LIVE_STATES:
        raise HousekeepingError(f"{run.name}: the run is {state}; stop it first (grpo-tui control {path} --stop)")
    return run


def delete_run(path: Path) -> Freed:
    """Remove a run folder that is not live, whole."""
    run = checked_run(path)
    size = folder_bytes(run.path)
    shutil.rmtree(run.path)
    return Freed(run.path, size)


def prune_run(path: Path) -> Freed:
    """Remove a run's checkpoints/ (resume state), keeping model/, its metrics and everything else.

    Refused when the run has no model/: its checkpoints would then be all that is left of the training.
    """
    run = checked_run(path)
    if not run.checkpoints.exists():
        return Freed(run.checkpoints, 0)
    if not run.model.is_dir():
        raise HousekeepingError(f"{run.name}: no model/ to keep; its checkpoints are the only trained weights")
    size = folder_bytes(run.checkpoints)
    shutil.rmtree(run.checkpoints)
    return Freed(run.checkpoints, size)


def runs_command(runs_dir: Path, delete: Path | None = None, prune: Path | None = None, yes: bool = False) -> int:
    """`grpo-tui runs`: the runs with status, steps and disk use, or `--delete` / `--prune` one; the exit code."""
    import time

    from grpo_tui.runs.listing import scan_runs

    if delete is not None or prune is not None:
        return tidy_command(delete if delete is not None else prune, delete=delete is not None, yes=yes)
    if yes:
        print("grpo-tui runs: --yes goes with --delete or --prune", file=sys.stderr)
        return 2
    runs = scan_runs(runs_dir)
    if not runs:
        print(f"no runs in {runs_dir.resolve()}")
        return 0
    width = max(len(r.name) for r in runs)
    print(f"{'RUN':<{width}}  {'STATUS':<9}  {'STEP':>6}  {'DISK':>9}  {'STARTED':<19}  REASON")
    for run in runs:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started)) if run.started is not None else "-"
        disk = human_bytes(run.disk_bytes)
        print(f"{run.name:<{width}}  {run.status:<9}  {run.steps or '-':>6}  {disk:>9}  {when:<19}  {run.reason or ''}")
    return 0


def tidy_command(target: Path, delete: bool, yes: bool) -> int:
    """`grpo-tui runs --delete/--prune RUN`: asks on a terminal unless `yes`; returns the exit code."""
    try:
        run = checked_run(target)
        what = run.path if delete else run.checkpoints
        if not yes:
            if not sys.stdin.isatty():
                print(
                    f"grpo-tui runs: {clip(str(what))}: nothing removed; pass --yes to confirm without a terminal",
                    file=sys.stderr,
                )
                return 2
            question = f"{'delete' if delete else 'prune'} {what} ({human_bytes(folder_bytes(what))})? [y/N] "
            if input(question).strip().lower() not in ("y", "yes"):
                print("nothing removed")
                return 0
        freed = delete_run(run.path) if delete else prune_run(run.path)
    except HousekeepingError as exc:
        print(f"grpo-tui runs: {clip(str(exc), MESSAGE_LIMIT)}", file=sys.stderr)
        return 2
    print(freed.line("deleted" if delete else "pruned"))
    return 0
