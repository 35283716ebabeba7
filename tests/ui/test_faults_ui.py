"""Hostile metrics lines through the dashboard: +-inf, NaN, out-of-range numbers, deep and overlong lines.
Neither the view model nor the app may crash or hang; non-finite values are gaps."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from ui_support import SIZE, mark_running, plain, wait_for

from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.dashboard.state import RunState
from grpo_tui.dashboard.widgets.braille import Series, render_chart
from grpo_tui.runs.metrics import MAX_LINE_BYTES, MetricsTail, read_records
from grpo_tui.tools.demo import make_run, step_record


def hostile_lines(first_step: int) -> list[str]:
    """Lines the writer allows (Infinity, NaN) and lines no writer of ours makes (but a file may hold)."""
    rng = random.Random(1)
    inf_step = step_record(first_step, rng)
    inf_step.update(reward=float("inf"), loss=float("-inf"), kl=float("nan"), step_time=float("inf"))
    inf_step["memory"]["phases"]["loss"] = float("inf")
    late = step_record(first_step + 1, rng)
    return [
        json.dumps(inf_step),
        json.dumps(late).replace('"time": ', '"time": 1e309, "was": ', 1),  # time: inf after parsing
        json.dumps({**step_record(first_step + 2, rng), "loss": 10**400, "num_tokens": -(10**400)}),
        '{"step": ' + "9" * 400 + ', "loss": 1.0}',  # a step beyond a double: skipped
        "[" * 100_000,  # RecursionError in the stdlib decoder
        '{"event": "control_error", "message": "' + "x" * (MAX_LINE_BYTES + 10) + '"}',
        "[1]",
        "\xff\xfe not json",
        json.dumps(step_record(first_step + 3, rng)),
    ]


def hostile_run(path: Path) -> Path:
    run = make_run(path, steps=10, finished=True).path
    records = (run / "metrics.jsonl").read_text().splitlines()
    finish = [line for line in records if '"finish"' in line]
    body = [line for line in records if '"finish"' not in line]
    (run / "metrics.jsonl").write_text("\n".join(body + hostile_lines(11) + finish) + "\n")
    return run


def test_readers_skip_and_count_what_is_not_a_record(tmp_path: Path) -> None:
    run = hostile_run(tmp_path / "run")
    tail = MetricsTail(run / "metrics.jsonl")
    records = tail.read_new()
    assert [r.get("step") for r in records if "event" not in r][-5:] == [11, 12, 13, int("9" * 400), 14]
    assert tail.skipped == 4  # the 400-digit step parses (and is dropped later), the other four do not
    assert len(read_records(run / "metrics.jsonl")) == len(records)


def test_the_view_model_keeps_infinities_as_values_and_never_as_times(tmp_path: Path) -> None:
    state = RunState()
    state.apply(read_records(hostile_run(tmp_path / "run") / "metrics.jsonl"))
    assert state.last_step == 14
    assert state.column("reward")[10] == float("inf") and state.column("loss")[10] == float("-inf")
    assert state.column("loss")[12] == float("inf") and state.column("num_tokens")[12] == float("-inf")
    assert state.last_time is not None and state.last_time < 1e12
    progress = state.progress(now=state.last_time)
    assert progress.elapsed_s < 1e6 and progress.eta_s == 0.0
    xs, ys = state.series("reward")
    text = render_chart([Series(xs, ys, "green")], 60, 12).plain
    assert "nan" not in text and "inf" not in text and len(text.splitlines()) == 12


def test_a_chart_of_only_non_finite_values_says_no_data() -> None:
    inf, nan = float("inf"), float("nan")
    assert "no data" in render_chart([Series([1, 2, 3], [inf, -inf, nan], "red")], 40, 10).plain
    assert "no data" in render_chart([Series([1, 2], [1e308, -1e308], "red")], 40, 10).plain


async def test_the_dashboard_opens_a_hostile_stream(app_factory, runs_dir) -> None:
    run = hostile_run(runs_dir / "20260101-000000-tiny-cpu")
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        await pilot.pause(0.3)
        assert "step 14" in plain(app.screen.query_one("#progress"))
        for key in "12341":  # every tab draws the hostile stream
            await pilot.press(key)
            await pilot.pause(0.1)
        await pilot.press("end", "left_square_bracket")  # the step browser over the steps with infinities
        await pilot.pause(0.2)
        assert app.is_running


async def test_t_rewrites_a_malformed_control_json(app_factory, runs_dir) -> None:
    run = make_run(runs_dir / "live", steps=10, finished=False).path
    mark_running(run)
    control = run / "control.json"
    control.write_text('{"request_id": "abc"}')
    app = app_factory(clock=time.time)
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 0)
        await pilot.press("t")
        await wait_for(pilot, lambda: json.loads(control.read_text()).get("loss_impl") == "naive")
        assert isinstance(json.loads(control.read_text())["request_id"], int)
        control.write_text("[1]")
        await pilot.press("t")
        await wait_for(pilot, lambda: control.read_text() != "[1]")
        assert app.is_running
