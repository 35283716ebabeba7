"""GRPO-aware alerts computed from a RunState (and, for a stall, a MonitorSnapshot).

`detect_alerts` returns the alert episodes of the recent window (and any still under way), each
stamped with the step at which its condition first held (its onset). While a condition persists
the onset, and so the Alert, stays the same: `AlertLog.update` keeps alerts by (kind, step), so a
condition is raised once per episode, not once per step. The series checks are incremental: each
RunState's points are judged once, so a call on a live 100,000-step run costs its new steps.
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from grpo_tui.dashboard.monitor import MonitorSnapshot
from grpo_tui.dashboard.state import PEAK_MIB, RunState
from grpo_tui.runs.failures import oom_message
from grpo_tui.runs.heartbeat import HEARTBEAT_STALE_S, Heartbeat

# frac_reward_zero_std at or above this counts as "no learning signal" for a step.
ZERO_STD_FRAC = 0.9
# ... for this many consecutive steps before alerting (a single flat batch is normal).
ZERO_STD_STEPS = 5
# A KL spike: kl above this multiple of its median over the preceding KL_WINDOW steps ...
KL_SPIKE_FACTOR = 5.0
KL_WINDOW = 20
# ... and above this absolute value (tiny KLs jitter by large factors harmlessly).
KL_FLOOR = 0.01
# completions/clipped_ratio above this: most completions hit max_completion_length.
CLIPPED_RATIO = 0.5
# ... for this many consecutive steps.
CLIPPED_STEPS = 3
# Entropy below this fraction of its early mean counts as collapsed.
ENTROPY_COLLAPSE_FRAC = 0.1
# Steps averaged for the "early" entropy, and consecutive collapsed steps before alerting.
ENTROPY_EARLY_STEPS = 10
ENTROPY_STEPS = 3
# A stall: no new step for max(STALL_MIN_S, STALL_STEP_FACTOR x median step time) ...
STALL_MIN_S = 60.0
STALL_STEP_FACTOR = 5.0
# ... while every readable GPU sits at or below this utilisation (%); with heartbeats (which name the
# phase) a busy GPU only lowers the alert to a warning: a hung collective keeps the GPU busy too.
STALL_GPU_UTIL_PCT = 5.0
# Memory creep: the per-step peak never falls for this many steps ...
CREEP_STEPS = 20
# ... and rises by more than this fraction over them (allocator fragmentation or a leak).
CREEP_FRAC = 0.05
# Steps back from the newest whose new episodes are reported by default (older, finished ones are
# in the AlertLog already, or are asked for with window=None).
ALERT_SCAN_STEPS = 500

NO_SIGNAL, KL_SPIKE, CLIPPED, ENTROPY_COLLAPSE, STALL, MEMORY_CREEP, RUN_FAILED, GENERATION_FALLBACK = (
    "no_signal",
    "kl_spike",
    "clipped_completions",
    "entropy_collapse",
    "stall",
    "memory_creep",
    "run_failed",
    "generation_fallback",
)
ALERT_KINDS = (NO_SIGNAL, KL_SPIKE, CLIPPED, ENTROPY_COLLAPSE, STALL, MEMORY_CREEP, RUN_FAILED, GENERATION_FALLBACK)


@dataclass(frozen=True)
class Alert:
    kind: str
    severity: str  # "warning" | "error"
    step: int  # the step at which the condition first held (stable while it persists)
    message: str


class _Tracker:
    """Episodes of one series, fed incrementally: each new point is judged once (`flag` returns the
    alert message when the point meets the condition), and an episode is `min_run` consecutive
    flagged points; its alert is stamped with the step where the run reached `min_run`."""

    kind = ""
    series = ""
    min_run = 1

    def __init__(self) -> None:
        self.next = 0  # the next column index to judge
        self.run = 0  # flagged points in a row so far
        self.found: list[tuple[int, Alert]] = []  # (column index, alert) of every episode, oldest first

    def flag(self, value: float, step: int) -> str | None:
        raise NotImplementedError

    def feed(self, steps: Sequence[float], col: Sequence[float]) -> None:
        for i in range(self.next, len(col)):
            value, step = col[i], steps[i]
            if math.isnan(value) or math.isnan(step):
                continue  # a step without this metric neither breaks nor extends an episode
            message = self.flag(value, int(step))
            self.run = self.run + 1 if message else 0
            if self.run == self.min_run and message:
                self.found.append((i, Alert(self.kind, "warning", int(step), message)))
        self.next = len(col)

    @property
    def ongoing(self) -> bool:
        return self.run >= self.min_run


class _NoSignal(_Tracker):
    kind, series, min_run = NO_SIGNAL, "frac_reward_zero_std", ZERO_STD_STEPS

    def flag(self, value: float, step: int) -> str | None:
        if value < ZERO_STD_FRAC:
            return None
        return (
            f"no learning signal: every group's rewards are identical (frac_reward_zero_std ≥ {ZERO_STD_FRAC} "
            f"for {ZERO_STD_STEPS}+ steps); loss sits at 0 — raise temperature or num_generations, or ease the reward"
        )


class _KlSpike(_Tracker):
    kind, series = KL_SPIKE, "kl"  # consecutive spiking steps are one episode

    def __init__(self) -> None:
        super().__init__()
        self.recent: deque[float] = deque(maxlen=KL_WINDOW)

    def flag(self, value: float, step: int) -> str | None:
        message = None
        if len(self.recent) == KL_WINDOW and value > KL_FLOOR:
            median = statistics.median(self.recent)
            if value > KL_SPIKE_FACTOR * median:
                message = (
                    f"KL spike at step {step}: {value:.4g} vs recent median {median:.3g} "
                    f"(>{KL_SPIKE_FACTOR:g}x) — lower the learning rate or raise beta"
                )
        self.recent.append(value)
        return message


class _Clipped(_Tracker):
    kind, series, min_run = CLIPPED, "completions/clipped_ratio", CLIPPED_STEPS

    def flag(self, value: float, step: int) -> str | None:
        if value <= CLIPPED_RATIO:
            return None
        return (
            f"{value:.0%} of completions hit max_completion_length (>{CLIPPED_RATIO:.0%} for {CLIPPED_STEPS}+ "
            "steps) — raise grpo.max_completion_length"
        )


class _EntropyCollapse(_Tracker):
    kind, series, min_run = ENTROPY_COLLAPSE, "entropy", ENTROPY_STEPS

    def __init__(self) -> None:
        super().__init__()
        self.early: list[float] = []  # the first ENTROPY_EARLY_STEPS values: the reference

    def flag(self, value: float, step: int) -> str | None:
        if len(self.early) < ENTROPY_EARLY_STEPS:
            self.early.append(value)
            return None
        early_mean = sum(self.early) / len(self.early)
        if early_mean <= 0 or value >= ENTROPY_COLLAPSE_FRAC * early_mean:
            return None
        return (
            f"entropy collapsed to {value:.3g} (< {ENTROPY_COLLAPSE_FRAC:g} x early mean {early_mean:.3g}): the "
            "policy stopped exploring — lower the learning rate or raise temperature"
        )


class _MemoryCreep(_Tracker):
    kind, series = MEMORY_CREEP, PEAK_MIB

    def __init__(self) -> None:
        super().__init__()
        self.last: deque[float] = deque(maxlen=CREEP_STEPS)
        self.rising = 0  # values in the current never-falling run

    def flag(self, value: float, step: int) -> str | None:
        self.rising = self.rising + 1 if self.last and value >= self.last[-1] else 1
        self.last.append(value)
        first = self.last[0]
        if self.rising < CREEP_STEPS or first <= 0 or value <= first * (1 + CREEP_FRAC):
            return None
        return (
            f"peak memory rose every step for {CREEP_STEPS} steps ({first:.0f} → {value:.0f} MiB): "
            "fragmentation or a leak — try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        )


_TRACKERS = (_NoSignal, _KlSpike, _Clipped, _EntropyCollapse, _MemoryCreep)
# Each RunState's trackers, so a live run's alerts cost only its new points (RunState only grows).
_STATE_TRACKERS: weakref.WeakKeyDictionary[RunState, list[_Tracker]] = weakref.WeakKeyDictionary()


def _series_alerts(state: RunState, window: int | None) -> list[Alert]:
    trackers = _STATE_TRACKERS.get(state)
    if trackers is None:
        trackers = _STATE_TRACKERS[state] = [cls() for cls in _TRACKERS]
    first = 0 if window is None else len(state) - window
    out = []
    for tracker in trackers:
        tracker.feed(state.steps, state.column(tracker.series))
        found = tracker.found
        out += [alert for i, alert in found if i >= first]
        if tracker.ongoing and found and found[-1][0] < first:
            out.append(found[-1][1])  # an episode still under way keeps its onset, however old
    return out


def _stall(
    state: RunState, snapshot: MonitorSnapshot | None, now: float | None, beats: Sequence[Heartbeat] = ()
) -> list[Alert]:
    if state.status != "running" or state.last_time is None or not len(state):
        return []
    now = now if now is not None else (snapshot.time if snapshot is not None else time.time())
    limit = max(STALL_MIN_S, STALL_STEP_FACTOR * (state.median_step_time(20) or 0.0))
    idle = now - state.last_time
    if idle <= limit:
        return []
    utils = [g.utilization_pct for g in snapshot.gpus if g.utilization_pct is not None] if snapshot else []
    busy = bool(utils) and max(utils) > STALL_GPU_UTIL_PCT
    if busy and not beats:
        return []  # the GPU is busy and nothing says where: a slow step (e.g. a long generation), not a stall
    if beats:
        # A hung collective keeps the GPU busy too: with the phase named, say it, as a warning while busy.
        where = f"; {stuck_rank_text(beats, now)}" + (f" (GPU utilisation {max(utils):.0f}%)" if busy else "")
        text = f"no step for {span(idle)} after step {state.last_step}{where} — press d for stacks, see the Log tab"
        return [Alert(STALL, "warning" if busy else "error", state.last_step, text)]
    where = f" while GPU utilisation is {max(utils):.0f}%" if utils else ""
    return [
        Alert(
            STALL,
            "error",
            state.last_step,
            f"stalled: no new step for {idle:.0f} s after step {state.last_step}{where} — check stdout.log",
        )
    ]


def stuck_rank_text(beats: Sequence[Heartbeat], now: float) -> str:
    """The rank most likely holding the run up, from the heartbeats, as a clause of the stall alert.

    A rank whose beat stopped is frozen (or gone): it comes first. Else a rank that is in a phase of its
    own while the others wait for it in a collective; else the rank whose current phase began first.
    """
    stale = [b for b in beats if now - b.time > HEARTBEAT_STALE_S]
    if stale:
        beat = min(stale, key=lambda b: b.time)
        return f"rank {beat.rank} stopped beating {span(now - beat.time)} ago, in {beat.phase} (frozen or gone)"
    working = [b for b in beats if not b.waiting] or list(beats)
    beat = min(working, key=lambda b: (b.phase_started, b.rank))
    return f"rank {beat.rank} in {beat.phase} for {span(now - beat.phase_started)}"


def span(seconds: float) -> str:
    """A duration as the alert says it: 45s, 7m12s, 2h05m."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _failed(state: RunState) -> list[Alert]:
    out = []
    for event in state.events_of("error", "oom"):
        if event.kind == "oom":
            text = oom_message(event.data.get("phase"), event.step)
        else:
            text = f"run failed: {event.data.get('message') or event.data.get('error') or 'see stdout.log'}"
        out.append(Alert(RUN_FAILED, "error", event.step or 0, text))
    return out


def _fallbacks(state: RunState) -> list[Alert]:
    # The rollout path asked for is not the one running (graph -> generate, or the graph without one of its
    # speed-ups): the run goes on, slower than the preset promised
    return [
        Alert(
            GENERATION_FALLBACK,
            "warning",
            event.step or 0,
            f"generation: {event.data.get('requested')} could not run, using {event.data.get('used')}: "
            f"{event.data.get('reason')}",
        )
        for event in state.events_of("generation_fallback")
    ]


def detect_alerts(
    state: RunState,
    snapshot: MonitorSnapshot | None = None,
    *,
    window: int | None = ALERT_SCAN_STEPS,
    now: float | None = None,
    heartbeats: Sequence[Heartbeat] = (),
) -> list[Alert]:
    """Alert episodes in the last `window` steps (None: the whole run), oldest first.

    Args:
        state: The run.
        snapshot: The latest monitor sample (GPU utilisation for the stall check); None on no data.
        window: Steps scanned back from the newest.
        now: Wall-clock time for the stall check (default: the snapshot's time, else time.time()).
        heartbeats: The ranks' latest beats (runs/heartbeat.py): a stall names the rank and phase it is in.

    A partial state (`load_recent`) gets only the stall and failure checks: the series checks wait
    for the full history, so an episode's onset (its identity in AlertLog) never changes under it.
    """
    alerts = _stall(state, snapshot, now, heartbeats) + _failed(state) + _fallbacks(state)
    if not state.partial:
        alerts += _series_alerts(state, window)
    return sorted(alerts, key=lambda a: (a.step, ALERT_KINDS.index(a.kind)))


class AlertLog:
    """Every alert raised so far, each (kind, step) once, oldest first."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []
        self._seen: set[tuple[str, int]] = set()

    def update(self, alerts: list[Alert]) -> list[Alert]:
        """Add the alerts not seen before; returns just those (to flash in the UI)."""
        new = [a for a in alerts if (a.kind, a.step) not in self._seen]
        for alert in new:
            self._seen.add((alert.kind, alert.step))
            self.alerts.append(alert)
        return new

    def active(self, state: RunState, within_steps: int = 10) -> list[Alert]:
        """Alerts of the last `within_steps` steps, and episodes still under way however old (for in-place badges)."""
        ongoing = {(t.kind, t.found[-1][1].step) for t in _STATE_TRACKERS.get(state, ()) if t.ongoing and t.found}
        return [a for a in self.alerts if a.step >= state.last_step - within_steps or (a.kind, a.step) in ongoing]
