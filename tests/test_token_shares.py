"""The phase table's valid / padding token shares: read from the latest step record of a run folder,
`—` where that step logged none or something that is not a share, never an exception."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from rich.console import Console

from grpo_tui.dashboard.feed import DashboardFeed, phase_rows
from grpo_tui.dashboard.state import RunState
from grpo_tui.dashboard.widgets.gpu_memory_panel import PHASE_TABLE_WIDTH, VALID_HEADER, phase_table
from grpo_tui.runs.metrics import TOKEN_PHASES, valid_share_key
from grpo_tui.tools.demo import make_run, step_record

SWITCH = "chunked → naive at step 3"


def render(rows: dict, switch: str | None = None, width: int = PHASE_TABLE_WIDTH) -> str:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(phase_table(rows, switch, width))
    return console.file.getvalue()


def line_of(text: str, phase: str) -> str:
    return next(line.rstrip() for line in text.splitlines() if line.startswith(phase + " "))


def append_raw(run: Path, step: int, raw_shares: dict[str, str]) -> None:
    """Append a step record whose share values are the given JSON texts (NaN, 1e999, "x", {...})."""
    record = step_record(step, random.Random(step))
    for phase in TOKEN_PHASES:
        record.pop(valid_share_key(phase))
    text = json.dumps(record)[:-1]
    text += "".join(f', "{valid_share_key(p)}": {raw}' for p, raw in raw_shares.items()) + "}"
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(text + "\n")


def test_the_feed_shows_the_latest_steps_shares_as_valid_and_padding_percent(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=4, finished=False).path
    append_raw(run, 5, {"generation": "0.38", "scoring": "0.714", "loss": "1"})
    view = DashboardFeed(run, monitor=None).poll()
    assert [view.phases[p]["valid"] for p in TOKEN_PHASES] == [0.38, 0.714, 1]
    assert "valid" not in view.phases["optimizer"]  # the optimizer computes no tokens
    text = render(view.phases)
    assert VALID_HEADER in text.splitlines()[0]
    assert line_of(text, "generation").endswith(" 38/62")
    assert line_of(text, "scoring").endswith(" 71/29") and line_of(text, "loss").endswith(" 100/0")
    assert line_of(text, "optimizer").endswith("%")  # its time share ends the line: no share cell
    assert all(len(line) <= PHASE_TABLE_WIDTH for line in text.splitlines())


def test_a_phase_that_computed_nothing_this_step_shows_a_dash_not_an_older_share(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", steps=4, finished=False).path
    append_raw(run, 5, {"scoring": "0.9", "loss": "0.9"})  # e.g. a step that reused an earlier rollout
    rows = DashboardFeed(run, monitor=None).poll().phases
    assert rows["generation"]["valid"] is None and rows["scoring"]["valid"] == 0.9
    assert line_of(render(rows), "generation").endswith(" —")


def test_runs_written_before_the_keys_existed_show_no_share_column(tmp_path: Path) -> None:
    state = RunState()
    records = [step_record(step, random.Random(step)) for step in (1, 2)]
    for record in records:
        for phase in TOKEN_PHASES:
            del record[valid_share_key(phase)]
    state.apply(records)
    rows = phase_rows(state)
    assert rows and all("valid" not in row for row in rows.values())
    assert VALID_HEADER not in render(rows) and VALID_HEADER not in render(rows, SWITCH)


BAD = ["NaN", "Infinity", "-Infinity", "1e999", "-0.01", "1.0001", "2", "1" + "0" * 400, '"0.5"', "true"]
BAD += ["null", "[0.5]", '{"share": 0.5}', '{"a": [{"b": {}}]}', '""']


@pytest.mark.parametrize("raw", BAD)
def test_a_value_that_is_not_a_share_shows_a_dash_and_never_raises(tmp_path: Path, raw: str) -> None:
    run = make_run(tmp_path / "run", steps=2, finished=False).path
    append_raw(run, 3, {"generation": raw, "scoring": "0.5", "loss": raw})
    feed = DashboardFeed(run, monitor=None)
    rows = feed.poll().phases
    assert rows["generation"]["valid"] is None and rows["loss"]["valid"] is None
    assert rows["scoring"]["valid"] == 0.5
    for switch in (None, SWITCH):
        text = render(rows, switch)
        assert "nan" not in text and "inf" not in text and "0.5" not in text
    assert line_of(render(rows), "loss").endswith(" —") and line_of(render(rows), "scoring").endswith(" 50/50")
    assert feed.poll().phases == rows  # the next poll reads on without tripping either


def test_with_the_switch_columns_the_shares_go_on_a_line_below_that_fits_the_panel() -> None:
    rows = {
        "generation": {"last": 3 * 1024.0, "peak": 3 * 1024.0, "before": 1024.0, "after": 3 * 1024.0},
        "scoring": {"last": 1024.0, "peak": 1024.0, "valid": 0.905},
        "loss": {"last": 4 * 1024.0, "peak": 4 * 1024.0, "valid": None},
        "optimizer": {"last": 1024.0, "peak": 1024.0},
    }
    rows["generation"]["valid"] = 0.0
    for row in rows.values():
        row.update(time_s=1.25, share=0.25)
    text = render(rows, SWITCH)
    assert VALID_HEADER not in text.splitlines()[0] and "before" in text.splitlines()[0]
    assert text.splitlines()[-1].split() == [
        *VALID_HEADER.split(),
        "generation",
        "0/100",
        "scoring",
        "90/10",
        "loss",
        "—",
    ]
    assert all(len(line) <= PHASE_TABLE_WIDTH for line in text.splitlines())
    # a wide panel (a narrow terminal stacks the panels full width) keeps the column
    wide = render(rows, SWITCH, width=90)
    assert VALID_HEADER in wide.splitlines()[0] and line_of(wide, "scoring").endswith(" 90/10")


def test_shares_round_to_whole_percent_that_add_up_to_a_hundred() -> None:
    cells = {}
    for valid in (0.0, 0.004, 0.125, 0.335, 0.5, 0.995, 1.0):
        rows = {"loss": {"last": 1.0, "peak": 1.0, "valid": valid}}
        cells[valid] = line_of(render(rows), "loss").split()[-1]
    assert cells == {
        0.0: "0/100",
        0.004: "0/100",
        0.125: "12/88",
        0.335: "34/66",
        0.5: "50/50",
        0.995: "100/0",
        1.0: "100/0",
    }
    assert all(sum(map(int, cell.split("/"))) == 100 for cell in cells.values())
