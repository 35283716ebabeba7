"""End to end through the console command: `grpo-tui run tiny-cpu --headless` with the real trainer
under `accelerate launch`, and Ctrl-C on a real run. Slow (tens of seconds each)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import interrupt_after_steps

from grpo_tui.runs.folder import RunDir, list_runs
from grpo_tui.runs.metrics import PHASES, SCHEMA_VERSION, read_records, step_records

pytestmark = pytest.mark.slow


def grpo_tui_argv() -> list[str]:
    script = shutil.which("grpo-tui")
    return [script] if script else [sys.executable, "-m", "grpo_tui.cli"]


def the_run(runs_dir: Path) -> RunDir:
    (run,) = list_runs(runs_dir)
    return run


def test_run_tiny_cpu_headless_five_steps(tiny_model_path: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [*grpo_tui_argv(), "run", "tiny-cpu", "--headless", "--set", "grpo.max_steps=5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    run = the_run(tmp_path / "runs")
    assert run.read_status()["status"] == "finished"
    records = read_records(run.metrics)
    steps = step_records(records)
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    for record in steps:
        assert record["v"] == SCHEMA_VERSION and isinstance(record["time"], float)
        assert 0.0 <= record["reward"] <= 1.0 and record["reward_std"] >= 0.0 and isinstance(record["loss"], float)
        assert record["loss_impl"] == "chunked" and record["memory"]["rss_mib"] > 0  # tiny-cpu's default
        assert record["memory"]["device"] == "cpu" and set(record["memory"]["phases"]) == set(PHASES)
        assert "rewards/addition_partial/mean" in record and "grad_norm" in record  # TRL's own metrics
    events = [r["event"] for r in records if "event" in r]
    assert events[0] == "start" and events[-1] == "finish"
    assert records[0]["ranks"][0]["pid"] > 0 and records[0]["ranks"][0]["device"] == "cpu"
    lines = done.stdout.splitlines()
    assert sum(line.startswith("[") and "/5 reward" in line for line in lines) == 5
    assert lines[-1].startswith("[####################] 5/5 steps, finished")
    for name in ("config.toml", "accelerate.yaml", "command.json", "stdout.log", "metrics.jsonl", "run.json"):
        assert (run.path / name).is_file(), name
    # The run ends by saying where its model is, how it scored, and the one line that loads it (which works)
    assert f"model saved: {run.model} (" in done.stdout
    assert any(line.startswith("held-out reward: ") and " after (eval.json)" in line for line in lines)
    (load,) = [line.removeprefix("load it with: ") for line in lines if line.startswith("load it with: ")]
    # From the folder the user ran in (the repository root would put its kernels/ on sys.path as `kernels`)
    probe = [sys.executable, "-c", f"{load}; print(type(model).__name__)"]
    loaded = subprocess.run(probe, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "Qwen3ForCausalLM", loaded.stderr[-2000:]


def test_ctrl_c_stops_a_real_run_with_metrics_intact(tiny_model_path: Path, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*grpo_tui_argv(), "run", "tiny-cpu", "--headless", "--set", "grpo.max_steps=100000"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs_dir = tmp_path / "runs"
    out, err = interrupt_after_steps(
        proc, lambda: next((run.metrics for run in list_runs(runs_dir)), None), start_s=240, stop_s=120
    )
    assert proc.returncode == 0, err[-3000:]
    assert "stopping at the next step boundary" in out and "Traceback" not in err
    run = the_run(tmp_path / "runs")
    status = run.read_status()
    assert status["status"] == "stopped" and status["exit_code"] == 0
    records = read_records(run.metrics)
    steps = [r["step"] for r in step_records(records)]
    assert len(steps) >= 3 and steps == list(range(1, len(steps) + 1))
    # Every line of the file is a complete record: nothing torn by the stop.
    assert len(run.metrics.read_text().splitlines()) == len(records)
    with pytest.raises(ProcessLookupError):
        os.killpg(status["pgid"], 0)
