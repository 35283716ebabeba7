"""Every JSON-lines file a run writes holds whole lines: a write the disk refuses halfway is rolled back.

The refusal is real: the writing process runs under a file-size limit (RLIMIT_FSIZE), under which the
kernel accepts the part of a write that fits and fails the rest, as a full disk does.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

from test_trainer import make_run

from grpo_tui.runs.metrics import read_records, step_records

# Bytes any file of the limited process may reach: several steps' completions, far under a checkpoint.
SIZE_LIMIT = 24 * 1024


def limited(limit: int):
    """A preexec_fn: files of the child stop at `limit` bytes, and a write past it fails (EFBIG), not kills."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def whole_lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.splitlines()]


def test_a_refused_write_leaves_whole_completion_lines(tiny_model_path: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path, "full", grpo={"max_steps": 400}, logging={"completions_per_step": 32})
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui.train", "--run-dir", str(run.path)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited(SIZE_LIMIT),
    )
    assert done.returncode != 0, done.stderr[-2000:]
    rows = whole_lines(run.completions)
    assert run.completions.stat().st_size <= SIZE_LIMIT
    # A step's rows land together: every step in the file has all of them.
    steps = [row["step"] for row in rows]
    assert steps and all(steps.count(step) == 32 for step in set(steps)), steps
    records = read_records(run.metrics)
    errors = [r for r in records if r.get("event") == "error"]
    assert len(errors) == 1 and "File too large" in errors[0]["message"], errors
    whole_lines(run.metrics)
    assert step_records(records)[-1]["step"] >= max(steps)


WRITE_UNTIL_REFUSED = """
import sys
from grpo_tui.runs.metrics import MetricsWriter
writer = MetricsWriter(sys.argv[1])
for step in range(1, 100_000):
    try:
        writer.write({"step": step, "reward": 0.5, "text": "x" * 700})
    except OSError as exc:
        print(step, exc.errno)
        break
"""


def test_a_refused_metrics_record_is_rolled_back(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", WRITE_UNTIL_REFUSED, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limited(10_000),
    )
    refused_at = int(done.stdout.split()[0])
    records = whole_lines(path)
    assert [r["step"] for r in records] == list(range(1, refused_at))
    assert path.stat().st_size < 10_000
