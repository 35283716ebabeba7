"""Per-phase peak memory and wall time of one training step: generation, scoring, loss, optimizer.

On CUDA the peak of a phase is `torch.cuda.max_memory_allocated` after resetting the peak statistics
at the phase's start. Phases nest (TRL generates inside `training_step`), so entering a phase closes
the measurement of the enclosing one and leaving it resumes the enclosing one with a fresh peak: each
byte is charged to the innermost phase that was running.

Wall time follows the same rule: each second goes to the innermost phase running. On CUDA every phase
boundary first synchronizes the device: kernels run asynchronously, so without it a phase would be
charged for the queued work of the one before (the backward's kernels would land in `optimizer`). A
few synchronizations per step cost little beside phases that last seconds.

$GRPO_TUI_PROFILE_STEP=N wraps the Nth optimizer step this process runs in torch.profiler and writes
its `key_averages` tables to the run folder (`profiling.StepProfiler`).

On the CPU there is no allocator peak to read: the figure is the process's peak RSS. On Linux the
kernel keeps that high-water mark (VmHWM in /proc/self/status) and resets it on request (writing 5 to
/proc/self/clear_refs), so each phase gets its true peak, short-lived spikes such as a KV cache
included. Elsewhere it falls back to RSS (psutil) sampled at the phase's boundaries, which shows
growth across phases but not spikes inside one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_tui.train.profiling import StepProfiler

from grpo_tui.runs.metrics import (
    COPY_BUILDS_KEY,
    COPY_REFRESH_KEY,
    DECODE_COPY_KEY,
    GENERATION_BACKEND_KEY,
    GENERATION_RATE_KEY,
    GENERATION_TOKENS_KEY,
    MISMATCH_MAX_KEY,
    MISMATCH_MEAN_KEY,
    PHASES,
    STEP_TIME_KEY,
    phase_time_key,
)

MIB = 2**20
# `grpo-tui max-batch --memory-cap GiB` sets this to emulate a smaller card (read by each training process).
MEMORY_CAP_ENV = "GRPO_TUI_MEMORY_CAP_GIB"


def apply_memory_cap(device: Any) -> float | None:
    """Cap this process's CUDA allocator at $GRPO_TUI_MEMORY_CAP_GIB; returns the cap, or None when unset/CPU."""
    raw = os.environ.get(MEMORY_CAP_ENV)
    if not raw:
        return None
    try:
        cap_gib = float(raw)
    except ValueError:
        cap_gib = float("nan")
    if not cap_gib > 0:  # also refuses NaN
        raise ValueError(f"{MEMORY_CAP_ENV}: got {raw!r}; allowed: a positive number of GiB")
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    if device.index is None:  # accelerate's PartialState.device can be a bare "cuda"
        device = torch.device("cuda", torch.cuda.current_device())
    total_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib / total_gib), device)
    return cap_gib


def rss_mib() -> float:
    """This process's resident memory now, in MiB."""
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss / MIB


def _reset_rss_peak() -> bool:
    """Reset this process's RSS high-water mark (Linux); False where the kernel does not offer it."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _rss_peak_mib() -> float | None:
    """This process's RSS high-water mark since the last reset (VmHWM), or None where unavailable."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


class PhaseMemory:
    """Peak MiB and wall seconds per phase since the last `take_step()` / `take_times()`.

    Args:
        device: The device whose memory is tracked (CPU: this process's RSS).
        clock: Seconds as a float; a test passes a fake one.
        profiler: Profiles one optimizer step (see `StepProfiler`), or None.

    `failed_phase` is set by an OOM.
    """

    def __init__(
        self, device: Any = None, clock: Callable[[], float] = time.perf_counter, profiler: StepProfiler | None = None
    ) -> None:
        import torch

        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.peaks: dict[str, float] = {}
        self.times: dict[str, float] = {}
        self.failed_phase: str | None = None
        self.steps_done = 0  # optimizer steps ended in this process, ever (the profiler counts on it)
        self.profiler = profiler
        self._clock = clock
        self._stack: list[str] = []
        self._since: list[float] = []  # wall-clock start of each phase on the stack
        # (innermost phase or None, wall-clock time since when): one tuple, so the heartbeat thread
        # reads a consistent pair while this thread replaces it.
        self.running: tuple[str | None, float] = (None, time.time())
        self._start_rss = 0.0
        self._mark = 0.0  # when the innermost phase's time was last charged
        self._span: list[float] = []  # [first phase start, last phase end] since the last take_times()
        self._steps_taken = 0  # optimizer steps since the last take_times()
        self._step_open = False  # a phase of an optimizer step not yet ended has begun
        # Linux: true per-phase RSS peaks from the kernel's resettable high-water mark.
        self.rss_hwm = not self.cuda and _reset_rss_peak() and _rss_peak_mib() is not None

    @property
    def current(self) -> str | None:
        return self._stack[-1] if self._stack else None

    def _now(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)  # the phase's queued kernels belong to the phase
        return self._clock()

    def _sample_peak(self) -> float:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated(self.device) / MIB
        if self.rss_hwm:
            return _rss_peak_mib() or rss_mib()
        return max(self._start_rss, rss_mib())

    def _restart(self, now: float) -> None:
        self._mark = now
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.rss_hwm:
            _reset_rss_peak()
        else:
            self._start_rss = rss_mib()

    def _close_current(self, now: float) -> None:
        phase = self.current
        if phase is not None:
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), self._sample_peak())
            self.times[phase] = self.times.get(phase, 0.0) + now - self._mark
            self._mark = now

    def begin(self, phase: str) -> None:
        if not self._stack and not self._step_open:
            self._step_open = True
            if self.profiler is not None:
                self.profiler.step_starting(self.steps_done + 1)
        now = self._now()
        self._close_current(now)
        self._stack.append(phase)
        self._since.append(time.time())
        self.running = (phase, self._since[-1])
        if not self._span:
            self._span = [now, now]
        self._restart(now)

    def end(self, phase: str) -> None:
        if phase not in self._stack:
            return
        now = self._now()
        while self._stack:
            self._close_current(now)
            self._since.pop()
            if self._stack.pop() == phase:
                break
        # The enclosing phase resumes: it has been running since it began, not since now.
        self.running = (self._stack[-1], self._since[-1]) if self._stack else (None, time.time())
        self._restart(now)
        self._span[1] = now
        if phase == "optimizer" and not self._stack:  # the optimizer closes an optimizer step
            self.steps_done += 1
            self._steps_taken += 1
            self._step_open = False
            if self.profiler is not None:
                self.profiler.step_ended(self.steps_done)  # after the span's end: the table is no step's work

    @contextmanager
    def track(self, phase: str) -> Iterator[None]:
        self.begin(phase)
        try:
            yield
        except BaseException as exc:
            if self.failed_phase is None and _is_oom(exc):
                self.failed_phase = phase  # the innermost phase sees the error first
            raise
        finally:
            self.end(phase)

    def take_step(self) -> dict[str, float]:
        """The phase peaks collected since the last call, rounded; starts a new collection."""
        peaks = {name: round(value, 2) for name, value in self.peaks.items()}
        self.peaks = {}
        return peaks

    def take_times(self) -> dict[str, float]:
        """Seconds per optimizer step since the last call, as step-record fields; starts a new collection.

        `time_s/<phase>` for every phase of metrics.PHASES (0 when it did not run) and any other phase
        tracked, and `time_s/step`: from the first phase's start to the last one's end, so the time
        between phases (gradient clipping, the scheduler) is in the step but in no phase. Empty when no
        phase ran. With several optimizer steps per record (logging_steps > 1) each value is their mean.
        """
        if not self._span:
            return {}
        steps = max(1, self._steps_taken)
        seconds = {phase: 0.0 for phase in PHASES} | self.times
        fields = {phase_time_key(phase): round(value / steps, 4) for phase, value in seconds.items()}
        fields[STEP_TIME_KEY] = round((self._span[1] - self._span[0]) / steps, 4)
        self.times, self._span, self._steps_taken = {}, [], 0
        return fields

    def snapshot(self, phases: dict[str, float]) -> dict[str, Any]:
        """This process's `memory` record (see metrics.py); `peak_mib` is the max over the step's phases."""
        gpus = []
        if self.cuda:
            import torch

            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            gpus.append(
                {
                    "index": index,
                    "allocated_mib": round(torch.cuda.memory_allocated(self.device) / MIB, 2),
                    "peak_mib": round(
                        max(phases.values(), default=torch.cuda.max_memory_allocated(self.device) / MIB), 2
                    ),
                    "reserved_mib": round(torch.cuda.memory_reserved(self.device) / MIB, 2),
                }
            )
        return {
            "device": "cuda" if self.cuda else "cpu",
            "gpus": gpus,
            "rss_mib": round(rss_mib(), 2),
            "phases": phases,
        }


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


def merge_snapshots(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from every rank's snapshot: all GPUs listed, phases and RSS as the max over ranks."""
    first = snapshots[0]
    phases: dict[str, float] = {}
    for snap in snapshots:
        for name, value in snap["phases"].items():
            phases[name] = max(phases.get(name, 0.0), value)
    return {
        "device": first["device"],
        "gpus": [gpu for snap in snapshots for gpu in snap["gpus"]],
        "rss_mib": max(snap["rss_mib"] for snap in snapshots),
        "phases": phases,
    }


def merge_times(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One record's `time_s/*` fields from every rank's: the mean over ranks, so phases still sum to <= step."""
    keys = sorted({key for times in per_rank for key in times})
    return {key: round(sum(times.get(key, 0.0) for times in per_rank) / len(per_rank), 4) for key in keys}


def generation_fields(backend: str, per_rank: list[Any], times: dict[str, float]) -> dict[str, Any]:
    """A step record's `generation/*` fields from every rank's `rollouts.RolloutStats`: the backend, tokens summed
    over ranks and their rate over the (rank-mean) generation time (none on a step that generated nothing); the
    decode copy's refresh time (rank max) and builds; the decode/train log-prob mismatch (mean and max over every
    rank's compared tokens) where the decoder returned log-probs; the copy's MiB (rank max)."""
    tokens = sum(stats.tokens for stats in per_rank)
    fields: dict[str, Any] = {GENERATION_BACKEND_KEY: backend, GENERATION_TOKENS_KEY: tokens}
    seconds = times.get(phase_time_key("generation"), 0.0)
    if tokens and seconds > 0:
        fields[GENERATION_RATE_KEY] = round(tokens / seconds, 1)
    copies = [stats.decode_copy_mib for stats in per_rank if stats.decode_copy_mib is not None]
    if copies:  # a part of the generation phase's peak, shown as its own line
        fields[DECODE_COPY_KEY] = max(copies)
    refresh = [stats.copy_refresh_s for stats in per_rank if stats.copy_refresh_s is not None]
    if refresh:
        fields[COPY_REFRESH_KEY] = max(refresh)
        fields[COPY_BUILDS_KEY] = max(stats.copy_builds for stats in per_rank)
    count = sum(stats.mismatch_count for stats in per_rank)
    if count:
        fields[MISMATCH_MEAN_KEY] = round(sum(stats.mismatch_sum for stats in per_rank) / count, 6)
        fields[MISMATCH_MAX_KEY] = round(max(s.mismatch_max for s in per_rank if s.mismatch_max is not None), 6)
    return fields
