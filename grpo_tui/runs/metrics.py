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
    time_s/generation, time_s/scoring, time_s/loss, time_s/optimizer: float
                              wall seconds of each phase this step (0 when it did not run), charged
                              like the memory peaks to the innermost phase running (generation runs
                              inside scoring, scoring inside loss): loss is forward+backward only.
                              On CUDA measured between device synchronizations. Mean over ranks.
    time_s/step: float        the step's wall seconds, from its first phase's start to its last one's
                              end (>= the sum of the phases; the rest is gradient clipping and the like).
                              TRL's own `step_time` (below) leaves the optimizer out.
                              Runs written before these keys existed lack them (readers show nothing).
    generation/backend: str   the rollout backend that generated this step's completions (generate | static |
                              graph: grpo.generation_backend after auto and fallbacks are resolved)
    generation/tokens: int    completion tokens generated this step, summed over ranks (0 on a step that
                              reuses an earlier rollout: num_iterations > 1)
    generation/tokens_per_s: float   generation/tokens / time_s/generation (absent when nothing was generated)
    tokens/valid_share/<phase>: float   for generation, scoring and loss: the share of the token positions the
                              phase computed that were real tokens (prompt and completion), summed over ranks;
                              1 - it is the padding share. Absent when the phase computed nothing this step.
plus every metric TRL logs under TRL's own name (e.g. `rewards/<func>/mean`, `frac_reward_zero_std`,
`kl`, `entropy`, `clip_ratio/region_mean`, `completions/mean_length`, `grad_norm`, `learning_rate`,
`step_time`, `num_tokens`).

Event records have an `event` key: start, finish, error, oom, loss_impl_switch, control_error, stop_requested,
generation_fallback (requested, used, reason: grpo.generation_backend could not run).
supervisor_lost (the trainer found its supervisor gone and stopped itself; `message` says so).
checkpoint (step, path: a checkpoint was saved). resume (from_step, checkpoint: `grpo-tui resume` continued
the run from that checkpoint; it follows the new start event, and the events before it belong to the
earlier attempt: a run's status is read from the events after its last resume).
finish (step, stopped; model and model_bytes: RUN/model/ written by the final save; with eval.at_end, eval:
eval.json's `reward` and `rewards` before/after, or eval_error: one line).

Readers skip a truncated last line (a writer may be mid-line) and lines from a newer schema they
cannot parse are still returned as dicts: unknown keys are ignored, never fatal. Lines that are not
JSON objects, longer than MAX_LINE_BYTES or nested too deeply to parse are skipped and counted
(`MetricsTail.skipped`); a reader never raises for a line's content. Values may be NaN or +-Infinity
(the writer allows them): consumers draw them as gaps and print them as `nan` / `inf`.

This module is the stream's one writer (`MetricsWriter`) and its one reader: every consumer reads
through `read_records` (the whole file), `MetricsTail` (incremental, optionally block by block),
`read_recent` (every event + the newest steps), `tail_records` / `last_step` (the end of a long
file) or `start_event` (the first record). No other module parses metrics lines.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from grpo_tui.runs.jsonl import JsonlAppender

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
        "supervisor_lost",
        "checkpoint",
        "resume",
        "generation_fallback",
    }
)
PHASES = ("generation", "scoring", "loss", "optimizer")
# Step-record key of a step's wall seconds (first phase start to last phase end).
STEP_TIME_KEY = "time_s/step"


GENERATION_BACKEND_KEY = "generation/backend"
GENERATION_TOKENS_KEY = "generation/tokens"
GENERATION_RATE_KEY = "generation/tokens_per_s"
# Phases whose computed token positions are counted, real and padding (`valid_share_key`).
TOKEN_PHASES = ("generation", "scoring", "loss")
# The decode copy (FSDP2 / LoRA graph rollouts): its MiB per rank (part of the generation phase's peak), seconds
# to gather, merge and write it this step (its build included), and builds this step.
DECODE_COPY_KEY = "generation/decode_copy_mib"
COPY_REFRESH_KEY = "generation/copy_refresh_s"
COPY_BUILDS_KEY = "generation/copy_builds"
# |log p_decode - log p_train| over the step's sampled tokens: mean and max.
MISMATCH_MEAN_KEY = "generation/logp_mismatch_mean"
MISMATCH_MAX_KEY = "generation/logp_mismatch_max"


def valid_share_key(phase: str) -> str:
    """Step-record key of the share of a phase's computed token positions that were real (phase in TOKEN_PHASES)."""
    return f"tokens/valid_share/{phase}"


def phase_time_key(phase: str) -> str:
    """Step-record key of a phase's wall seconds (phase in PHASES)."""
    return f"time_s/{phase}"


# Bytes read from the end of metrics.jsonl for a run's latest state (enough for several step records).
TAIL_BYTES = 64 * 1024
# Bytes read from the start of metrics.jsonl to find the start event (the trainer's first record).
HEAD_BYTES = 16 * 1024
# Bytes read and parsed at a time by `MetricsTail.read_blocks` (a long run is never all dicts at once).
BLOCK_BYTES = 1024 * 1024
# Longest line parsed: a step record is ~2 KB, a start event of 1,000 ranks ~100 KB; a longer line
# was not written by MetricsWriter and parsing it could take seconds.
MAX_LINE_BYTES = 256 * 1024


class MetricsWriter:
    """Appends records, each synced to disk as a whole line, so a reader (or a crash) never loses a step."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = JsonlAppender(self.path)  # held for the run; whole lines or nothing

    def write(self, record: dict[str, Any]) -> dict[str, Any]:
        full = {"v": SCHEMA_VERSION, "time": time.time(), **record}
        self._file.append([json.dumps(full, default=_jsonable, allow_nan=True)])
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


# ---- reading -----------------------------------------------------------------------------------
try:  # optional (`pip install grpo-tui[fast]`): opening a 100k-step run takes 1.27 s with it, 1.61 s with the
    # stdlib decoder, the fallback (`benchmarks/results/ui-cpu/`)
    from orjson import loads as _fast_loads
except ImportError:  # tests/test_metrics_decoders.py runs this branch in a process without orjson
    _fast_loads = None
# Decoders tried in turn on a batch of lines (orjson rejects the NaN / Infinity that json.dumps writes).
_DECODERS = tuple(d for d in (_fast_loads, json.loads) if d is not None)

# Lines decoded per json.loads call: one call over many lines shares the decoder's key memo (the
# same keys repeat on every line), about 1.4x faster than a call per line on long files.
PARSE_BATCH_LINES = 2000


def _parse_lines(lines: list[bytes], skipped: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """The dict records of `lines`; each line skipped (too long, not JSON, not an object) adds 1 to skipped[0]."""
    for start in range(0, len(lines), PARSE_BATCH_LINES):
        batch = [line for line in lines[start : start + PARSE_BATCH_LINES] if line.strip()]
        short = [line for line in batch if len(line) <= MAX_LINE_BYTES]
        joined, records = b"[" + b",".join(short) + b"]", None
        for decode in _DECODERS:
            try:
                records = decode(joined)
                break
            # JSONDecodeError (both libraries) and UnicodeDecodeError are ValueErrors; a deeply nested
            # line makes the stdlib decoder recurse too deep.
            except (ValueError, RecursionError):
                continue
        if records is None or len(records) != len(short):
            records = list(_parse_each(short))  # a torn line in the batch: find it line by line
        good = [record for record in records if isinstance(record, dict)]
        if skipped is not None:
            skipped[0] += len(batch) - len(good)
        yield from good


def _parse_each(lines: list[bytes]) -> Iterator[Any]:
    for line in lines:
        try:
            yield json.loads(line)
        except (ValueError, RecursionError):
            continue  # a torn write from a crash (or a hand-made line): skip it rather than lose the rest


@dataclass
class MetricsTail:
    """Incremental reader: each `read_new()` returns the complete lines appended since the last call.

    The file may not exist yet; a partial last line is kept back until its newline arrives.
    """

    path: Path
    offset: int = 0
    _partial: bytes = field(default=b"", repr=False)
    _skipped: list[int] = field(default_factory=lambda: [0], repr=False)

    @property
    def skipped(self) -> int:
        """Lines read so far that were not records (too long, too deep, not JSON objects)."""
        return self._skipped[0]

    def read_new(self, max_bytes: int = -1) -> list[dict[str, Any]]:
        """The complete records appended since the last call (from at most `max_bytes` new bytes)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(max_bytes)
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended on a newline
        if len(self._partial) > MAX_LINE_BYTES:  # an endless line: drop what came so far, keep reading
            self._partial = b"x" * (MAX_LINE_BYTES + 1)  # still counts as overlong when its end arrives
        return list(_parse_lines(lines, self._skipped))

    def read_blocks(self, block_bytes: int = BLOCK_BYTES) -> Iterator[list[dict[str, Any]]]:
        """Everything appended so far, one block of records at a time.

        The tail is then left after the last complete line: a partial last line is read again from
        the file once its newline arrives, not kept from this read.
        """
        while True:
            before = self.offset
            records = self.read_new(block_bytes)
            if self.offset == before:
                break
            if records:
                yield records
        if len(self._partial) <= MAX_LINE_BYTES:  # (an overlong one stays dropped)
            self.offset -= len(self._partial)
            self._partial = b""


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete records of a metrics file (an unterminated last line is skipped)."""
    return MetricsTail(Path(path)).read_new()


def tail_records(path: str | os.PathLike[str], nbytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The complete records in the last `nbytes` of a metrics file (a long run's file can be large)."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - nbytes))
            data = handle.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > nbytes:
        lines = lines[1:]  # the first line is cut by the seek
    return list(_parse_lines(lines[:-1]))  # [:-1]: an unterminated last line (or b"" after the final newline)


def last_step(path: str | os.PathLike[str], nbytes: int = TAIL_BYTES) -> int | None:
    """The last logged optimizer step, from the file's tail only (None before the first step)."""
    steps = step_records(tail_records(path, nbytes))
    return as_int(steps[-1].get("step")) if steps else None


def start_event(path: str | os.PathLike[str], nbytes: int = HEAD_BYTES) -> dict[str, Any] | None:
    """The stream's start event (the trainer's first record), from the file's head only; None if absent."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(nbytes)
    except OSError:
        return None
    return next((r for r in _parse_lines(head.split(b"\n")[:-1]) if r.get("event") == "start"), None)


class RecentRecords(NamedTuple):
    """`read_recent`'s answer: the events before the window, the window's records, and a tail after it."""

    events: list[dict[str, Any]]  # every event record before the window, in file order
    records: list[dict[str, Any]]  # every record in the window (the newest `recent_bytes`)
    partial: bool  # True when the window starts after the file's first record
    tail: MetricsTail  # goes on after the last complete line


def read_recent(path: str | os.PathLike[str], recent_bytes: int) -> RecentRecords:
    """Every event of the stream but only the records in its last `recent_bytes`: a quick first look.

    Events before the window are found by a byte search (no JSON parse of the steps around them).
    """
    try:
        with open(path, "rb") as handle:
            # mapped, not read: the byte searches below touch the file without copying 100 MB
            data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(handle.fileno()).st_size else b""
    except FileNotFoundError:
        data = b""
    end = data.rfind(b"\n") + 1
    start = data.rfind(b"\n", 0, max(0, end - recent_bytes)) + 1 if end > recent_bytes else 0
    lines, pos = [], data.find(b'"event"', 0, start)
    while pos >= 0:  # the lines before the window that name an event
        lo, hi = data.rfind(b"\n", 0, pos) + 1, data.find(b"\n", pos)
        lines.append(data[lo:hi])
        pos = data.find(b'"event"', hi, start)
    tail = MetricsTail(Path(path), offset=end)
    events = [r for r in _parse_lines(lines, tail._skipped) if "event" in r]
    records = list(_parse_lines(data[start:end].split(b"\n")[:-1], tail._skipped))
    if isinstance(data, mmap.mmap):
        data.close()
    return RecentRecords(events, records, start > 0, tail)


def step_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if is_step(r)]


def as_int(value: Any) -> int | None:
    """A record's integer field, or None when absent, non-numeric (bools too), not finite or beyond a float."""
    number = as_float(value)
    return int(number) if number is not None else None


def as_float(value: Any) -> float | None:
    """A record's numeric field (a time, a pid's start) as a float; None when absent, non-numeric (bools
    too), not finite or beyond a float (a 400-digit integer). Metric values that may be +-inf are read as
    columns (dashboard/series.py), not through this."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
