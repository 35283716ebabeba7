"""The stall watchdog: heartbeat files (written, read, cached), PhaseMemory's running phase, the stall
alert naming the stuck rank and phase (fake clock), and the feed reading the beats of a live run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from grpo_tui.dashboard import alerts as A
from grpo_tui.dashboard.alerts import detect_alerts, span, stuck_rank_text
from grpo_tui.dashboard.feed import DashboardFeed
from grpo_tui.dashboard.state import RunState
from grpo_tui.runs.heartbeat import (
    COLLECTIVE,
    HEARTBEAT_STALE_S,
    IDLE,
    SETUP,
    Heartbeat,
    HeartbeatReader,
    heartbeat_path,
    read_heartbeat,
    write_heartbeat,
)
from grpo_tui.tools.demo import make_run
from grpo_tui.train.heartbeat import HeartbeatThread
from grpo_tui.train.phase_memory import PhaseMemory

T0 = 1000.0


def _beat(phase: str, started: float, when: float, rank: int = 0) -> Heartbeat:
    return Heartbeat(time=when, step=50, phase=phase, phase_started=started, rank=rank, pid=4242 + rank)


def _stream(n: int = 50) -> RunState:
    """n steps 1 s apart (step_time 1 s): the stall limit is STALL_MIN_S after the last one, at T0 + n."""
    state = RunState(max_steps=10_000)
    steps = [{"step": s, "time": T0 + s, "step_time": 1.0} for s in range(1, n + 1)]
    state.apply([{"event": "start", "time": T0}, *steps])
    return state


def test_heartbeat_round_trip_per_rank_and_garbage(tmp_path: Path) -> None:
    write_heartbeat(tmp_path, _beat("generation", 1.0, 2.0))
    write_heartbeat(tmp_path, _beat(COLLECTIVE, 1.5, 2.0, rank=1))
    assert heartbeat_path(tmp_path, 0).name == "heartbeat.json"
    assert read_heartbeat(tmp_path / "heartbeat-rank1.json") == _beat(COLLECTIVE, 1.5, 2.0, rank=1)
    assert oct(os.stat(tmp_path / "heartbeat.json").st_mode & 0o777) == "0o600"  # beside the user's data
    for bad in ("[]", "{", '{"time": "x"}', json.dumps({**_beat("loss", 1, 2).__dict__, "step": True})):
        (tmp_path / "heartbeat.json").write_text(bad)
        assert read_heartbeat(tmp_path / "heartbeat.json") is None


def test_reader_parses_again_only_when_the_file_changed(tmp_path: Path, monkeypatch) -> None:
    from grpo_tui.runs import heartbeat as H

    reader = HeartbeatReader(tmp_path)
    assert reader.read([0, 1]) == []
    write_heartbeat(tmp_path, _beat("generation", 1.0, 2.0))
    parsed = []
    real = H.read_heartbeat
    monkeypatch.setattr(H, "read_heartbeat", lambda path: parsed.append(path) or real(path))
    assert [b.phase for b in reader.read([0, 1])] == ["generation"]
    assert [b.phase for b in reader.read([0, 1])] == ["generation"]
    assert len(parsed) == 1  # the second poll was a stat only
    write_heartbeat(tmp_path, _beat("scoring", 3.0, 4.0))
    os.utime(tmp_path / "heartbeat.json", ns=(time.time_ns() + 10**9,) * 2)  # a coarse mtime still moves
    assert [b.phase for b in reader.read([])] == ["scoring"]


def test_phase_memory_reports_the_innermost_phase_and_since_when() -> None:
    phases = PhaseMemory("cpu")
    assert phases.running[0] is None
    phases.begin("loss")
    loss_since = phases.running[1]
    phases.begin("generation")  # TRL generates inside training_step
    assert phases.running[0] == "generation" and phases.running[1] >= loss_since
    phases.end("generation")
    assert phases.running == ("loss", loss_since)  # the enclosing phase resumes with its own start
    phases.end("loss")
    assert phases.running[0] is None


def test_heartbeat_thread_names_setup_phase_idle_and_collective(tmp_path: Path) -> None:
    clock = iter(range(100, 200)).__next__
    current: list[PhaseMemory | None] = [None]
    beats = HeartbeatThread(tmp_path, 0, lambda: current[0], lambda: 7, clock=lambda: float(clock()))
    beats.beat()
    assert read_heartbeat(tmp_path / "heartbeat.json").phase == SETUP
    current[0] = PhaseMemory("cpu")
    beats.beat()
    assert read_heartbeat(tmp_path / "heartbeat.json").phase == IDLE
    current[0].begin("generation")
    beats.beat()
    beat = read_heartbeat(tmp_path / "heartbeat.json")
    assert (beat.phase, beat.step, beat.pid) == ("generation", 7, os.getpid())
    with beats.during(COLLECTIVE):
        beats.beat()
        assert read_heartbeat(tmp_path / "heartbeat.json").phase == COLLECTIVE
    beats.beat()
    assert read_heartbeat(tmp_path / "heartbeat.json").phase == "generation"


def test_stall_alert_names_the_rank_and_phase_from_the_heartbeat() -> None:
    state = _stream()  # last step at T0 + 50
    now = T0 + 50 + 432  # no step for 7m12s
    beats = [_beat("generation", now - 425, now - 2)]
    assert detect_alerts(state, now=T0 + 50 + A.STALL_MIN_S - 1, heartbeats=beats) == []
    (alert,) = detect_alerts(state, now=now, heartbeats=beats)
    assert alert.kind == A.STALL and alert.severity == "error" and alert.step == 50
    assert "no step for 7m12s after step 50; rank 0 in generation for 7m05s" in alert.message
    assert "press d" in alert.message


def test_stall_with_a_busy_gpu_is_a_warning_when_the_heartbeat_names_the_phase() -> None:
    from grpo_tui.dashboard.monitor import GpuSnapshot, HostSnapshot, MonitorSnapshot

    now = T0 + 50 + 300
    gpu = GpuSnapshot(0, "H100", 1000.0, 2000.0, 99.0, 50.0, 100.0)
    busy = MonitorSnapshot(time=now, gpus=(gpu,), host=HostSnapshot(1.0, 1.0, 2.0), nvml_ok=True)
    assert detect_alerts(_stream(), busy, now=now) == []  # nothing says where: a slow step
    (alert,) = detect_alerts(_stream(), busy, now=now, heartbeats=[_beat(COLLECTIVE, now - 290, now)])
    assert alert.severity == "warning" and "in collective" in alert.message and "99%" in alert.message


def test_the_stuck_rank_is_the_frozen_one_then_the_one_the_others_wait_for() -> None:
    now = 5000.0
    waiting = _beat(COLLECTIVE, now - 600, now - 1, rank=0)
    working = _beat("generation", now - 300, now - 1, rank=1)
    assert stuck_rank_text([waiting, working], now) == "rank 1 in generation for 5m00s"
    frozen = _beat("loss", now - 900, now - HEARTBEAT_STALE_S - 60, rank=2)
    assert stuck_rank_text([waiting, working, frozen], now).startswith("rank 2 stopped beating 1m30s ago, in loss")
    assert [span(s) for s in (5, 432, 7500)] == ["5s", "7m12s", "2h05m"]


def test_feed_reads_the_heartbeat_of_a_live_run(tmp_path: Path) -> None:
    import psutil

    run = make_run(tmp_path / "live", steps=10, finished=False).path
    meta = json.loads((run / "run.json").read_text())
    me = psutil.Process(os.getpid())
    meta.update(status="running", pid=os.getpid(), pid_started=me.create_time(), started=time.time())
    meta.update(pgid=None, child_pid=None, child_started=None, exit_code=None)
    (run / "run.json").write_text(json.dumps(meta))
    now = [0.0]
    feed = DashboardFeed(run, monitor=None, clock=lambda: now[0])
    view = feed.poll()
    last = feed.state.last_time
    now[0] = last + 400
    write_heartbeat(run, _beat("generation", last + 5, now[0] - 1))
    view = feed.poll()
    stall = [a for a in view.alerts if a.kind == A.STALL]
    assert stall and "rank 0 in generation for 6m35s" in stall[0].message
