"""compare_runs: the table of two runs (chunked vs naive) and their aligned series."""

from __future__ import annotations

import statistics
from pathlib import Path

from grpo_tui.dashboard.compare import FINAL_REWARD_STEPS, aligned, compare_runs
from grpo_tui.dashboard.loading import load_run
from grpo_tui.dashboard.state import PEAK_MIB, RunState
from grpo_tui.runs.metrics import PHASES, read_records
from grpo_tui.tools.demo import make_run


def _steps(path: Path) -> list[dict]:
    return [r for r in read_records(path / "metrics.jsonl") if "event" not in r]


def test_chunked_vs_naive_table(tmp_path: Path) -> None:
    a_run = make_run(tmp_path / "chunked", steps=80, loss_impl="chunked", seed=1)
    b_run = make_run(tmp_path / "naive", steps=60, loss_impl="naive", seed=2)
    table = compare_runs(load_run(a_run.path), load_run(b_run.path))
    a, b = table.rows
    assert (a.label, a.loss_impls, a.steps) == ("chunked", ("chunked",), 80)
    assert (b.label, b.loss_impls, b.steps) == ("naive", ("naive",), 60)
    for row, run in ((a, a_run), (b, b_run)):
        recs = _steps(run.path)
        assert row.phase_peaks_mib == {p: max(r["memory"]["phases"][p] for r in recs) for p in PHASES}
        assert row.median_step_time_s == statistics.median(r["step_time"] for r in recs)
        assert row.final_reward == sum(r["reward"] for r in recs[-FINAL_REWARD_STEPS:]) / FINAL_REWARD_STEPS
    assert a.phase_peaks_mib["loss"] < b.phase_peaks_mib["loss"]  # the demo's chunked uses less memory
    ra, rb = _steps(a_run.path)[:60], _steps(b_run.path)
    deltas = [abs(x["reward"] - y["reward"]) for x, y in zip(ra, rb)]
    assert table.common_steps == 60
    assert table.max_abs_reward_delta == max(deltas)
    assert table.max_delta_step == deltas.index(max(deltas)) + 1
    steps, ya, yb = table.overlays[PEAK_MIB]
    assert len(steps) == 60 and ya[0] != yb[0]


def test_switch_run_lists_both_impls_and_labels(tmp_path: Path) -> None:
    run = make_run(tmp_path / "sw", steps=30, switch_step=15)
    table = compare_runs(load_run(run.path), load_run(run.path), labels=("left", "right"))
    assert table.rows[0].loss_impls == ("chunked", "naive") and table.rows[0].label == "left"
    assert table.max_abs_reward_delta == 0.0


def test_aligned_and_empty_runs() -> None:
    a, b = RunState(), RunState()
    a.apply([{"step": s, "reward": float(s)} for s in (1, 2, 3, 5)])
    b.apply([{"step": s, "reward": 10.0 * s} for s in (2, 3, 4, 5, 6)])
    assert aligned(a, b, "reward") == ([2, 3, 5], [2.0, 3.0, 5.0], [20.0, 30.0, 50.0])
    table = compare_runs(RunState(), RunState())
    assert table.common_steps == 0 and table.max_abs_reward_delta is None
    assert table.rows[0].final_reward is None and table.rows[0].phase_peaks_mib == dict.fromkeys(PHASES)
