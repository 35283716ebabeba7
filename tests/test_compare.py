"""compare_runs: the table of two runs (chunked vs naive) and their aligned series."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from grpo_tui.dashboard.compare import FINAL_REWARD_STEPS, aligned, compare_runs, summarize
from grpo_tui.dashboard.loading import load_run
from grpo_tui.dashboard.state import PEAK_MIB, RunState
from grpo_tui.runs.metrics import PHASES, TOKEN_PHASES, read_records, valid_share_key
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


def test_mean_padding_share_per_token_phase_skips_steps_without_a_share() -> None:
    from grpo_tui.dashboard.screens.compare import padding_cells

    padded, trimmed, old = RunState(), RunState(), RunState()
    shares = [0.6, 0.7, float("nan"), 1.5, "x", None]  # the last four: not shares, left out of the mean
    padded.apply([{"step": s + 1, valid_share_key("generation"): v} for s, v in enumerate(shares)])
    padded.apply([{"step": 7, valid_share_key("loss"): 0.8}])
    trimmed.apply([{"step": s, **{valid_share_key(p): 0.95 for p in TOKEN_PHASES}} for s in (1, 2)])
    old.apply([{"step": 1, "reward": 0.5}])  # written before the keys existed
    a, b, c = (summarize(state) for state in (padded, trimmed, old))
    assert a.padding["generation"] == pytest.approx(0.35) and a.padding["loss"] == pytest.approx(0.2)
    assert a.padding["scoring"] is None and c.padding == dict.fromkeys(TOKEN_PHASES)
    cell_a, cell_b, delta = padding_cells(a.padding, b.padding)
    assert (cell_a, cell_b, delta.plain) == ("35/—/20", "5/5/5", "−30/—/−15 pts")
    assert padding_cells(b.padding, b.padding)[2].plain == "≈ same"
