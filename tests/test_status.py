"""One status judgement: `grpo-tui runs`, the app (runs list and dashboard feed) and `grpo-tui control`
say the same state for the same run folder, in each situation where separate judgements used to differ."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grpo_tui import cli
from grpo_tui.dashboard.feed import DashboardFeed
from grpo_tui.runs.listing import run_info
from grpo_tui.runs.status import ENDED_STATES, RunStatus, judge, status_style
from grpo_tui.tools.demo import make_run


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _patch_run_json(run: Path, **fields: object) -> None:
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, **fields}))


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, tuple[RunStatus, str | None]]:
    """Run folders under tmp_path/runs: name -> (expected state, a word its reason must hold)."""
    root, dead, me = tmp_path / "runs", _dead_pid(), psutil.Process(os.getpid())
    # run.json says running, every process is gone, but the trainer's stream recorded its finish
    make_run(root / "a-ended-unrecorded", steps=3, finished=True, status="running", pid=dead)
    # the supervisor was killed; the trainer it started still runs (this test's process stands in)
    outlived = make_run(root / "b-trainer-outlives-supervisor", steps=3, finished=False, pid=dead).path
    _patch_run_json(outlived, child_pid=os.getpid(), child_started=me.create_time())
    # a batch job: its ranks' pids mean nothing on this host, its stream alone tells
    make_run(root / "c-submitted-with-records", steps=3, finished=False, status="submitted", pid=dead)
    queued = root / "d-submitted-queued"
    queued.mkdir(parents=True)
    (queued / "run.json").write_text(json.dumps({"status": "submitted", "created": time.time()}))
    # stale: said running, nothing alive, a stream without an end
    make_run(root / "e-stale", steps=3, finished=False, pid=dead)
    crashed = make_run(root / "f-crashed-unrecorded", steps=3, finished=False, pid=dead).path
    with open(crashed / "metrics.jsonl", "a") as handle:
        handle.write(
            json.dumps({"v": 1, "time": 1.0, "event": "error", "type": "ValueError", "message": "boom"}) + "\n"
        )
    fresh = root / "g-starting"
    fresh.mkdir()
    (fresh / "run.json").write_text(json.dumps({"status": "starting", "created": time.time()}))
    make_run(root / "h-stopped", steps=3, status="stopped")
    return {
        "a-ended-unrecorded": (RunStatus.FINISHED, None),
        "b-trainer-outlives-supervisor": (RunStatus.RUNNING, None),
        "c-submitted-with-records": (RunStatus.RUNNING, None),
        "d-submitted-queued": (RunStatus.SUBMITTED, None),
        "e-stale": (RunStatus.LOST, "supervisor"),
        "f-crashed-unrecorded": (RunStatus.FAILED, "boom"),
        "g-starting": (RunStatus.STARTING, None),
        "h-stopped": (RunStatus.STOPPED, None),
    }


def test_cli_app_and_control_agree(
    tmp_path: Path, runs: dict[str, tuple[RunStatus, str | None]], capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    assert cli.main(["runs", "--runs-dir", str(root)]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert sorted(listed) == sorted(runs)
    for name, (expected, reason_word) in runs.items():
        path = root / name
        verdict = judge(path)
        assert verdict.state == expected, name
        assert (reason_word in (verdict.reason or "")) if reason_word else True, (name, verdict.reason)
        # grpo-tui runs: the status column (and the reason, when there is one)
        assert listed[name].split()[1] == expected, listed[name]
        if reason_word:
            assert reason_word in listed[name]
        # the app: the runs list's RunInfo and the dashboard feed's view of the same folder
        assert run_info(path).status == expected, name
        view = DashboardFeed(path, monitor=None).poll()
        assert view.status == expected and view.progress.state == expected, name
        # grpo-tui control: refused exactly when the run has ended, naming the same state
        code = cli.main(["control", str(path), "--loss-impl", "naive"])
        err = capsys.readouterr().err
        assert code == (1 if expected in ENDED_STATES else 0), (name, err)
        if expected in ENDED_STATES:
            assert f"the run is {expected};" in err


def test_the_live_runs_scan_agrees_with_the_full_one_and_skips_recorded_outcomes(
    tmp_path: Path, runs: dict[str, tuple[RunStatus, str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from grpo_tui.runs import listing
    from grpo_tui.runs.status import LIVE_STATES

    root = tmp_path / "runs"
    make_run(root / "i-finished", steps=3)  # run.json records it: its stream need not be read
    live = [r for r in listing.scan_runs(root) if r.status in LIVE_STATES]
    tails = []
    real = listing.tail_records
    monkeypatch.setattr(listing, "tail_records", lambda path: tails.append(Path(path).parent.name) or real(path))
    assert listing.scan_live_runs(root) == live
    assert [r.name for r in live] == ["g-starting", "c-submitted-with-records", "b-trainer-outlives-supervisor"]
    assert "i-finished" not in tails and "h-stopped" not in tails


def test_one_colour_per_state_for_list_and_badge() -> None:
    # the runs list and the dashboard's badge draw a state in the same colour; a badge is always bold
    assert status_style("finished") == "blue" and status_style("finished", badge=True) == "bold blue"
    assert status_style("running") == status_style("running", badge=True) == "bold green"
    assert status_style("lost") == "red" and status_style("unknown") == "" and status_style("?", badge=True) == "bold"
    assert all(status_style(state) for state in RunStatus)


def test_live_rank_pids_keeps_live_ranks_created_before_the_start_event(tmp_path: Path) -> None:
    from grpo_tui.launch import process_group, stacks
    from grpo_tui.runs.status import live_rank_pids

    me, dead = os.getpid(), _dead_pid()
    metrics = tmp_path / "metrics.jsonl"

    def start(when: float, pids: list[int]) -> None:
        ranks = [{"rank": i, "pid": p} for i, p in enumerate(pids)]
        metrics.write_text(json.dumps({"v": 1, "event": "start", "time": when, "ranks": ranks}) + "\n")

    start(time.time(), [me, dead, "x"])
    assert live_rank_pids(metrics) == [me]
    start(psutil.Process(me).create_time() - 60, [me])  # the id names a later process: not the rank
    assert live_rank_pids(metrics) == []
    metrics.write_text(json.dumps({"v": 1, "event": "start", "time": time.time(), "pid": me}) + "\n")
    assert live_rank_pids(metrics) == [me]  # one process, no ranks list
    assert live_rank_pids(tmp_path / "none.jsonl") == []
    # The group check and the stack dump ask the same function (pytest is not the trainer: no stacks).
    assert stacks.rank_pids(tmp_path) == []
    assert process_group.live_rank_pids is live_rank_pids and stacks.live_rank_pids is live_rank_pids
