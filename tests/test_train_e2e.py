"""End to end: the real runner and trainer as subprocesses, SIGINT, and an out-of-memory report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import interrupt_after_steps
from test_trainer import make_run

from grpo_tui.runs.metrics import read_records, step_records
from grpo_tui.train import entry

pytestmark = pytest.mark.slow


def test_sigint_stops_at_a_step_boundary(tiny_model_path: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path, "sigint", grpo={"max_steps": 5000}, loss={"impl": "naive"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_tui.train", "--run-dir", str(run.path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = interrupt_after_steps(proc, lambda: run.metrics, start_s=120, stop_s=60)
    assert proc.returncode == 0, stderr[-2000:]
    records = read_records(run.metrics)
    steps = step_records(records)
    assert 3 <= len(steps) < 5000
    assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))  # intact, no torn lines
    stop = [r for r in records if r.get("event") == "stop_requested"]
    assert len(stop) == 1 and stop[0]["source"] == "sigint" and stop[0]["step"] == steps[-1]["step"]
    assert records[-1]["event"] == "finish" and records[-1]["stopped"] is True


def test_out_of_memory_is_reported_with_its_phase(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    # A reward that raises torch.OutOfMemoryError stands in for CUDA running out while scoring
    (tmp_path / "oom_reward.py").write_text(
        "import torch\n\ndef boom(completions, **kw):\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = make_run(
        tmp_path,
        "oom",
        grpo={"max_steps": 3},
        loss={"impl": "naive"},
        rewards={"functions": [{"name": "oom_reward:boom"}]},
    )
    assert entry.main(["--run-dir", str(run.path)]) == entry.EXIT_OOM
    records = read_records(run.metrics)
    oom = [r for r in records if r.get("event") == "oom"]
    assert len(oom) == 1
    assert oom[0]["phase"] == "scoring" and oom[0]["step"] == 0
    assert oom[0]["memory"]["device"] == "cpu" and oom[0]["memory"]["rss_mib"] > 0
