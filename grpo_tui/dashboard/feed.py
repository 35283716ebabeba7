"""The dashboard's data side (no Textual): one `DashboardFeed` per open run, driven by a thread worker.

The feed owns the run's `RunState` (only the worker thread touches it), tails metrics.jsonl,
completions.jsonl and stdout.log, samples the monitor, and turns all of it into an immutable
`DashboardView` that the UI thread only draws. Views are whole (never deltas), so a newer view may
replace a queued older one without losing anything.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_tui.dashboard.alerts import Alert, AlertLog, detect_alerts
from grpo_tui.dashboard.attempts import Attempt
from grpo_tui.dashboard.loading import load_recent, load_run
from grpo_tui.dashboard.log_noise import DeprecationFilter
from grpo_tui.dashboard.monitor import GpuHistory, MonitorSnapshot
from grpo_tui.dashboard.series import fraction
from grpo_tui.dashboard.state import PEAK_MIB, RunState, phase_series
from grpo_tui.runs.completions import CompletionIndex, PromptGroup
from grpo_tui.runs.folder import RunDir, file_stamp, read_json
from grpo_tui.runs.heartbeat import HeartbeatReader
from grpo_tui.runs.listing import read_config
from grpo_tui.runs.metrics import (
    DECODE_COPY_KEY,
    GENERATION_BACKEND_KEY,
    GENERATION_RATE_KEY,
    MISMATCH_MAX_KEY,
    MISMATCH_MEAN_KEY,
    PHASES,
    STEP_TIME_KEY,
    TOKEN_PHASES,
    as_float,
    phase_time_key,
    valid_share_key,
)
from grpo_tui.runs.product import RunProduct, product_stamp, read_product
from grpo_tui.runs.status import LIVE_STATES, RunStatus, judge
from grpo_tui.userinput import clip

# Points per drawn series: about two per cell of a wide chart, so nothing visible is lost.
MAX_POINTS = 400
# The small charts: (title, series name in RunState).
METRIC_CHARTS: tuple[tuple[str, str], ...] = (
    ("loss", "loss"),
    ("KL", "kl"),
    ("entropy", "entropy"),
    ("clip ratio", "clip_ratio/region_mean"),
    ("completion length", "completions/mean_length"),
    ("tokens/s", "tokens_per_s"),
)
# Lines of stdout.log kept for the log tail.
LOG_LINES = 300
# Bytes read from the end of stdout.log when the dashboard opens.
LOG_START_BYTES = 64 * 1024
# Seconds between run.json / process liveness checks (cheap, but not every poll).
STATUS_EVERY_S = 2.0
# Monitor samples kept for the memory sparklines (one per poll).
MEMORY_SAMPLES = 240
# Recent steps over which each phase's mean seconds and share of the step are shown.
PHASE_TIME_STEPS = 20
# The phase table's line for the decode copy, under generation (part of that phase's peak)
DECODE_COPY_ROW = "└ decode copy"


@dataclass(frozen=True)
class ProgressInfo:
    """What the panel draws; elapsed/ETA are computed by the caller from an injected clock."""

    step: int
    max_steps: int | None
    elapsed_s: float | None
    eta_s: float | None
    steps_per_s: float | None
    state: str
    loss_impl: str | None
    generation: str | None = None  # "graph · 12,345 tok/s": the rollout backend and its recent throughput
    attempts: tuple[Attempt, ...] = ()  # the first start and each resume (listed when there are several)


@dataclass(frozen=True)
class ChartData:
    """Everything the charts draw, already downsampled."""

    reward: tuple[list[float], list[float], list[float]]  # steps, mean, std
    funcs: dict[str, tuple[list[float], list[float]]]
    metrics: dict[str, tuple[list[float], list[float]]]  # chart title -> (steps, values)
    switches: list[int]


@dataclass(frozen=True)
class DashboardView:
    """One frame of the dashboard."""

    run_name: str
    preset: str
    status: RunStatus
    progress: ProgressInfo
    charts: ChartData
    snapshot: MonitorSnapshot | None
    history: dict[int, list[float | None]]  # GPU index -> used MiB (oldest first); -1 = host RAM
    run_peaks: dict[int, float]
    step_peaks: tuple[float, ...]  # the run's peak MiB of each recent step (creep shows here)
    rank_pids: dict[int, int]
    phases: dict[str, dict[str, float | None]]
    switch_label: str | None
    loss_impl: str
    baseline: str
    pending_impl: str | None
    log_lines: tuple[str, ...]
    alerts: tuple[Alert, ...]  # every alert so far, oldest first
    active_alerts: tuple[Alert, ...]  # raised in the last few steps (shown in place)
    completion_steps: tuple[int, ...]
    stop_requested: bool
    generation: int = 0  # bumps when the charts changed (the UI skips redrawing otherwise)
    partial: bool = False  # only the newest steps are loaded so far (a long run's first view)
    product: RunProduct = field(default_factory=RunProduct)  # the run's model/ and held-out scores, once written


@dataclass
class DashboardFeed:
    """Reads a run folder incrementally; `poll()` returns the next view."""

    run_path: Path
    monitor: Any  # monitor.Monitor (or anything with sample(pids))
    clock: Callable[[], float] = time.time
    state: RunState | None = None
    _log: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    _log_offset: int = 0
    _log_partial: bytes = b""
    _log_filter: DeprecationFilter = field(default_factory=DeprecationFilter)
    _charts: ChartData | None = None
    _chart_key: tuple[int, int] = (-1, -1)
    _generation: int = 0
    _history: GpuHistory = field(default_factory=lambda: GpuHistory(maxlen=MEMORY_SAMPLES))
    _status: RunStatus = RunStatus.RUNNING
    _status_checked: float = -math.inf
    _status_events: int = -1  # events seen at the last judgement
    _completions: CompletionIndex | None = None
    _baseline: str = "naive"
    _alert_log: AlertLog = field(default_factory=AlertLog)
    _heartbeats: HeartbeatReader | None = None
    # control.json as last read, and the (mtime_ns, size) it was read at: re-read only when it changed.
    _control: dict[str, Any] = field(default_factory=dict)
    _control_stamp: tuple[int, int] | None = (-1, -1)
    _phases: dict[str, dict[str, float | None]] = field(default_factory=dict)
    _product: RunProduct = field(default_factory=RunProduct)
    _product_stamp: tuple[object, ...] | None = None

    def __post_init__(self) -> None:
        self.run = RunDir(Path(self.run_path))
        config = read_config(self.run.path)
        self._baseline = str(config.get("loss", {}).get("baseline", "naive"))
        self._heartbeats = HeartbeatReader(self.run.path)

    def open(self) -> None:
        """The first read: every event but only the newest steps, so a 100,000-step run shows at
        once; the next `poll` reads the whole history (call both from the worker)."""
        self.state = load_recent(self.run.path)
        self._completions = CompletionIndex(self.run.path / "completions.jsonl")
        try:
            size = self.run.stdout.stat().st_size
        except OSError:
            size = 0
        self._log_offset = max(0, size - LOG_START_BYTES)
        self._read_log(skip_first=self._log_offset > 0)

    def poll(self) -> DashboardView:
        if self.state is None:
            self.open()
        elif self.state.partial:
            self.state = load_run(self.run.path)  # the whole history; its tail goes on from the end
            self._chart_key = (-1, -1)
        state = self.state
        assert state is not None and state.tail is not None
        state.apply(state.tail.read_new())
        if self._completions is not None:
            self._completions.poll()
        self._read_log()
        now = self.clock()
        # A new event (finish, stop, error) is judged at once: waiting for the next liveness check
        # showed a finished run as "running, ETA 0:00" for seconds.
        if now - self._status_checked >= STATUS_EVERY_S or len(state.events) != self._status_events:
            self._status = _live_status(self.run.path, state)
            self._status_checked = now
            self._status_events = len(state.events)
        pids = list(state.pid_gpu) or _status_pids(self.run)
        snapshot = self.monitor.sample(pids) if self.monitor is not None else None
        if snapshot is not None:
            self._history.add(snapshot)
        # A stat per rank and poll; a beat is parsed again only when its file changed.
        beats = (
            self._heartbeats.read(list(state.pid_rank.values()))
            if self._heartbeats and state.status == "running"
            else []
        )
        self._alert_log.update(detect_alerts(state, snapshot, now=now, heartbeats=beats))
        key = (len(state), len(state.events))  # new steps, or a switch marker to draw
        if key != self._chart_key:  # the phase table, too, changes only with new records
            self._charts = build_charts(state)
            self._phases = phase_rows(state)
            self._chart_key = key
            self._generation += 1
        return self._view(state, snapshot, now)

    # ---- pieces --------------------------------------------------------------------------------
    def _view(self, state: RunState, snapshot: MonitorSnapshot | None, now: float) -> DashboardView:
        progress = state.progress(now)
        median = state.median_step_time(20)
        info = ProgressInfo(
            step=progress.step,
            max_steps=progress.max_steps,
            elapsed_s=progress.elapsed_s,
            eta_s=progress.eta_s,
            steps_per_s=(1.0 / median) if median else None,
            state=self._status,
            loss_impl=state.loss_impl or None,
            generation=generation_label(state),
            attempts=tuple(state.attempts()),
        )
        control = self._read_control()
        live = self._status in LIVE_STATES
        pending = control.get("loss_impl") if live and control.get("loss_impl") != state.loss_impl else None
        switches = state.switch_steps
        label = None
        if switches:
            switch = state.events_of("loss_impl_switch")[-1]
            label = f"{switch.data.get('from', '?')} → {switch.data.get('to', '?')} at step {switch.step}"
        return DashboardView(
            run_name=self.run.name,
            preset=state.preset,
            status=self._status,
            progress=info,
            charts=self._charts or build_charts(state),
            snapshot=snapshot,
            history=_memory_history(self._history),
            run_peaks=_run_peaks(state),
            rank_pids=dict(state.pid_rank),
            step_peaks=_recent_peaks(state),
            phases=self._phases,
            switch_label=label,
            loss_impl=state.loss_impl,
            baseline=self._baseline,
            pending_impl=str(pending) if pending else None,
            log_lines=tuple(self._log),
            alerts=tuple(self._alert_log.alerts),
            active_alerts=tuple(self._alert_log.active(state)),
            completion_steps=tuple(self._completions.steps) if self._completions is not None else (),
            stop_requested=bool(control.get("stop")),
            generation=self._generation,
            partial=state.partial,
            product=self._read_product(),
        )

    def _read_product(self) -> RunProduct:
        stamp = product_stamp(self.run.path)  # two stats; model/ and eval.json are read again only when changed
        if stamp != self._product_stamp:
            self._product, self._product_stamp = read_product(self.run.path), stamp
        return self._product

    def _read_control(self) -> dict[str, Any]:
        stamp = file_stamp(self.run.control)
        if stamp != self._control_stamp:
            self._control = (read_json(self.run.control) or {}) if stamp is not None else {}
            self._control_stamp = stamp
        return self._control

    def _read_log(self, skip_first: bool = False) -> None:
        try:
            with open(self.run.stdout, "rb") as handle:
                handle.seek(self._log_offset)
                chunk = handle.read()
        except OSError:
            return
        if not chunk:
            return
        self._log_offset += len(chunk)
        lines = (self._log_partial + chunk).split(b"\n")
        self._log_partial = lines.pop()
        if skip_first and lines:
            lines = lines[1:]  # cut by the seek
        # A progress bar redraws with \r: keep what the terminal would show last.
        shown = (line.decode("utf-8", "replace").rsplit("\r", 1)[-1] for line in lines)
        self._log.extend(self._log_filter.keep(shown))

    def completion_groups(self, step: int) -> list[PromptGroup]:
        """One step's prompt groups (reads the file: call from a worker thread)."""
        return self._completions.groups(step) if self._completions is not None else []


def build_charts(state: RunState) -> ChartData:
    """Downsampled series for every chart (steps on x); cached per series in RunState, so a live
    redraw costs the new points only."""
    xs, mean, std = state.downsampled("reward", MAX_POINTS, "reward_std")
    std = [0.0 if math.isnan(v) else v for v in std]
    funcs = {name: _pair(state.downsampled(f"rewards/{name}/mean", MAX_POINTS)) for name in state.reward_functions}
    metrics = {title: _pair(state.downsampled(name, MAX_POINTS)) for title, name in METRIC_CHARTS}
    return ChartData(
        reward=(list(xs), list(mean), std), funcs=funcs, metrics=metrics, switches=list(state.switch_steps)
    )


def _pair(series: tuple[list[float], ...]) -> tuple[list[float], list[float]]:
    # Steps where the metric is missing are left out (a gap, not a zero).
    pairs = [(x, y) for x, y in zip(series[0], series[1]) if not math.isnan(y)]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def phase_rows(state: RunState) -> dict[str, dict[str, float | None]]:
    """Per phase: last step's peak, run peak, peaks before / after the latest switch, the mean seconds
    of the recent steps with their share of the step (None for runs that logged no times) and, for the
    phases that count tokens, the latest step's valid-token share (`valid`: None where that step logged
    none or a value that is not a share; no `valid` key at all for runs that never logged one)."""
    rows: dict[str, dict[str, float | None]] = {}
    step_s = _recent_mean(state, STEP_TIME_KEY)
    counted = any(state.has_series(valid_share_key(p)) for p in TOKEN_PHASES)
    for phase in PHASES:
        seconds = _recent_mean(state, phase_time_key(phase))
        last = state.last(phase_series(phase))
        if last is None and phase not in state.phase_peaks:
            continue
        rows[phase] = {
            "last": last,
            "peak": state.phase_peaks.get(phase),
            "before": state.phase_peaks_before_switch.get(phase),
            "after": state.phase_peaks_since_switch.get(phase),
            "time_s": seconds,
            "share": seconds / step_s if seconds is not None and step_s else None,
        }
        if counted and phase in TOKEN_PHASES:
            rows[phase]["valid"] = fraction(state.last_record.get(valid_share_key(phase)))
        copy = state.last(DECODE_COPY_KEY) if phase == "generation" else None
        if copy is not None:  # part of the generation peak: the graph decoder's copy of the weights
            rows[DECODE_COPY_ROW] = {"last": copy, "peak": None, "before": None, "after": None, "part": True}
    return rows


def generation_label(state: RunState) -> str | None:
    """The rollout backend of the latest step, the mean completion tokens/s of the recent steps and, where the
    decoder returned log-probs, the mean and max |log p_decode - log p_train| of the latest step."""
    backend = state.last_record.get(GENERATION_BACKEND_KEY)
    if not isinstance(backend, str):
        return None  # runs written before the key existed
    rate = _recent_mean(state, GENERATION_RATE_KEY)
    label = clip(backend, 12) + ("" if rate is None else f" · {rate:,.0f} tok/s")
    mean, top = as_float(state.last_record.get(MISMATCH_MEAN_KEY)), as_float(state.last_record.get(MISMATCH_MAX_KEY))
    if mean is not None and math.isfinite(mean):
        label += f" · Δlogp {mean:.3g}" + ("" if top is None or not math.isfinite(top) else f" (max {top:.2g})")
    return label


def _recent_mean(state: RunState, name: str) -> float | None:
    values = [v for v in state.column(name)[-PHASE_TIME_STEPS:] if not math.isnan(v)]
    return sum(values) / len(values) if values else None


def _memory_history(history: GpuHistory) -> dict[int, list[float | None]]:
    # Used MiB per GPU, or host RAM under -1 when there is no GPU (what the memory panel draws).
    if history.gpu_indices:
        return {index: history.gpu(index)[1] for index in history.gpu_indices}
    return {-1: history.host()[1]} if len(history) else {}


def _run_peaks(state: RunState) -> dict[int, float]:
    record = state.last_record.get("memory") if isinstance(state.last_record.get("memory"), dict) else {}
    peaks: dict[int, float] = {}
    if state.run_peak_mib is not None:
        gpus = [g for g in (record or {}).get("gpus") or () if isinstance(g, dict)]
        for g in gpus or [{"index": -1}]:
            peaks[int(g.get("index", -1))] = state.run_peak_mib
    return peaks


def _recent_peaks(state: RunState, count: int = 120) -> tuple[float, ...]:
    column = state.column(PEAK_MIB)
    return tuple(v for v in column[-count:] if not math.isnan(v))


def _live_status(path: Path, state: RunState) -> RunStatus:
    try:
        return judge(path).state
    except Exception:  # a half-written run.json must not stop the feed
        return state.status


def _status_pids(run: RunDir) -> list[int]:
    status = run.read_status()
    pids = [status.get("child_pid"), status.get("pid")]
    return [p for p in pids if isinstance(p, int)]
