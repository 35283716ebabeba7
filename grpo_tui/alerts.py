"""GRPO-aware alerts computed from a RunState (and, for a stall, a MonitorSnapshot).

`detect_alerts` is a pure function: it returns the alert episodes found in the recent window, each
stamped with the step at which its condition first held (its onset). While a condition persists
the onset, and so the Alert, stays the same: `AlertLog.update` keeps alerts by (kind, step), so a
condition is raised once per episode, not once per step.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpo_tui.monitor import MonitorSnapshot
from grpo_tui.runstate import NAN, PEAK_MIB, RunState

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
# ... while every readable GPU sits at or below this utilisation (%).
STALL_GPU_UTIL_PCT = 5.0
# Memory creep: the per-step peak never falls for this many steps ...
CREEP_STEPS = 20
# ... and rises by more than this fraction over them (allocator fragmentation or a leak).
CREEP_FRAC = 0.05
# Steps scanned back from the newest by default (keeps a live call cheap on long runs).
ALERT_SCAN_STEPS = 500

NO_SIGNAL, KL_SPIKE, CLIPPED, ENTROPY_COLLAPSE, STALL, MEMORY_CREEP, RUN_FAILED = (
    "no_signal", "kl_spike", "clipped_completions", "entropy_collapse", "stall", "memory_creep", "run_failed")
ALERT_KINDS = (NO_SIGNAL, KL_SPIKE, CLIPPED, ENTROPY_COLLAPSE, STALL, MEMORY_CREEP, RUN_FAILED)


@dataclass(frozen=True)
class Alert:
    kind: str
    severity: str  # "warning" | "error"
    step: int  # the step at which the condition first held (stable while it persists)
    message: str


def _tail_series(state: RunState, name: str, window: int | None) -> tuple[list[float], list[float]]:
    col = state.column(name)
    start = 0 if window is None else max(0, len(col) - window)
    pairs = [(x, y) for x, y in zip(state.steps[start:], col[start:]) if not math.isnan(y)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _episodes(state: RunState, name: str, window: int | None, flag: Callable[[list[float]], list[bool]],
              min_run: int, lead: int = 0) -> tuple[list[float], list[tuple[int, int]]]:
    """(values, [(onset step, index)]) of runs of >= min_run flagged steps in the last `window` steps.

    An episode already under way at the window's start (flag at index `lead`, the first index a flag can
    be judged at) widens the window until it is not, so its onset does not slide as steps arrive.
    """
    while True:
        xs, ys = _tail_series(state, name, window)
        flags = flag(ys)
        if window is None or window >= len(state) or len(flags) <= lead or not flags[lead]:
            return ys, _onsets(xs, flags, min_run)
        window *= 2


def _onsets(xs: Sequence[float], flags: Sequence[bool], min_run: int) -> list[tuple[int, int]]:
    """(onset step, index) of each run of >= min_run consecutive True flags; the onset is the step at
    which the run reached min_run."""
    out, run = [], 0
    for i, flag in enumerate(flags):
        run = run + 1 if flag else 0
        if run == min_run:
            out.append((int(xs[i]), i))
    return out


def _no_signal(state: RunState, window: int | None) -> list[Alert]:
    _, found = _episodes(state, "frac_reward_zero_std", window, lambda ys: [y >= ZERO_STD_FRAC for y in ys],
                         ZERO_STD_STEPS)
    return [Alert(NO_SIGNAL, "warning", step,
                  f"no learning signal: every group's rewards are identical (frac_reward_zero_std ≥ {ZERO_STD_FRAC} "
                  f"for {ZERO_STD_STEPS}+ steps); loss sits at 0 — raise temperature or num_generations, or ease the reward")
            for step, _ in found]


def _kl_medians(ys: list[float]) -> list[float]:
    return [NAN] * min(KL_WINDOW, len(ys)) + [statistics.median(ys[i - KL_WINDOW:i]) for i in range(KL_WINDOW, len(ys))]


def _kl_flags(ys: list[float]) -> list[bool]:
    medians = _kl_medians(ys)
    return [i >= KL_WINDOW and y > KL_FLOOR and y > KL_SPIKE_FACTOR * medians[i] for i, y in enumerate(ys)]


def _kl_spikes(state: RunState, window: int | None) -> list[Alert]:
    # consecutive spiking steps are one episode
    ys, found = _episodes(state, "kl", None if window is None else window + KL_WINDOW, _kl_flags, 1, KL_WINDOW)
    return [Alert(KL_SPIKE, "warning", step,
                  f"KL spike at step {step}: {ys[i]:.4g} vs recent median {statistics.median(ys[i - KL_WINDOW:i]):.3g} "
                  f"(>{KL_SPIKE_FACTOR:g}x) — lower the learning rate or raise beta")
            for step, i in found]


def _clipped(state: RunState, window: int | None) -> list[Alert]:
    ys, found = _episodes(state, "completions/clipped_ratio", window, lambda v: [y > CLIPPED_RATIO for y in v],
                          CLIPPED_STEPS)
    return [Alert(CLIPPED, "warning", step,
                  f"{ys[i]:.0%} of completions hit max_completion_length (>{CLIPPED_RATIO:.0%} for {CLIPPED_STEPS}+ "
                  "steps) — raise grpo.max_completion_length")
            for step, i in found]


def _entropy_collapse(state: RunState, window: int | None) -> list[Alert]:
    early = [v for v in state.column("entropy")[: 4 * ENTROPY_EARLY_STEPS] if not math.isnan(v)][:ENTROPY_EARLY_STEPS]
    if len(early) < ENTROPY_EARLY_STEPS:
        return []
    early_mean = sum(early) / len(early)
    if early_mean <= 0:
        return []
    limit = ENTROPY_COLLAPSE_FRAC * early_mean
    ys, found = _episodes(state, "entropy", window, lambda v: [y < limit for y in v], ENTROPY_STEPS)
    return [Alert(ENTROPY_COLLAPSE, "warning", step,
                  f"entropy collapsed to {ys[i]:.3g} (< {ENTROPY_COLLAPSE_FRAC:g} x early mean {early_mean:.3g}): the "
                  "policy stopped exploring — lower the learning rate or raise temperature")
            for step, i in found]


def _creep_flags(ys: list[float]) -> list[bool]:
    flags, run_start = [], 0
    for i in range(len(ys)):
        if i and ys[i] < ys[i - 1]:
            run_start = i
        first = i - CREEP_STEPS + 1
        flags.append(first >= run_start and ys[first] > 0 and ys[i] > ys[first] * (1 + CREEP_FRAC))
    return flags


def _memory_creep(state: RunState, window: int | None) -> list[Alert]:
    ys, found = _episodes(state, PEAK_MIB, window, _creep_flags, 1, CREEP_STEPS - 1)
    return [Alert(MEMORY_CREEP, "warning", step,
                  f"peak memory rose every step for {CREEP_STEPS} steps ({ys[i - CREEP_STEPS + 1]:.0f} → {ys[i]:.0f} MiB): "
                  "fragmentation or a leak — try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
            for step, i in found]


def _stall(state: RunState, snapshot: MonitorSnapshot | None, now: float | None) -> list[Alert]:
    if state.status != "running" or state.last_time is None or not len(state):
        return []
    now = now if now is not None else (snapshot.time if snapshot is not None else time.time())
    limit = max(STALL_MIN_S, STALL_STEP_FACTOR * (state.median_step_time(20) or 0.0))
    idle = now - state.last_time
    if idle <= limit:
        return []
    utils = [g.utilization_pct for g in snapshot.gpus if g.utilization_pct is not None] if snapshot else []
    if utils and max(utils) > STALL_GPU_UTIL_PCT:
        return []  # the GPU is busy: a slow step (e.g. a long generation), not a stall
    where = f" while GPU utilisation is {max(utils):.0f}%" if utils else ""
    return [Alert(STALL, "error", state.last_step,
                  f"stalled: no new step for {idle:.0f} s after step {state.last_step}{where} — check stdout.log")]


def _failed(state: RunState) -> list[Alert]:
    out = []
    for event in state.events_of("error", "oom"):
        if event.kind == "oom":
            phase = event.data.get("phase", "?")
            text = f"out of memory in the {phase} phase — try chunked, LoRA, a smaller batch or more gradient accumulation"
        else:
            text = f"run failed: {event.data.get('message') or event.data.get('error') or 'see stdout.log'}"
        out.append(Alert(RUN_FAILED, "error", event.step or 0, text))
    return out


def detect_alerts(state: RunState, snapshot: MonitorSnapshot | None = None, *, window: int | None = ALERT_SCAN_STEPS,
                  now: float | None = None) -> list[Alert]:
    """Alert episodes in the last `window` steps (None: the whole run), oldest first.

    Args:
        state: The run.
        snapshot: The latest monitor sample (GPU utilisation for the stall check); None on no data.
        window: Steps scanned back from the newest.
        now: Wall-clock time for the stall check (default: the snapshot's time, else time.time()).

    A partial state (`load_recent`) gets only the stall and failure checks: the series checks wait
    for the full history, so an episode's onset (its identity in AlertLog) never changes under it.
    """
    alerts = _stall(state, snapshot, now) + _failed(state)
    if not state.partial:
        alerts += (_no_signal(state, window) + _kl_spikes(state, window) + _clipped(state, window)
                   + _entropy_collapse(state, window) + _memory_creep(state, window))
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
        """Alerts raised in the last `within_steps` steps (for in-place badges)."""
        return [a for a in self.alerts if a.step >= state.last_step - within_steps]
