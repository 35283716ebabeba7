"""RunState, load_run, downsample and scan_runs on recorded (grpo_tui.tools.demo) and hand-made streams."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from grpo_tui.dashboard.loading import load_recent, load_run
from grpo_tui.dashboard.series import downsample, downsample_indices
from grpo_tui.dashboard.state import PEAK_MIB, TOKENS_PER_S, RunState, phase_series
from grpo_tui.runs.listing import run_info, scan_runs
from grpo_tui.runs.metrics import TAIL_BYTES, read_records
from grpo_tui.tools.demo import LiveWriter, make_run, step_record


def _step(step: int, **fields: object) -> dict:
    return {"v": 1, "time": 1000.0 + step, "step": step, **fields}


def _mem(peak: float, phases: dict[str, float] | None = None, gpus: int = 1) -> dict:
    return {
        "device": "cuda",
        "gpus": [
            {"index": i, "allocated_mib": peak / 2, "peak_mib": peak + i, "reserved_mib": peak * 1.1}
            for i in range(gpus)
        ],
        "rss_mib": 500.0,
        "phases": phases or {"generation": peak * 0.5, "scoring": peak * 0.6, "loss": peak, "optimizer": peak * 0.7},
    }


# ---- RunState -----------------------------------------------------------------------------------
def test_columns_per_reward_function_and_tokens_per_s() -> None:
    state = RunState()
    recs = [
        _step(
            s,
            reward=0.1 * s,
            reward_std=0.2,
            loss=0.5,
            num_tokens=100.0 * s,
            step_time=0.5,
            **{"rewards/acc/mean": 0.1 * s, "rewards/acc/std": 0.3, "rewards/fmt/mean": 1.0, "rewards/fmt/std": 0.0},
        )
        for s in range(1, 6)
    ]
    assert state.apply(recs)
    assert len(state) == 5 and state.last_step == 5
    assert state.reward_functions == ["acc", "fmt"]
    xs, ys = state.series("rewards/acc/mean")
    assert xs == [1, 2, 3, 4, 5] and ys == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    # 100 new tokens per 0.5 s step; the first step has no previous count
    xs, tps = state.series(TOKENS_PER_S)
    assert xs == [2, 3, 4, 5] and tps == pytest.approx([200.0] * 4)
    assert state.last("reward") == pytest.approx(0.5)
    assert not state.apply([])


def test_tokens_per_s_falls_back_to_time_deltas_across_batches() -> None:
    state = RunState()
    state.apply([{"step": 1, "time": 10.0, "num_tokens": 0.0}])
    state.apply([{"step": 2, "time": 12.0, "num_tokens": 50.0}, {"step": 3, "time": 13.0, "num_tokens": 80.0}])
    assert state.series(TOKENS_PER_S) == ([2, 3], [25.0, 30.0])


def test_missing_and_non_numeric_values_become_gaps() -> None:
    state = RunState()
    state.apply([_step(1, reward=0.1, kl=0.01), _step(2, reward=None), _step(3, reward="oops", kl=0.02)])
    state.apply([_step(4, reward=0.4, entropy=1.0)])  # a metric first seen late
    assert not state.apply([{"step": None, "reward": 9.0}, {"step": "x"}, {"reward": 1.0}])  # no usable step
    assert state.series("reward") == ([1, 4], [0.1, 0.4])
    assert state.series("kl") == ([1, 3], [0.01, 0.02])
    assert state.series("entropy") == ([4], [1.0])
    assert all(len(state.column(n)) == 4 for n in state.series_names())
    assert state.series("no_such_metric") == ([], [])


def test_memory_peaks_per_phase_and_before_after_switch() -> None:
    state = RunState()
    state.apply(
        [
            {
                "event": "start",
                "time": 999.0,
                "ranks": [
                    {"pid": 11, "rank": 0, "local_rank": 0, "device": "cuda:0"},
                    {"pid": 12, "rank": 1, "local_rank": 1, "device": "cuda:1"},
                ],
                "max_steps": 9,
                "loss_impl": "chunked",
            }
        ]
    )
    state.apply([_step(s, memory=_mem(1000.0 + s, gpus=2), loss_impl="chunked") for s in range(1, 4)])
    state.apply(
        [
            {"event": "loss_impl_switch", "step": 4, "from": "chunked", "to": "naive", "time": 1003.5},
            *[_step(s, memory=_mem(3000.0 - s), loss_impl="naive") for s in range(4, 7)],
        ]
    )
    assert state.pid_gpu == {11: 0, 12: 1} and state.pid_rank == {11: 0, 12: 1}
    assert state.max_steps == 9
    assert state.switch_steps == [4] and state.loss_impl == "naive"
    assert state.phase_peaks_before_switch["loss"] == 1003.0
    assert state.phase_peaks_since_switch["loss"] == 2996.0
    assert state.phase_peaks["loss"] == 2996.0 and state.phase_peaks["generation"] == 1498.0
    # the run peak is the max over GPUs (the second GPU reads peak + 1 in _mem)
    assert state.run_peak_mib == 2996.0 and state.series(PEAK_MIB)[1][:3] == [1002.0, 1003.0, 1004.0]
    assert state.series(phase_series("scoring"))[1][-1] == pytest.approx(0.6 * 2994.0)
    assert state.step_impls == ["chunked"] * 3 + ["naive"] * 3


def test_cpu_memory_uses_rss_and_odd_memory_records_do_not_break() -> None:
    state = RunState()
    state.apply(
        [
            _step(1, memory={"device": "cpu", "gpus": [], "rss_mib": 700.0, "phases": {"loss": 710.0}}),
            _step(2, memory="garbage"),
            _step(3),
        ]
    )
    assert state.series(PEAK_MIB) == ([1], [700.0])
    assert state.series(phase_series("loss")) == ([1], [710.0])
    assert state.phase_peaks == {"loss": 710.0} and state.run_peak_mib == 700.0


def test_an_integer_beyond_a_double_in_memory_reads_as_infinity() -> None:
    state = RunState()
    phases = {"generation": 10**400, "scoring": 1.0, "loss": 2.0, "optimizer": 3.0}
    state.apply([_step(1, memory={"device": "cuda", "gpus": [], "rss_mib": 10**400, "phases": phases})])
    assert state.phase_peaks["generation"] == math.inf and state.phase_peaks["loss"] == 2.0


@pytest.mark.parametrize(
    ("device", "local_rank", "gpu"), [("cuda:3", 3, 3), ("cuda", 2, 2), ("cpu", 0, None), (1, None, 1)]
)
def test_pid_to_gpu_from_start_records(device: object, local_rank: object, gpu: int | None) -> None:
    state = RunState()
    state.apply([{"event": "start", "pid": 77, "rank": 0, "local_rank": local_rank, "device": device}])
    assert state.pid_gpu == {77: gpu}


def test_status_and_progress() -> None:
    state = RunState(max_steps=100)
    state.apply([{"event": "start", "time": 1000.0}, *[_step(s, step_time=1.0) for s in range(1, 11)]])
    progress = state.progress()
    assert (progress.step, progress.max_steps) == (10, 100)
    assert progress.elapsed_s == pytest.approx(10.0)
    assert progress.eta_s == pytest.approx(90.0)
    assert state.progress(now=1030.0).elapsed_s == pytest.approx(30.0)  # live: to now
    assert state.status == "running"
    state.apply([{"event": "stop_requested", "step": 10}, {"event": "finish", "step": 10, "time": 1011.0}])
    assert state.status == "stopped" and state.progress().eta_s == 0.0
    failed = RunState()
    failed.apply([{"event": "oom", "step": 3, "phase": "loss"}])
    assert failed.status == "failed" and failed.events_of("oom")[0].data["phase"] == "loss"
    done = RunState()
    done.apply([{"event": "finish", "step": 3, "stopped": True}])
    assert done.status == "stopped"


# ---- load_run -----------------------------------------------------------------------------------
def test_load_run_reads_config_and_every_record(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=120, max_steps=500, switch_step=60, n_gpus=2)
    state = load_run(run.path)
    assert (state.max_steps, state.preset, len(state)) == (500, "tiny-cpu", 120)
    assert state.switch_steps == [60] and state.status == "finished"
    assert set(state.pid_gpu.values()) == {0, 1}
    assert state.reward_functions == ["addition_partial", "format"]
    raw = [r for r in read_records(run.path / "metrics.jsonl") if "event" not in r]
    assert state.series("reward")[1] == [r["reward"] for r in raw]
    assert state.phase_peaks["loss"] == max(r["memory"]["phases"]["loss"] for r in raw)


def test_load_run_in_small_blocks_matches_one_block(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=50, switch_step=20)
    whole, blocks = load_run(run.path), load_run(run.path, block_bytes=333)  # blocks cut lines mid-way
    assert len(whole) == len(blocks) == 50
    for name in whole.series_names():
        assert whole.series(name) == blocks.series(name), name
    assert whole.phase_peaks_before_switch == blocks.phase_peaks_before_switch
    assert whole.tail.offset == blocks.tail.offset == (run.path / "metrics.jsonl").stat().st_size


def test_truncated_last_line_is_held_back_then_read(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=10, finished=False, truncate_last=True)
    metrics = run.path / "metrics.jsonl"
    state = load_run(run.path)
    assert len(state) == 10 and state.last_step == 10
    # the writer finishes its line (rewrite the partial tail as a complete record) and adds one more
    text = metrics.read_text()
    complete = text[: text.rfind("\n") + 1]
    rng = random.Random(5)
    metrics.write_text(complete + json.dumps(step_record(11, rng)) + "\n" + json.dumps(step_record(12, rng)))
    assert state.apply(state.tail.read_new())
    assert state.last_step == 11  # 12 is still unterminated
    with open(metrics, "a") as handle:
        handle.write("\n")
    state.apply(state.tail.read_new())
    assert state.last_step == 12 and len(state) == 12


def test_load_recent_has_every_event_but_only_the_newest_steps(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=400, switch_step=100, n_gpus=2, finished=False, completions=False)
    full = load_run(run.path)
    quick = load_recent(run.path, recent_bytes=20_000)
    assert quick.partial and not full.partial
    assert 0 < len(quick) < 100 and quick.last_step == 400
    n = len(quick)
    assert quick.series("reward") == (full.series("reward")[0][-n:], full.series("reward")[1][-n:])
    assert quick.switch_steps == [100] and quick.pid_gpu == full.pid_gpu and quick.max_steps == 400
    assert quick.progress().elapsed_s == full.progress().elapsed_s  # the start event was found
    assert quick.tail.offset == full.tail.offset
    with open(run.path / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(step_record(401, random.Random(2))) + "\n")
    quick.apply(quick.tail.read_new())
    assert quick.last_step == 401
    small = load_recent(run.path, recent_bytes=10**9)  # the window covers the file: a complete state
    assert not small.partial and len(small) == 401
    assert len(load_recent(tmp_path / "none")) == 0


def test_torn_line_mid_file_and_nan_values_lose_nothing_else(tmp_path: Path) -> None:
    # a crash left half a record, then a resumed writer went on; json.dumps writes NaN for a nan metric
    lines = [json.dumps(_step(s, reward=0.1 * s, kl=float("nan") if s == 3 else 0.01)) for s in range(1, 3001)]
    lines[1500] = lines[1500][:40]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    state = load_run(tmp_path)
    assert len(state) == 2999 and 1501 not in state.steps
    assert state.series("kl")[0][:3] == [1, 2, 4]
    assert state.series("reward")[1][-1] == pytest.approx(300.0)


def test_load_run_of_an_empty_folder(tmp_path: Path) -> None:
    state = load_run(tmp_path)
    assert len(state) == 0 and state.progress().step == 0 and state.max_steps is None


# ---- downsample ---------------------------------------------------------------------------------
def test_downsample_keeps_extremes_first_and_last() -> None:
    rng = random.Random(0)
    ys = [rng.random() for _ in range(10_000)]
    ys[4321], ys[777] = 50.0, -50.0  # spikes
    ys[-1] = 0.123456
    xs = list(range(len(ys)))
    dx, dy = downsample(xs, ys, 200)
    assert len(dx) <= 200
    assert dx[0] == 0 and dx[-1] == 9999 and dy[-1] == 0.123456
    assert 50.0 in dy and -50.0 in dy
    assert dx == sorted(dx) and len(set(dx)) == len(dx)
    assert [ys[int(x)] for x in dx] == dy


def test_downsample_short_series_unchanged_and_nan_skipped() -> None:
    assert downsample([1, 2, 3], [3.0, 1.0, 2.0], 100) == ([1, 2, 3], [3.0, 1.0, 2.0])
    ys = [math.nan] * 3 + [float(i % 7) for i in range(1000)] + [math.nan] * 2
    idx = downsample_indices(ys, 50)
    assert idx and all(not math.isnan(ys[i]) for i in idx)
    assert idx[0] == 3 and idx[-1] == 1002 and len(idx) <= 50
    assert downsample_indices([math.nan] * 500, 50) == []


def test_state_downsampled_is_incremental_and_matches_fresh_computation() -> None:
    rng = random.Random(1)
    live, fresh = RunState(), RunState()
    recs = [_step(s, reward=rng.random(), reward_std=0.1) for s in range(1, 3001)]
    recs[1234]["reward"] = 9.0
    live.apply(recs[:1000])
    live.downsampled("reward", 100)
    live.apply(recs[1000:2500])
    live.downsampled("reward", 100)
    live.apply(recs[2500:])
    fresh.apply(recs)
    got = live.downsampled("reward", 100, "reward_std", "missing")
    assert got[:3] == fresh.downsampled("reward", 100, "reward_std")
    xs, ys, std, missing = got
    assert len(xs) <= 100 and xs[0] == 1 and xs[-1] == 3000 and 9.0 in ys
    assert std == [0.1] * len(xs) and all(math.isnan(v) for v in missing)
    assert live.downsampled("nothing", 100) == ([], [])


# ---- scan_runs ----------------------------------------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_scan_runs_statuses(tmp_path: Path) -> None:
    me = psutil.Process(os.getpid())
    dead = _dead_pid()
    make_run(tmp_path / "1-finished", steps=5)
    make_run(tmp_path / "2-running", steps=5, finished=False, pid=os.getpid(), pid_started=me.create_time())
    make_run(tmp_path / "3-lost", steps=5, finished=False, pid=dead)
    make_run(tmp_path / "4-stopped", steps=5, status="stopped")
    make_run(tmp_path / "5-reused-pid", steps=5, finished=False, pid=os.getpid())  # our pid, another start time
    make_run(tmp_path / "6-ended-unrecorded", steps=5, finished=True, status="running", pid=dead)
    crashed = make_run(tmp_path / "7-crashed", steps=5, finished=False, pid=dead)
    with open(crashed.path / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"v": 1, "time": 1.0, "event": "error", "message": "boom"}) + "\n")
    (tmp_path / "not-a-run").mkdir()
    infos = {i.name: i for i in scan_runs(tmp_path)}
    assert list(infos) == sorted(infos, reverse=True)  # newest (largest name) first
    assert {k: v.status for k, v in infos.items()} == {
        "1-finished": "finished",
        "2-running": "running",
        "3-lost": "lost",
        "4-stopped": "stopped",
        "5-reused-pid": "lost",
        "6-ended-unrecorded": "finished",
        "7-crashed": "failed",
    }
    info = infos["1-finished"]
    assert (info.preset, info.steps, info.loss_impl) == ("tiny-cpu", 5, "chunked")
    assert info.last_reward == read_records(info.path / "metrics.jsonl")[-2]["reward"]


def test_runs_without_runner_pids_and_fresh_starting_runs(tmp_path: Path) -> None:
    me = psutil.Process(os.getpid())
    run = make_run(tmp_path / "bare", steps=3, finished=False, pid=os.getpid())
    (run.path / "run.json").unlink()  # started without the runner: only the stream's start event names pids
    assert run_info(run.path).status == "lost"  # the start event's time (2026-01-01) predates this process
    metrics = run.path / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    start = json.loads(lines[0])
    start["time"] = me.create_time() + 1
    metrics.write_text(json.dumps(start) + "\n" + "".join(lines[1:]))
    assert run_info(run.path).status == "running"
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "run.json").write_text(json.dumps({"status": "starting", "created": time.time()}))
    assert run_info(fresh).status == "starting"
    (fresh / "run.json").write_text(json.dumps({"status": "starting", "created": time.time() - 3600}))
    assert run_info(fresh).status == "lost"


def test_run_info_reads_only_the_tail_of_a_long_file(tmp_path: Path) -> None:
    run = make_run(tmp_path / "long", steps=400, completions=False, truncate_last=True)
    assert (run.path / "metrics.jsonl").stat().st_size > 4 * TAIL_BYTES
    info = run_info(run.path)
    assert info.steps == 400 and info.status == "finished" and info.started is not None
    assert scan_runs(tmp_path / "nowhere") == []


# ---- the demo generator -------------------------------------------------------------------------
def test_make_run_is_deterministic(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a" / "run", steps=30, switch_step=10)
    b = make_run(tmp_path / "b" / "run", steps=30, switch_step=10)
    for name in ("metrics.jsonl", "completions.jsonl", "config.toml"):
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes(), name


def test_live_writer_appends_valid_steps(tmp_path: Path) -> None:
    run = make_run(tmp_path / "live", steps=5, finished=False)
    state = load_run(run.path)
    with LiveWriter(run.path, hz=50.0, start_step=6):
        deadline = time.monotonic() + 20
        while len(state) < 10 and time.monotonic() < deadline:
            state.apply(state.tail.read_new())
            time.sleep(0.02)
    state.apply(state.tail.read_new())
    assert len(state) >= 10
    assert list(state.steps) == list(range(1, len(state) + 1))
    assert state.series(TOKENS_PER_S)[0]  # live records carry num_tokens and step_time


@pytest.mark.parametrize("old_order", [False, True])
def test_the_current_implementation_never_flips_back(old_order: bool) -> None:
    """Issue 15 item 1: record by record the dashboard's implementation went naive -> chunked -> naive.

    The trainer now writes the switch after the last old-impl record and names the first new-impl step;
    streams written before that (event first, naming the step whose record still says chunked) must
    not flip either.
    """
    event = {"event": "loss_impl_switch", "step": 5, "from": "chunked", "to": "naive"}
    old, new = _step(4 + old_order, loss_impl="chunked"), _step(5 + old_order, loss_impl="naive")
    stream = (
        [_step(3, loss_impl="chunked"), event, old, new]
        if old_order
        else [_step(3, loss_impl="chunked"), old, event, new]
    )
    state, seen = RunState(loss_impl="chunked"), []
    for record in stream:
        state.apply([record])
        seen.append(state.loss_impl)
    first_naive = seen.index("naive")
    assert seen[first_naive:] == ["naive"] * (len(seen) - first_naive), seen
    assert state.switch_steps == [5]
