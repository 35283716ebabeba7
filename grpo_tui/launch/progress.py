"""Headless progress: one plain-text line per logged step, and the one-line reason a run failed.

Plain text (no terminal control codes) so the output reads the same in a terminal, a log file or CI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from grpo_tui.runs.metrics import is_step

BAR_WIDTH = 20


def progress_bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    filled = min(width, max(0, round(width * done / total))) if total > 0 else 0
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _num(record: dict[str, Any], key: str, fmt: str) -> str | None:
    value = record.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, fmt)
    return None


def _memory(record: dict[str, Any]) -> str | None:
    """The highest GPU peak of this process, or its host memory (RSS) on the CPU."""
    memory = record.get("memory")
    if not isinstance(memory, dict):
        return None
    peaks = [g.get("peak_mib") for g in memory.get("gpus") or [] if isinstance(g, dict)]
    peaks = [p for p in peaks if isinstance(p, (int, float))]
    if peaks:
        return f"peak {max(peaks):.0f} MiB"
    rss = memory.get("rss_mib")
    return f"rss {rss:.0f} MiB" if isinstance(rss, (int, float)) else None


def format_step(record: dict[str, Any], max_steps: int) -> str:
    """`[####......] 12/200 reward 0.312 loss 0.0123 kl 0.0010 0.21 s/step peak 812 MiB naive`."""
    step = record.get("step", 0)
    parts = [progress_bar(int(step), max_steps), f"{step}/{max_steps}"]
    for label, key, fmt in (("reward", "reward", ".3f"), ("loss", "loss", ".4g"), ("kl", "kl", ".4g")):
        text = _num(record, key, fmt)
        if text is not None:
            parts.append(f"{label} {text}")
    step_time = _num(record, "step_time", ".2f")
    if step_time is not None:
        parts.append(f"{step_time} s/step")
    memory = _memory(record)
    if memory is not None:
        parts.append(memory)
    if record.get("loss_impl"):
        parts.append(str(record["loss_impl"]))
    return " ".join(parts)


def format_event(record: dict[str, Any]) -> str | None:
    """A line for the events worth showing while a run goes on (None for the rest)."""
    event = record.get("event")
    if event == "loss_impl_switch":
        return f"step {record.get('step')}: loss.impl {record.get('from')} -> {record.get('to')}"
    if event == "stop_requested":
        return f"step {record.get('step')}: stop requested, finishing"
    if event == "checkpoint":
        return f"step {record.get('step')}: checkpoint saved {record.get('path', '')}".rstrip()
    if event == "control_error":
        return f"control.json ignored: {record.get('message', '')}"
    if event == "finish" and isinstance(record.get("model"), str):
        return finish_lines(record)
    return None


def finish_lines(record: dict[str, Any]) -> str:
    """Where the run's model is, the one line that loads it, and the held-out reward before -> after."""
    from grpo_tui.runs.model_dir import human_bytes, load_command

    model = Path(record["model"])
    size = record.get("model_bytes")
    lines = [f"model saved: {model}" + (f" ({human_bytes(size)})" if isinstance(size, int) else "")]
    lines.append(f"load it with: {load_command(model)}")
    scores = record.get("eval")
    total = scores.get("reward") if isinstance(scores, dict) else None
    if isinstance(total, dict) and all(isinstance(total.get(k), (int, float)) for k in ("before", "after")):
        lines.append(f"held-out reward: {total['before']:.3f} before -> {total['after']:.3f} after (eval.json)")
    elif record.get("eval_error"):
        lines.append(f"held-out evaluation failed: {record['eval_error']}")
    return "\n".join(lines)


class ProgressPrinter:
    """Feeds on metrics records; prints one line per step record and the shown events."""

    def __init__(self, max_steps: int, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_steps = max_steps
        self.out = out
        self.last_step = 0
        self.last_reward: float | None = None
        self._clock = clock
        self._started = clock()

    def feed(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            if is_step(record):
                self.last_step = int(record.get("step") or 0)
                if isinstance(record.get("reward"), (int, float)):
                    self.last_reward = float(record["reward"])
                line = format_step(record, self.max_steps)
            else:
                line = format_event(record)
            if line:
                print(line, file=self.out, flush=True)

    def summary(self, status: str) -> str:
        elapsed = self._clock() - self._started
        reward = f", last reward {self.last_reward:.3f}" if self.last_reward is not None else ""
        return (
            f"{progress_bar(self.last_step, self.max_steps)} {self.last_step}/{self.max_steps} steps, "
            f"{status} in {elapsed:.0f} s{reward}"
        )
