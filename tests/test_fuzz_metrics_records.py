"""Property-based fuzz of the step records the dashboard's phase panel reads from metrics.jsonl.

Step records shaped like the trainer's, with any JSON (or JSON-like: NaN, Infinity, 1e999, a 400-digit
integer) at the per-phase keys (the valid-token shares, the phase seconds, the phase peaks), between
lines of random bytes: the feed and the phase table raise nothing, and each token phase shows the
latest step's share when it is a number in [0, 1], a dash otherwise.
"""

from __future__ import annotations

import io
import json
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from grpo_tui.dashboard.feed import DashboardFeed
from grpo_tui.dashboard.widgets.gpu_memory_panel import phase_table
from grpo_tui.runs.metrics import PHASES, STEP_TIME_KEY, TOKEN_PHASES, phase_time_key, read_records, valid_share_key
from grpo_tui.tools.demo import make_run, step_record

# Cases per CI run (a feed over a small run folder, a few ms each).
RECORD_CASES = 200
# JSON texts Python's json.dumps never writes but a file may hold; the reader parses them all.
RAW = ["NaN", "-Infinity", "Infinity", "1e999", "-1e999", "1" + "0" * 400, "-0.0", "5e-324", "1.0000000000000002"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
raw_values = st.one_of(
    json_values.map(json.dumps),
    st.sampled_from(RAW),
    st.floats(min_value=0.0, max_value=1.0).map(json.dumps),  # the valid case, often
)
keys = [valid_share_key(p) for p in TOKEN_PHASES] + [phase_time_key(p) for p in PHASES] + [STEP_TIME_KEY]
fuzzed = st.dictionaries(st.sampled_from(keys + [f"memory.phases.{p}" for p in PHASES]), raw_values, max_size=8)
lines = st.lists(st.one_of(st.tuples(st.just("step"), fuzzed), st.tuples(st.just("bytes"), st.binary(max_size=40))))


def step_line(step: int, fields: dict[str, str]) -> bytes:
    """A step record whose fuzzed fields hold the given JSON texts verbatim."""
    record = step_record(step, random.Random(step))
    phases = record["memory"]["phases"]
    for name in fields:
        if name.startswith("memory.phases."):
            phases[name.rsplit(".", 1)[1]] = f"@{name}@"
        else:
            record[name] = f"@{name}@"
    text = json.dumps(record)
    for name, raw in fields.items():
        text = text.replace(json.dumps(f"@{name}@"), raw)
    return text.encode("utf-8", "surrogatepass")


def expected_share(value: object) -> float | None:
    if type(value) not in (int, float):  # bools, strings, lists, objects, None
        return None
    return float(value) if 0 <= value <= 1 else None  # NaN, +-inf and out of range fail


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-metrics")


@settings(max_examples=RECORD_CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=lines, last=fuzzed, width=st.integers(min_value=20, max_value=120), switch=st.booleans())
def test_fuzz_step_records_through_the_phase_panel(
    folder: Path, body: list[tuple[str, object]], last: dict[str, str], width: int, switch: bool
) -> None:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        run = make_run(Path(tmp) / "run", steps=2, finished=False, completions=False).path
        chunks = [b"\n"]  # after the demo's own lines
        for step, (kind, item) in enumerate([*body, ("step", last)], start=3):
            chunks.append((step_line(step, item) if kind == "step" else item.replace(b"\n", b" ")) + b"\n")  # type: ignore[arg-type]
        with open(run / "metrics.jsonl", "ab") as handle:
            handle.write(b"".join(chunks))
        feed = DashboardFeed(run, monitor=None)
        feed.poll()
        rows = feed.poll().phases  # the first poll reads the newest steps, the second the whole file
        newest = [r for r in read_records(run / "metrics.jsonl") if "event" not in r and "step" in r][-1]
    for phase in TOKEN_PHASES:
        if phase in rows:
            assert rows[phase]["valid"] == expected_share(newest.get(valid_share_key(phase)))
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(phase_table(rows, "chunked → naive at step 3" if switch else None, width))
    text = console.file.getvalue()
    for phase in TOKEN_PHASES:
        if rows.get(phase, {}).get("valid") is None and phase in rows:
            assert "—" in text
