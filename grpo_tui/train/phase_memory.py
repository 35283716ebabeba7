"""Per-phase peak memory of one training step: generation, scoring, loss, optimizer.

On CUDA the peak of a phase is `torch.cuda.max_memory_allocated` after resetting the peak statistics
at the phase's start. Phases nest (TRL generates inside `training_step`), so entering a phase closes
the measurement of the enclosing one and leaving it resumes the enclosing one with a fresh peak: each
byte is charged to the innermost phase that was running.

On the CPU there is no allocator peak to read: the figure is the process's peak RSS. On Linux the
kernel keeps that high-water mark (VmHWM in /proc/self/status) and resets it on request (writing 5 to
/proc/self/clear_refs), so each phase gets its true peak, short-lived spikes such as a KV cache
included. Elsewhere it falls back to RSS (psutil) sampled at the phase's boundaries, which shows
growth across phases but not spikes inside one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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


def _rss_mib() -> float:
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
    """Tracks peak MiB per phase since the last `take_step()`; `failed_phase` is set by an OOM."""

    def __init__(self, device: Any = None) -> None:
        import torch

        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.peaks: dict[str, float] = {}
        self.failed_phase: str | None = None
        self._stack: list[str] = []
        self._start_rss = 0.0
        # Linux: true per-phase RSS peaks from the kernel's resettable high-water mark.
        self.rss_hwm = not self.cuda and _reset_rss_peak() and _rss_peak_mib() is not None

    @property
    def current(self) -> str | None:
        return self._stack[-1] if self._stack else None

    def _sample_peak(self) -> float:
        if self.cuda:
            import torch

            return torch.cuda.max_memory_allocated(self.device) / MIB
        if self.rss_hwm:
            return _rss_peak_mib() or _rss_mib()
        return max(self._start_rss, _rss_mib())

    def _restart(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.rss_hwm:
            _reset_rss_peak()
        else:
            self._start_rss = _rss_mib()

    def _close_current(self) -> None:
        phase = self.current
        if phase is not None:
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), self._sample_peak())

    def begin(self, phase: str) -> None:
        self._close_current()
        self._stack.append(phase)
        self._restart()

    def end(self, phase: str) -> None:
        if phase not in self._stack:
            return
        while self._stack:
            self._close_current()
            if self._stack.pop() == phase:
                break
        self._restart()

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
            "rss_mib": round(_rss_mib(), 2),
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
