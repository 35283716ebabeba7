"""The phase panel in the app: each token phase's valid / padding shares of the run's latest step, a dash
for a share the step did not log or logged as something that is not a share."""

from __future__ import annotations

import json
import random
from pathlib import Path

from ui_support import SIZE, plain, wait_for

from grpo_tui.dashboard.screens.dashboard import DashboardScreen
from grpo_tui.runs.metrics import TOKEN_PHASES, valid_share_key
from grpo_tui.tools.demo import make_run, step_record


async def panel_text(app_factory, run: Path) -> str:
    app = app_factory()
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run)
        await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen) and app.screen.updates > 1)
        return plain(app.screen.query_one("#phase-peaks"))


def phase_line(text: str, phase: str) -> str:
    return next(line.rstrip() for line in text.splitlines() if line.startswith(phase + " "))


async def test_the_panel_shows_the_latest_steps_valid_and_padding_percent(app_factory, runs_dir) -> None:
    run = make_run(runs_dir / "shares", steps=30).path
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "step" in r and "event" not in r][-1]
    text = await panel_text(app_factory, run)
    assert "valid/pad %" in text.splitlines()[0]  # no switch: a column of the table
    for phase in TOKEN_PHASES:
        valid = round(100 * last[valid_share_key(phase)])
        assert phase_line(text, phase).endswith(f" {valid}/{100 - valid}")
    assert phase_line(text, "optimizer").endswith("%")  # its time share: the optimizer counts no tokens


async def test_shares_that_are_missing_or_not_shares_show_a_dash(app_factory, runs_dir) -> None:
    run = make_run(runs_dir / "bad", steps=5, finished=False).path
    record = step_record(6, random.Random(6))
    del record[valid_share_key("scoring")]
    text = json.dumps({**record, valid_share_key("generation"): "0.5", valid_share_key("loss"): {"a": [1]}})
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(text + "\n" + text.replace('"0.5"', "NaN").replace('"step": 6', '"step": 7') + "\n")
    panel = await panel_text(app_factory, run)
    assert all(phase_line(panel, phase).endswith(" —") for phase in TOKEN_PHASES)
