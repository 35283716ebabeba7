"""The run model behind the dashboard: every logged step of one run, as growable columns.

`RunState` is a plain model (no Textual, no torch) fed by metrics records (`apply`). It keeps every
point (never truncated); charts ask `downsample` for a drawable subset that keeps the shape. The
model is only ever mutated on one thread (the UI's, or the feed's worker that owns it).

Opening a run folder into a RunState is `loading`'s; column extraction and downsampling live in
`series`; listing run folders and their status is the run-folder layer's (`runs.listing`, `runs.status`).
"""

from __future__ import annotations

import math
import operator
import statistics
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any, NamedTuple

from grpo_tui.dashboard.attempts import Attempt, run_attempts
from grpo_tui.dashboard.attempts import elapsed_s as attempts_elapsed
from grpo_tui.dashboard.series import (
    NAN,
    bucket_pair,
    extract_columns,
    floats,
    memory_columns,
    nan_to,
    nanmax,
    nans,
)
from grpo_tui.runs.metrics import PHASES, MetricsTail, as_float, as_int
from grpo_tui.runs.status import RunStatus, stream_status

# Step records' keys that are not metrics (never become series).
NON_SERIES_KEYS = frozenset({"v", "step", "event", "loss_impl", "memory", "pid", "rank", "local_rank", "device"})
# Steps over which ETA and recent step time are estimated.
ETA_WINDOW = 20

# Derived series names (beside TRL's own metric names).
TOKENS_PER_S = "tokens_per_s"
PEAK_MIB = "memory/peak_mib"
ALLOCATED_MIB = "memory/allocated_mib"
RESERVED_MIB = "memory/reserved_mib"
RSS_MIB = "memory/rss_mib"


def phase_series(phase: str) -> str:
    """Series name of a phase's per-step peak MiB (phase in metrics.PHASES)."""
    return f"memory/phases/{phase}"


@dataclass(frozen=True)
class RunEvent:
    """A non-step record: start, finish, error, oom, loss_impl_switch, stop_requested, control_error, ..."""

    kind: str
    step: int | None
    time: float | None
    data: dict[str, Any] = field(default_factory=dict)


class Progress(NamedTuple):
    step: int
    max_steps: int | None
    elapsed_s: float
    eta_s: float | None


class RunState:
    """Every step of one run as columns of floats (NaN where a step lacks a metric).

    Args:
        max_steps: The run's `[grpo] max_steps` (a start event's `max_steps` also sets it).
        preset: The preset name, for titles and comparisons.
        loss_impl: The configured loss implementation (each step record's `loss_impl` wins).
    """

    def __init__(self, max_steps: int | None = None, preset: str = "", loss_impl: str = "") -> None:
        self.max_steps = max_steps
        self.preset = preset
        self.loss_impl = loss_impl
        self.steps = array("d")
        self._cols: dict[str, array] = {}
        self.step_impls: list[str] = []  # loss_impl of each step ("" when not logged)
        self.events: list[RunEvent] = []
        self.pid_gpu: dict[int, int | None] = {}  # each rank's pid -> local GPU index (None on CPU)
        self.pid_rank: dict[int, int] = {}
        self.start_time: float | None = None
        self.last_time: float | None = None
        self.last_record: dict[str, Any] = {}
        self.phase_peaks: dict[str, float] = {}  # max so far per phase
        self.phase_peaks_before_switch: dict[str, float] = {}  # from the previous switch (or start) to the latest
        self.phase_peaks_since_switch: dict[str, float] = {}  # since the latest switch (or start)
        self.run_peak_mib: float | None = None
        self.tail: MetricsTail | None = None  # set by loading: goes on after the records applied so far
        self.partial = False  # True when built by load_recent: only the newest steps are loaded
        self._ds_cache: dict[tuple[str, int], tuple[int, list[list[int]], list[int]]] = {}
        self.run_dir: Path | None = None
        self._attempts_key: tuple[int, int] = (-1, -1)
        self._attempts: list[Attempt] = []

    # ---- feeding -------------------------------------------------------------------------------
    def apply(self, records: Iterable[dict[str, Any]]) -> bool:
        """Add records (steps and events) in file order; True when anything changed."""
        batch: list[dict[str, Any]] = []
        changed = False
        for record in records:
            if "event" in record:
                if batch:  # keep file order between steps and events (switch peaks depend on it)
                    self._apply_steps(batch)
                    batch = []
                self._apply_event(record)
                changed = True
            elif as_float(record.get("step")) is not None:
                batch.append(record)  # a step record without a usable (finite) step number is skipped
        if batch:
            self._apply_steps(batch)
            changed = True
        return changed

    def _apply_event(self, record: dict[str, Any]) -> None:
        kind = str(record.get("event"))
        step, when = as_int(record.get("step")), as_float(record.get("time"))
        data = {k: v for k, v in record.items() if k not in ("v", "event", "step", "time")}
        self.events.append(RunEvent(kind, step, when, data))
        if when is not None:
            self.last_time = when if self.last_time is None else max(self.last_time, when)
        if kind == "start":
            if self.start_time is None and when is not None:
                self.start_time = when
            if self.max_steps is None and as_int(record.get("max_steps")):
                self.max_steps = as_int(record.get("max_steps"))
            if not self.loss_impl and record.get("loss_impl"):
                self.loss_impl = str(record["loss_impl"])
            self._map_pids(record)
        elif kind == "loss_impl_switch":
            self.phase_peaks_before_switch = dict(self.phase_peaks_since_switch)
            self.phase_peaks_since_switch = {}
            if record.get("to"):
                self.loss_impl = str(record["to"])

    def _last_switch(self) -> tuple[int, str] | None:
        """(step, to) of the newest loss_impl_switch event with both fields."""
        for event in reversed(self.events):
            if event.kind == "loss_impl_switch" and event.step is not None and event.data.get("to"):
                return event.step, str(event.data["to"])
        return None

    def _map_pids(self, record: dict[str, Any]) -> None:
        entries = record.get("ranks") if isinstance(record.get("ranks"), list) else [record]
        for entry in entries:
            if not isinstance(entry, dict) or as_int(entry.get("pid")) is None:
                continue
            pid = int(entry["pid"])
            self.pid_gpu[pid] = _gpu_index(entry.get("device"), entry.get("local_rank"))
            if as_int(entry.get("rank")) is not None:
                self.pid_rank[pid] = int(entry["rank"])

    def _apply_steps(self, recs: list[dict[str, Any]]) -> None:
        n0, n = len(self.steps), len(recs)
        self.steps.extend(floats([r["step"] for r in recs]))
        keys = sorted(set().union(*recs) - NON_SERIES_KEYS)
        columns = extract_columns(recs, keys)
        for key, values in zip(keys, columns):
            col = self._cols.get(key)
            if col is None:
                col = self._cols[key] = nans(n0)
            col.extend(values)
        for col in self._cols.values():  # series this batch did not carry
            if len(col) < n0 + n:
                col.extend(nans(n0 + n - len(col)))
        self._apply_memory(recs, n0)
        self._derive_tokens_per_s(n0)
        self.step_impls.extend(str(r.get("loss_impl", "")) for r in recs)
        # A switch event names the first step computed with the new implementation and follows the
        # last old-impl record. Streams written before that rule put the event before that record (and
        # named its step): a record up to the switch's step that still carries the old implementation
        # is from before the switch, so it does not flip the current implementation back.
        last, switch = self.step_impls[-1], self._last_switch()
        stale = switch is not None and recs[-1]["step"] <= switch[0] and last != switch[1]
        if last and not stale:
            self.loss_impl = last
        times = self._cols.get("time")
        if times is not None:  # a non-finite time (1e309 parses as inf) says nothing about when
            last = times[-1]
            if math.isfinite(last):
                self.last_time = last if self.last_time is None else max(self.last_time, last)
            first_step_s = nan_to(self._cols.get("step_time", [NAN])[0], 0.0)
            if self.start_time is None and math.isfinite(times[0] - first_step_s):
                self.start_time = times[0] - first_step_s
        self.last_record = recs[-1]

    def _apply_memory(self, recs: list[dict[str, Any]], n0: int) -> None:
        batch = memory_columns(recs)
        names = (PEAK_MIB, ALLOCATED_MIB, RESERVED_MIB, RSS_MIB, *(phase_series(p) for p in PHASES))
        for name, values in zip(names, batch):
            col = self._cols.setdefault(name, nans(n0))
            del col[n0:]  # drop the NaN backfill _apply_steps gave every known column
            col.extend(values)
        for phase, values in zip(PHASES, batch[4:]):
            top = nanmax(values)
            if top is not None:
                for peaks in (self.phase_peaks, self.phase_peaks_since_switch):
                    if top > peaks.get(phase, -math.inf):
                        peaks[phase] = top
        top = nanmax(batch[0])
        if top is not None and (self.run_peak_mib is None or top > self.run_peak_mib):
            self.run_peak_mib = top

    def _derive_tokens_per_s(self, n0: int) -> None:
        # TRL logs num_tokens cumulatively: throughput is its delta over the step time (or the
        # wall-clock delta between records when step_time is missing).
        out = self._cols.setdefault(TOKENS_PER_S, nans(n0))
        del out[n0:]  # drop the NaN backfill _apply_steps gave every known column
        tokens, step_time, times = (self._cols.get(k) for k in ("num_tokens", "step_time", "time"))
        for i in range(len(out), len(self.steps)):
            value = NAN
            if tokens is not None and i > 0 and not math.isnan(tokens[i]) and not math.isnan(tokens[i - 1]):
                dt = step_time[i] if step_time is not None else NAN
                if (math.isnan(dt) or dt <= 0) and times is not None:
                    dt = times[i] - times[i - 1]
                if dt > 0:
                    value = (tokens[i] - tokens[i - 1]) / dt
            out.append(value)

    # ---- reading -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int:
        return int(self.steps[-1]) if self.steps else 0

    def series_names(self) -> list[str]:
        """Metrics with at least one value."""
        return sorted(name for name, col in self._cols.items() if not all(map(math.isnan, col)))

    def has_series(self, name: str) -> bool:
        return name in self._cols

    def column(self, name: str) -> array:
        """The raw column aligned with `steps` (NaN where missing); empty when unknown."""
        return self._cols.get(name, array("d"))

    def series(self, name: str) -> tuple[list[float], list[float]]:
        """(steps, values) of a metric, all points, skipping steps where it is missing."""
        col = self._cols.get(name)
        if col is None:
            return [], []
        if not math.isnan(sum(col)):  # the usual case: nothing missing, copy at C speed
            return list(self.steps), list(col)
        keep = list(map(operator.not_, map(math.isnan, col)))  # C-level passes, no Python loop
        return list(compress(self.steps, keep)), list(compress(col, keep))

    def downsampled(self, name: str, max_points: int, *also: str) -> tuple[list[float], ...]:
        """(steps, values, *values of `also`) at at most `max_points` shape-keeping points of `name`.

        Like `downsample` (each bucket keeps its min and max; the first and last points are kept), but
        with power-of-two buckets aligned on the first step and cached per series: completed buckets
        never change, so a live run's redraw costs the new points, not the whole history. `also`
        series are taken at the same steps (e.g. reward_std for the reward band; NaN where missing).
        """
        col = self._cols.get(name)
        if col is None or max_points < 4:
            return ([], [], *([] for _ in also))
        idx = self._downsample_idx(name, col, max_points)
        steps, others = self.steps, [self._cols.get(a) for a in also]
        return (
            [steps[i] for i in idx],
            [col[i] for i in idx],
            *([o[i] for i in idx] if o is not None else [NAN] * len(idx) for o in others),
        )

    def _downsample_idx(self, name: str, col: array, max_points: int) -> list[int]:
        n, buckets = len(col), (max_points - 2) // 2
        width = 1
        while -(-n // width) > buckets:
            width *= 2
        cache = self._ds_cache.get((name, max_points))
        if cache is None or cache[0] != width:
            cache = self._ds_cache[(name, max_points)] = (width, [], [0])
        _, pairs, done = cache
        while (done[0] + 1) * width <= n:  # complete buckets not yet summarised
            pairs.append(bucket_pair(col, done[0] * width, (done[0] + 1) * width))
            done[0] += 1
        idx = [i for pair in pairs for i in pair] + bucket_pair(col, done[0] * width, n)
        last = next((i for i in range(n - 1, -1, -1) if not math.isnan(col[i])), None)
        if last is None:
            return []
        first = next(i for i in range(n) if not math.isnan(col[i]))
        if not idx or idx[0] != first:
            idx.insert(0, first)
        if idx[-1] != last:
            idx.append(last)
        return idx

    def last(self, name: str) -> float | None:
        """The latest non-missing value of a metric."""
        col = self._cols.get(name)
        if col is None:
            return None
        for value in reversed(col):
            if not math.isnan(value):
                return value
        return None

    @property
    def reward_functions(self) -> list[str]:
        """Reward function names found as `rewards/<name>/mean`."""
        return sorted(
            k[len("rewards/") : -len("/mean")] for k in self._cols if k.startswith("rewards/") and k.endswith("/mean")
        )

    def events_of(self, *kinds: str) -> list[RunEvent]:
        return [e for e in self.events if e.kind in kinds]

    @property
    def switch_steps(self) -> list[int]:
        """Steps at which the loss implementation was switched (for chart markers)."""
        return [e.step for e in self.events if e.kind == "loss_impl_switch" and e.step is not None]

    @property
    def status(self) -> RunStatus:
        """From the stream alone: finished, failed (error / oom), stopped (stop then finish) or running.

        The latest attempt's: a resumed run is running whatever its earlier attempts ended with."""
        return stream_status([(e.kind, e.data) for e in self.events])

    def attempts(self) -> list[Attempt]:
        """The run's attempts in order (`attempts.run_attempts`)."""
        key = (len(self.steps), len(self.events))
        if self._attempts_key != key:
            self._attempts_key, self._attempts = key, run_attempts(self.events, self.steps, self._cols.get("time"))
        return self._attempts

    def median_step_time(self, last: int | None = None) -> float | None:
        """Median of `step_time` (or of time deltas between steps) over the last `last` steps (all if None)."""
        start = 0 if last is None else max(0, len(self.steps) - last - 1)  # only the tail: cheap on long runs
        values = [v for v in self._cols.get("step_time", array("d"))[start:] if math.isfinite(v)]
        if not values:
            times = [t for t in self._cols.get("time", array("d"))[start:] if math.isfinite(t)]
            values = [b - a for a, b in zip(times, times[1:]) if b > a]
        if last is not None:
            values = values[-last:]
        return statistics.median(values) if values else None

    def progress(self, now: float | None = None) -> Progress:
        """Step, max_steps, elapsed seconds (to `now` while live, else to the last record) and ETA."""
        step = self.last_step
        end = now if now is not None and self.status is RunStatus.RUNNING else self.last_time
        elapsed = max(0.0, end - self.start_time) if end is not None and self.start_time is not None else 0.0
        attempts = self.attempts()
        if len(attempts) > 1 and end is not None:  # a resumed run: the pause between attempts does not count
            elapsed = attempts_elapsed(attempts, end) or elapsed
        eta = None
        per_step = self.median_step_time(ETA_WINDOW)
        if self.max_steps is not None and per_step is not None and self.status is RunStatus.RUNNING:
            eta = max(0, self.max_steps - step) * per_step
        elif self.status is not RunStatus.RUNNING:
            eta = 0.0
        return Progress(step, self.max_steps, elapsed, eta)


def _gpu_index(device: Any, local_rank: Any) -> int | None:
    """GPU index from a start record's device ("cuda:1", "cuda", 1) or local_rank; None on CPU."""
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str):
        if device.startswith("cuda"):
            _, _, idx = device.partition(":")
            return int(idx) if idx.isdigit() else as_int(local_rank) or 0
        return None
    return as_int(local_rank)
