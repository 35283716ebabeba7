"""Listing run folders for the runs screen and `grpo-tui runs`, fast: run.json plus only the tail of
metrics.jsonl. The status is `status.judge`'s, from the same tail."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_tui.runs.folder import RunDir, list_runs
from grpo_tui.runs.metrics import as_float, as_int, step_records, tail_records
from grpo_tui.runs.model_dir import folder_bytes
from grpo_tui.runs.status import ENDED_STATES, LIVE_STATES, RunStatus, judge, recorded_state, settle


def read_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved config.toml as a dict ({} when missing or unreadable)."""
    try:
        with open(RunDir(Path(run_dir)).config, "rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


@dataclass(frozen=True)
class RunInfo:
    """One row of the runs list."""

    path: Path
    name: str
    status: RunStatus
    preset: str
    started: float | None
    steps: int
    last_reward: float | None
    loss_impl: str
    pid: int | None
    last_loss: float | None = None
    reason: str | None = None  # why it failed / was lost, one line
    disk_bytes: int = 0  # the whole folder (checkpoints and model included)


def run_info(run_path: Path, meta: dict[str, Any] | None = None) -> RunInfo:
    """Status (with its reason), preset, start time, steps so far, last reward and loss of one run folder
    (`meta`: its run.json when the caller has read it already)."""
    run = RunDir(Path(run_path))
    meta = run.read_status() if meta is None else meta
    tail = tail_records(run.metrics)
    verdict = judge(run.path, meta=meta, tail=tail)
    if verdict.state in ENDED_STATES and recorded_state(meta) in LIVE_STATES:
        verdict = settle(run.path)  # run.json still says live: whoever sees the end records it
    steps = step_records(tail)
    last = steps[-1] if steps else {}
    started = as_float(meta.get("first_started")) or as_float(meta.get("started"))  # a resumed run's first start
    if started is None:
        starts = [r for r in tail if r.get("event") == "start"]
        started = as_float(starts[0].get("time")) if starts else as_float(meta.get("created"))
    preset = str(meta.get("preset") or "") or read_config(run.path).get("name", "")
    return RunInfo(
        path=run_path,
        name=run.name,
        status=verdict.state,
        preset=str(preset),
        started=started,
        steps=as_int(last.get("step")) or 0,
        last_reward=as_float(last.get("reward")),
        loss_impl=str(last.get("loss_impl", "")),
        last_loss=as_float(last.get("loss")),
        pid=as_int(meta.get("pid")),
        reason=verdict.reason,
        disk_bytes=folder_bytes(run.path),
    )


def scan_runs(runs_dir: str | os.PathLike[str]) -> list[RunInfo]:
    """Every run folder under `runs_dir`, newest first."""
    return [run_info(run.path) for run in list_runs(Path(runs_dir))]


def scan_live_runs(runs_dir: str | os.PathLike[str]) -> list[RunInfo]:
    """The runs under `runs_dir` that are starting or running, newest first: what `scan_runs` finds
    live, for less (see `_live_info`)."""
    return [info for run in list_runs(Path(runs_dir)) if (info := _live_info(run)) is not None]


def live_among(paths: Iterable[Path]) -> list[Path]:
    """Those of the run folders `paths` that are starting or running, in their order."""
    return [path for path in paths if _live_info(RunDir(Path(path))) is not None]


def _live_info(run: RunDir) -> RunInfo | None:
    # A run whose run.json records an outcome is passed over on that small file alone (`judge` would say the
    # same without its stream), so only the few others are read in full
    meta = run.read_status()
    if recorded_state(meta) in ENDED_STATES:
        return None
    info = run_info(run.path, meta)
    return info if info.status in LIVE_STATES else None
