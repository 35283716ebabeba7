"""Profiling one training step: `$GRPO_TUI_PROFILE_STEP=N` runs the Nth optimizer step of this process under
torch.profiler and writes its operator tables to the run folder, with Python's gc pauses beside them.

`write_profile_tables` also serves the benchmarks (e.g. one rollout in `benchmarks/generation_bench.py`), as
does `peak_allocations` (CUDA: which allocations are live at a block's memory peak, and where they were made).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

# The optimizer step (1-based, counted by this process) to run under torch.profiler; unset: none.
PROFILE_STEP_ENV = "GRPO_TUI_PROFILE_STEP"
# Rows of each profiler table: the top operators, enough to see where a step's time goes.
PROFILE_ROWS = 25


class StepProfiler:
    """torch.profiler over one optimizer step (`profiled`); its operator tables go to a text file. The profiled
    step is slower than the others (the profiler's overhead): compare step times from unprofiled steps."""

    def __init__(self, step: int, path: Path, cuda: bool) -> None:
        self.step, self.path, self.cuda = step, path, cuda
        self._active: AbstractContextManager[None] | None = None

    @classmethod
    def from_env(cls, run_path: Path, cuda: bool) -> StepProfiler | None:
        """The profiler $GRPO_TUI_PROFILE_STEP asks for, writing into `run_path`; None when unset."""
        raw = os.environ.get(PROFILE_STEP_ENV)
        if not raw:
            return None
        if not raw.isdecimal() or int(raw) < 1:
            raise ValueError(f"{PROFILE_STEP_ENV}: got {raw!r}; allowed: an optimizer step number from 1")
        rank = os.environ.get("RANK", "0")
        suffix = "" if rank == "0" else f"-rank{rank}"
        return cls(int(raw), Path(run_path) / f"profile-step{raw}{suffix}.txt", cuda)

    def step_starting(self, step: int) -> None:
        if step != self.step or self._active is not None:
            return
        device = "device" if self.cuda else "cpu"
        self._active = profiled(self.path, self.cuda, f"optimizer step {step} of this process ({device} time)")
        self._active.__enter__()

    def step_ended(self, step: int) -> None:
        if step != self.step or self._active is None:
            return
        self._active.__exit__(None, None, None)
        self._active = None


@contextmanager
def profiled(path: Path, cuda: bool, title: str) -> Iterator[Any]:
    """torch.profiler (CPU, and CUDA when `cuda`) and Python's gc pauses over the block; on leaving it, the
    operator tables go to `path` (`write_profile_tables`). Yields the profiler, whose events the caller may
    read once the block is left."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    pauses = GcPauses()
    with profile(activities=activities) as prof:
        pauses.start()
        try:
            yield prof
        finally:
            pauses.stop()
    write_profile_tables(prof, path, cuda, title, pauses.summary())


def write_profile_tables(profile: Any, path: Path, cuda: bool, title: str, preamble: str = "") -> None:
    """A finished torch.profiler's operator tables as text: the top `PROFILE_ROWS` by total and by self device
    time (CPU time without CUDA), and on CUDA by self CPU time, which shows host-side stalls the device tables
    cannot (compiles, plan building, syncs)."""
    averages = profile.key_averages()
    device = "device" if cuda else "cpu"
    parts = [f"# torch.profiler, {title}\n", preamble]
    sorts = (f"{device}_time_total", f"self_{device}_time_total") + (("self_cpu_time_total",) if cuda else ())
    for sort in sorts:
        parts.append(f"\n## top {PROFILE_ROWS} by {sort}\n")
        parts.append(averages.table(sort_by=sort, row_limit=PROFILE_ROWS, max_name_column_width=60))
    Path(path).write_text("".join(parts) + "\n", encoding="utf-8")


class GcPauses:
    """Python's garbage-collector pauses while started (gc.callbacks): a full collection over a large heap
    (torch.compile leaves many objects) stalls the host for as long as any kernel, and no profiler table
    shows it."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]  # per generation
        self.counts = [0, 0, 0]
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        generation = min(int(info.get("generation", 2)), 2)
        self.seconds[generation] += time.perf_counter() - self._began
        self.counts[generation] += 1

    def start(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def summary(self) -> str:
        per = ", ".join(f"gen{g} {n} x {1000 * t:.1f} ms" for g, (n, t) in enumerate(zip(self.counts, self.seconds)))
        return f"\ngc pauses: {1000 * sum(self.seconds):.1f} ms in all ({per})\n"


@contextmanager
def peak_allocations(path: Path, top: int = 15) -> Iterator[None]:
    """CUDA: record the caching allocator's history over the block; on leaving, write to `path` the blocks
    live at the block's peak (counting only what the block allocated), grouped by the Python line that made
    them (`live_at_peak`)."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        yield
    finally:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        events = [e for trace in snapshot.get("device_traces", []) for e in trace]
        peak, sites = live_at_peak(events)
        lines = [f"# live at the peak: {peak / 2**20:,.1f} MiB allocated inside the block", ""]
        lines += [f"{size / 2**20:12,.1f} MiB  {count:6d} blocks  {site}" for site, size, count in sites[:top]]
        Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def live_at_peak(events: list[dict[str, Any]]) -> tuple[int, list[tuple[str, int, int]]]:
    """(peak bytes, [(site, bytes, blocks)] largest first) of the blocks live when the allocator's trace
    (`torch.cuda.memory._snapshot()["device_traces"]` events: action, addr, size, frames) held the most.
    A block counts from its "alloc" to its first free action; a site is the innermost frame outside torch's
    package (else the innermost frame), as "file:line (function)"."""

    def replay(stop: int) -> tuple[dict[int, dict[str, Any]], int, int]:
        # (live blocks after events[:stop], the highest total on the way, the index just past it)
        live: dict[int, dict[str, Any]] = {}
        total = peak = peak_end = 0
        for index, event in enumerate(events[:stop]):
            action = event.get("action")
            if action == "alloc":
                live[event["addr"]] = event
                total += event["size"]
                if total > peak:
                    peak, peak_end = total, index + 1
            elif action in ("free_requested", "free_completed") and event.get("addr") in live:
                total -= live.pop(event["addr"])["size"]
        return live, peak, peak_end

    _, peak, peak_end = replay(len(events))  # twice, linear: no copy of the live set at each new high
    at_peak, _, _ = replay(peak_end)
    sites: dict[str, list[int]] = {}
    for block in at_peak.values():
        entry = sites.setdefault(_site(block.get("frames", [])), [0, 0])
        entry[0] += block["size"]
        entry[1] += 1
    ranked = sorted(((site, size, count) for site, (size, count) in sites.items()), key=lambda s: -s[1])
    return peak, ranked


def _site(frames: list[dict[str, Any]]) -> str:
    # torch's own files sit under site-packages/torch/ (a venv may itself be named torch: /opt/torch/.venv)
    ours = [f for f in frames if "site-packages/torch/" not in f.get("filename", "")]
    frame = (ours or frames or [{}])[0]
    return f"{frame.get('filename', '?')}:{frame.get('line', '?')} ({frame.get('name', '?')})"
