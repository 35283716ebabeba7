"""The metrics stream: one JSON object per line in `runs/<run>/metrics.jsonl`.

Schema version 1. Every record carries `v` (schema version) and `time` (Unix seconds).

Step records (one per logged optimizer step) have no `event` key and carry at least:
    step: int                 optimizer step (1-based, as TRL's global_step)
    reward, reward_std: float mean/std of the summed weighted reward
    loss: float
    loss_impl: str            chunked | naive | trl, the implementation that computed this step
    memory: {
        device: "cuda" | "cpu",
        gpus: [{index, allocated_mib, peak_mib, reserved_mib}],   # this process's local GPUs
        rss_mib: float,                                            # this process's host memory
        phases: {generation, scoring, loss, optimizer},            # peak MiB of each phase this step
    }
plus every metric TRL logs under TRL's own name (e.g. `rewards/<func>/mean`, `frac_reward_zero_std`,
`kl`, `entropy`, `clip_ratio/region_mean`, `completions/mean_length`, `grad_norm`, `learning_rate`,
`step_time`, `num_tokens`).

Event records have an `event` key: start, finish, error, oom, loss_impl_switch, control_error, stop_requested,
generation_fallback (requested, used, reason: grpo.generation_backend could not run).

Readers skip a truncated last line (a writer may be mid-line) and lines from a newer schema they
cannot parse are still returned as dicts: unknown keys are ignored, never fatal.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

EVENTS = frozenset(
    {
        "start",
        "finish",
        "error",
        "oom",
        "loss_impl_switch",
        "control_error",
        "stop_requested",
        "checkpoint",
        "generation_fallback",
    }
)
PHASES = ("generation", "scoring", "loss", "optimizer")


class MetricsWriter:
    """Appends records and flushes each one to the OS, so a reader (or a crash) never loses a step."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # held for the run

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        full = {"v": SCHEMA_VERSION, "time": time.time(), **record}
        self._file.write(json.dumps(full, default=_jsonable, allow_nan=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        return full

    def event(self, name: str, **fields: Any) -> dict[str, Any]:
        if name not in EVENTS:
            raise ValueError(f"unknown metrics event {name!r}; allowed: {', '.join(sorted(EVENTS))}")
        return self.write({"event": name, **fields})

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def is_step(record: dict[str, Any]) -> bool:
    return "event" not in record and "step" in record


@dataclass
class MetricsTail:
    """Incremental reader: each `read_new()` returns the complete lines appended since the last call.

    The file may not exist yet; a partial last line is kept back until its newline arrives.
    """

    path: Path
    offset: int = 0
    _partial: bytes = field(default=b"", repr=False)

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended on a newline
        return list(parse_lines(lines))


try:  # optional: orjson decodes about 3x faster (opening a long run); the stdlib decoder is the fallback
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - depends on the environment
    _fast_loads = None
# Decoders tried in turn on a batch of lines (orjson rejects the NaN / Infinity that json.dumps writes).
_DECODERS = tuple(d for d in (_fast_loads, json.loads) if d is not None)

# Lines decoded per json.loads call: one call over many lines shares the decoder's key memo (the
# same keys repeat on every line), about 1.4x faster than a call per line on long files.
PARSE_BATCH_LINES = 2000


def parse_lines(lines: list[bytes]) -> Iterator[dict[str, Any]]:
    for start in range(0, len(lines), PARSE_BATCH_LINES):
        batch = [line for line in lines[start : start + PARSE_BATCH_LINES] if line.strip()]
        joined, records = b"[" + b",".join(batch) + b"]", None
        for decode in _DECODERS:
            try:
                records = decode(joined)
                break
            except ValueError:  # JSONDecodeError (both libraries) and UnicodeDecodeError are ValueErrors
                continue
        if records is None or len(records) != len(batch):
            records = list(_parse_each(batch))  # a torn line in the batch: find it line by line
        yield from (record for record in records if isinstance(record, dict))


def _parse_each(lines: list[bytes]) -> Iterator[Any]:
    for line in lines:
        try:
            yield json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a torn write from a crash: skip it rather than lose the rest


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete records of a metrics file (an unterminated last line is skipped)."""
    return MetricsTail(Path(path)).read_new()


def step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if is_step(r)]


def as_int(value: Any) -> int | None:
    """A record's integer field, or None when absent, non-numeric (bools too) or not finite."""
    return (
        int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None
    )


def as_float(value: Any) -> float | None:
    """A record's numeric field as a float, or None when absent or non-numeric (bools too)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
