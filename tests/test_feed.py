"""The dashboard feed re-reads what changed only: control.json by its (mtime, size), the phase table
when new records arrived."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_tui.dashboard import feed as feed_module
from grpo_tui.dashboard.feed import DashboardFeed
from grpo_tui.runs.folder import RunDir
from grpo_tui.tools.demo import make_run


def test_control_and_phase_table_are_reread_only_when_they_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(tmp_path / "run", steps=5)
    reads, tables = [], []
    real_read, real_rows = feed_module.read_json, feed_module.phase_rows
    monkeypatch.setattr(feed_module, "read_json", lambda path: reads.append(path) or real_read(path))
    monkeypatch.setattr(feed_module, "phase_rows", lambda state: tables.append(1) or real_rows(state))
    feed = DashboardFeed(run.path, monitor=None)
    first = feed.poll()
    built = len(tables)
    for _ in range(3):
        view = feed.poll()
    assert not view.stop_requested and view.phases == first.phases and view.phases
    assert len(reads) == 0 and len(tables) == built  # no control.json yet: nothing to parse

    RunDir(run.path).request(stop=True)
    assert feed.poll().stop_requested and feed.poll().stop_requested
    assert len(reads) == 1

    last = json.loads((run.path / "metrics.jsonl").read_text().splitlines()[-1])
    with open(run.path / "metrics.jsonl", "a") as handle:  # one more step
        handle.write(json.dumps({**last, "step": last["step"] + 1, "time": last["time"] + 1}) + "\n")
    feed.poll()
    feed.poll()
    assert len(tables) == built + 1 and len(reads) == 1
