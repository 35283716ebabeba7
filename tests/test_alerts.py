"""Each GRPO alert fires on the condition it names, stays quiet otherwise, and is raised once per episode."""

from __future__ import annotations

import random
from pathlib import Path

from grpo_tui.dashboard import alerts as A
from grpo_tui.dashboard.alerts import AlertLog, detect_alerts
from grpo_tui.dashboard.loading import load_recent, load_run
from grpo_tui.dashboard.monitor import GpuSnapshot, HostSnapshot, MonitorSnapshot
from grpo_tui.dashboard.state import RunState
from grpo_tui.tools.demo import make_run

HEALTHY = {"frac_reward_zero_std": 0.1, "kl": 0.002, "entropy": 1.0, "completions/clipped_ratio": 0.05}


def _state(n: int, override: dict[int, dict] | None = None, t0: float = 1000.0, **series: object) -> RunState:
    """n healthy steps (1 s apart, step_time 1 s, flat memory); override[step] replaces fields of that step."""
    rng = random.Random(0)
    state = RunState(max_steps=10_000)
    recs = []
    for s in range(1, n + 1):
        rec = {
            "step": s,
            "time": t0 + s,
            "step_time": 1.0,
            **HEALTHY,
            "kl": 0.002 + rng.uniform(0, 0.0005),
            "memory": {
                "device": "cuda",
                "gpus": [{"index": 0, "peak_mib": 2000.0 + rng.uniform(-5, 5)}],
                "rss_mib": 1.0,
                "phases": {},
            },
        }
        for key, fn in series.items():
            rec[key] = fn(s)  # type: ignore[operator]
        rec.update((override or {}).get(s, {}))
        recs.append(rec)
    state.apply([{"event": "start", "time": t0}, *recs])
    return state


def _kinds(state: RunState, **kw: object) -> list[str]:
    return [a.kind for a in detect_alerts(state, **kw)]  # type: ignore[arg-type]


def _gpu_snapshot(util: float | None, when: float) -> MonitorSnapshot:
    gpu = GpuSnapshot(0, "H200", 1000.0, 2000.0, util, 50.0, 100.0)
    return MonitorSnapshot(time=when, gpus=(gpu,), host=HostSnapshot(1.0, 1.0, 2.0), nvml_ok=True)


def test_healthy_run_raises_nothing(tmp_path: Path) -> None:
    assert detect_alerts(_state(200), now=1201.0) == []
    # the recorded demo run (with a chunked -> naive switch that doubles memory once) is healthy too
    assert detect_alerts(load_run(make_run(tmp_path / "r", steps=300, switch_step=150).path), window=None) == []


def test_no_signal_after_enough_flat_steps_only() -> None:
    flat = {s: {"frac_reward_zero_std": 1.0} for s in range(50, 50 + A.ZERO_STD_STEPS)}
    alerts = detect_alerts(_state(100, flat), now=1101.0)
    assert [(a.kind, a.step) for a in alerts] == [(A.NO_SIGNAL, 50 + A.ZERO_STD_STEPS - 1)]
    assert "no learning signal" in alerts[0].message and "loss sits at 0" in alerts[0].message
    short = {s: {"frac_reward_zero_std": 1.0} for s in range(50, 50 + A.ZERO_STD_STEPS - 1)}
    assert _kinds(_state(100, short), now=1101.0) == []
    almost = {s: {"frac_reward_zero_std": 0.85} for s in range(50, 80)}
    assert _kinds(_state(100, almost), now=1101.0) == []


def test_kl_spike_needs_factor_and_floor() -> None:
    assert _kinds(_state(100, {60: {"kl": 0.5}}), now=1101.0) == [A.KL_SPIKE]
    # 10x the median but below the absolute floor: tiny KLs jitter harmlessly
    assert _kinds(_state(100, {60: {"kl": A.KL_FLOOR * 0.9}}), now=1101.0) == []
    # a high but steady KL is not a spike
    assert _kinds(_state(100, kl=lambda s: 0.2), now=1101.0) == []
    # consecutive spiking steps are one episode
    spikes = detect_alerts(_state(100, {60: {"kl": 0.5}, 61: {"kl": 0.6}}), now=1101.0)
    assert [(a.kind, a.step) for a in spikes] == [(A.KL_SPIKE, 60)]


def test_clipped_completions() -> None:
    high = {s: {"completions/clipped_ratio": 0.8} for s in range(30, 40)}
    alerts = detect_alerts(_state(60, high), now=1061.0)
    assert [a.kind for a in alerts] == [A.CLIPPED] and "max_completion_length" in alerts[0].message
    assert _kinds(_state(60, {s: {"completions/clipped_ratio": 0.5} for s in range(30, 40)}), now=1061.0) == []


def test_entropy_collapse() -> None:
    assert _kinds(_state(60, entropy=lambda s: 1.0 if s < 40 else 0.05), now=1061.0) == [A.ENTROPY_COLLAPSE]
    assert _kinds(_state(60, entropy=lambda s: 1.0 if s < 40 else 0.2), now=1061.0) == []
    assert _kinds(_state(5, entropy=lambda s: 0.0), now=1006.0) == []  # too few steps for an early mean


def test_memory_creep_monotone_rise_only() -> None:
    creep = {s: {"memory": {"gpus": [{"peak_mib": 2000.0 + 10 * (s - 40)}], "rss_mib": 1.0}} for s in range(40, 80)}
    alerts = detect_alerts(_state(100, creep), now=1101.0)
    assert [a.kind for a in alerts] == [A.MEMORY_CREEP] and "fragmentation" in alerts[0].message
    # the same rise with one dip in every 10 steps is not monotone
    dips = {
        s: {"memory": {"gpus": [{"peak_mib": 2000.0 + 10 * (s - 40) - (30 if s % 10 == 0 else 0)}], "rss_mib": 1.0}}
        for s in range(40, 80)
    }
    assert _kinds(_state(100, dips), now=1101.0) == []
    # monotone but tiny (< CREEP_FRAC)
    slow = {s: {"memory": {"gpus": [{"peak_mib": 2000.0 + 0.1 * (s - 40)}], "rss_mib": 1.0}} for s in range(40, 80)}
    assert _kinds(_state(100, slow), now=1101.0) == []


def test_stall_uses_time_and_gpu_utilisation() -> None:
    state = _state(50)  # last step at t=1050, step_time 1 s -> limit is STALL_MIN_S
    late = 1050.0 + A.STALL_MIN_S + 1
    assert _kinds(state, now=1050.0 + A.STALL_MIN_S - 1) == []
    assert _kinds(state, now=late) == [A.STALL]  # no GPU info: time only
    assert _kinds(state, snapshot=_gpu_snapshot(0.0, late), now=late) == [A.STALL]
    assert _kinds(state, snapshot=_gpu_snapshot(95.0, late), now=late) == []  # busy GPU: a slow step
    assert _kinds(state, snapshot=_gpu_snapshot(None, late), now=late) == [A.STALL]  # unreadable: time only
    assert [a.kind for a in detect_alerts(state, _gpu_snapshot(0.0, late))] == [A.STALL]  # now from the snapshot
    slow = _state(50, step_time=lambda s: 30.0)  # 5 x 30 s > 60 s
    assert _kinds(slow, now=1050.0 + 100) == []
    state.apply([{"event": "finish", "step": 50, "time": 1050.5}])
    assert _kinds(state, now=late + 1000) == []  # a finished run does not stall


def test_generation_fallbacks_are_warnings_naming_what_runs_instead() -> None:
    state = _state(10)
    state.apply(
        [
            {"event": "generation_fallback", "requested": "graph", "used": "generate", "reason": "FSDP reshards"},
            {
                "event": "generation_fallback",
                "step": 4,
                "requested": "graph (decode kernel)",
                "used": "graph (sdpa attention)",
                "reason": "decode attention kernel failed (RuntimeError: x)",
            },
        ]
    )
    alerts = [a for a in detect_alerts(state, now=1011.0) if a.kind == A.GENERATION_FALLBACK]
    assert [(a.severity, a.step) for a in alerts] == [("warning", 0), ("warning", 4)]
    assert alerts[0].message == "generation: graph could not run, using generate: FSDP reshards"
    assert "using graph (sdpa attention): decode attention kernel failed" in alerts[1].message


def test_failure_events_are_alerts() -> None:
    state = _state(10)
    state.apply([{"event": "oom", "step": 11, "phase": "loss", "time": 1011.0}])
    alerts = detect_alerts(state, now=1012.0)
    assert [(a.kind, a.severity, a.step) for a in alerts] == [(A.RUN_FAILED, "error", 11)]
    assert "loss phase" in alerts[0].message and "sub_batch" not in alerts[0].message
    # the rollout's phases name the option that bounds them
    state.apply([{"event": "oom", "step": 12, "phase": "scoring", "time": 1013.0}])
    scoring = [a for a in detect_alerts(state, now=1014.0) if a.step == 12]
    assert "out of memory in the scoring phase at step 12: set grpo.scoring_sub_batch" in scoring[0].message


def test_alert_log_raises_each_episode_once_while_it_persists() -> None:
    log = AlertLog()
    state = _state(100)
    assert log.update(detect_alerts(state, now=1101.0)) == []
    rng = random.Random(1)
    new_total = []
    for s in range(101, 160):  # no signal from step 101 on, arriving one step at a time
        state.apply(
            [
                {
                    "step": s,
                    "time": 1000.0 + s,
                    "step_time": 1.0,
                    **HEALTHY,
                    "frac_reward_zero_std": 1.0,
                    "kl": 0.002 + rng.uniform(0, 0.0005),
                }
            ]
        )
        new_total += log.update(detect_alerts(state, now=1000.0 + s, window=20))
    assert [(a.kind, a.step) for a in new_total] == [(A.NO_SIGNAL, 100 + A.ZERO_STD_STEPS)]
    assert len(log.alerts) == 1 and log.active(state, within_steps=100) == log.alerts
    assert log.active(state, within_steps=5) == log.alerts  # still under way: stays active
    state.apply([{"step": 160, "time": 1160.0, "step_time": 1.0, **HEALTHY}])  # the signal is back
    assert log.update(detect_alerts(state, now=1160.0, window=20)) == []
    assert log.active(state, within_steps=5) == [] and len(log.alerts) == 1


def test_window_bounds_the_scan() -> None:
    state = _state(2000, {100: {"kl": 0.9}})
    assert _kinds(state, now=3001.0, window=None) == [A.KL_SPIKE]
    assert _kinds(state, now=3001.0, window=500) == []


def test_partial_state_waits_for_the_history(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=300, finished=False, completions=False)
    with open(run.path / "metrics.jsonl", "a") as handle:  # no signal at the very end
        for s in range(301, 311):
            handle.write(f'{{"step": {s}, "time": {2e9 + s}, "frac_reward_zero_std": 1.0}}\n')
        handle.write('{"event": "oom", "step": 311, "phase": "generation"}\n')
    quick = load_recent(run.path, recent_bytes=5000)
    assert quick.partial
    assert [a.kind for a in detect_alerts(quick, now=2e9 + 311)] == [A.RUN_FAILED]
    full = load_run(run.path)
    assert [a.kind for a in detect_alerts(full, now=2e9 + 311)] == [A.NO_SIGNAL, A.RUN_FAILED]
