"""`grpo-tui tune`: the search with a fake trial runner, the bad inputs, and two real searches on tiny-cpu."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from grpo_tui.tools import tune
from grpo_tui.tools.tune_search import (
    ACCUM,
    BATCH,
    MEMORY_OPTIONS,
    Measurement,
    TuneSearch,
    available_options,
)

ALL_FIELDS = {o.path for o in MEMORY_OPTIONS}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_runner(clock: FakeClock, wall_s: float = 10.0, broken: str | None = None):
    """Memory grows with the batch, each option saves some and costs some speed; deterministic."""
    seen: list[dict] = []

    def run(settings: dict, left_s: float) -> Measurement:
        seen.append(settings)
        clock.now += wall_s
        if broken and broken in settings:
            return Measurement(ok=False, reason="boom", wall_s=wall_s)
        batch = settings[BATCH]
        savings = {"grpo.loss_sub_batch": 0.5, "grpo.generation_sub_batch": 0.7, "loss.lean": 0.9}
        memory, speed = batch / 16.0, 100.0 * batch**0.5  # GiB, tokens/s
        for path, factor in savings.items():
            if path in settings:
                memory, speed = memory * factor, speed * (0.8 if path != "loss.lean" else 1.05)
        speed *= 1.1 if settings.get(ACCUM) == 2 else 1.0
        if memory > 8.0:
            return Measurement(ok=False, oom=True, reason="OOM in loss", wall_s=wall_s)
        return Measurement(ok=True, peak_gib=memory, step_s=1.0, tokens_per_s=speed, wall_s=wall_s)

    run.seen = seen  # type: ignore[attr-defined]  # the test reads what was tried
    return run


def search(runner, clock, cap=6.0, budget_s=10_000.0, fields=ALL_FIELDS, limit=4096):
    return TuneSearch(
        runner,
        cap_gib=cap,
        budget_s=budget_s,
        batch_step=8,
        base={BATCH: 8, ACCUM: 1},
        options=available_options(fields),
        limit=limit,
        clock=clock,
    )


def test_search_picks_the_fastest_fitting_trial() -> None:
    clock = FakeClock()
    result = search(fake_runner(clock), clock).run()
    fitting = [t for t in result.trials if t.fits]
    assert result.best is not None and not result.out_of_budget
    assert result.best.tokens_per_s == max(t.tokens_per_s for t in fitting)
    assert all(t.peak_gib <= 6.0 for t in fitting)
    # A batch the plain settings cannot hold fits with the memory options (2x the max batch).
    plain_max = max(t.settings[BATCH] for t in fitting if len(t.settings) == 1)
    assert result.best.settings[BATCH] > plain_max
    assert {t.phase for t in result.trials} == {"batch", "option", "combined", "accumulation"}
    assert len({json.dumps(t.settings, sort_keys=True) for t in result.trials}) == len(result.trials)


def test_search_stops_before_a_trial_that_would_overrun_the_budget() -> None:
    clock = FakeClock()
    result = search(fake_runner(clock, wall_s=10.0), clock, budget_s=35.0).run()
    assert result.out_of_budget
    assert len(result.trials) == 3  # at 30 s, 5 s are left: less than the mean trial
    assert clock.now <= 35.0
    assert result.best is not None  # the best so far still wins


def test_options_the_schema_lacks_are_never_tried() -> None:
    clock = FakeClock()
    runner = fake_runner(clock)
    search(runner, clock, fields={"loss.lean", "grpo.generation_sub_batch"}).run()
    tried = {path for settings in runner.seen for path in settings}
    assert "grpo.loss_sub_batch" not in tried and "grpo.activation_offload" not in tried
    assert {"loss.lean", "grpo.generation_sub_batch"} <= tried
    assert [o.path for o in available_options()] == [o.path for o in MEMORY_OPTIONS if o.path in _schema_paths()]


def _schema_paths() -> set[str]:
    from grpo_tui.config.schema import walk_fields

    return {f.path for f in walk_fields()}


def test_nothing_fits_and_errors_never_win() -> None:
    clock = FakeClock()
    result = search(fake_runner(clock), clock, cap=0.1).run()
    assert result.best is None and result.trials
    clock = FakeClock()
    result = search(fake_runner(clock, broken="loss.lean"), clock).run()
    assert all("loss.lean" not in t.settings for t in result.trials if t.fits)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["no-such-preset", "--memory-cap", "8"], "no-such-preset"),
        (["tiny-cpu", "--memory-cap", "0"], "--memory-cap: got 0.0"),
        (["tiny-cpu", "--memory-cap", "nan"], "--memory-cap: got nan"),
        (["tiny-cpu", "--memory-cap", "8", "--time-budget", "0"], "--time-budget: got 0.0"),
    ],
)
def test_bad_input_is_one_line(args, expected, capsys) -> None:
    assert tune.main(args) == tune.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err and err.startswith("grpo-tui tune:")


def test_measure_steps_uses_the_last_step_wall_time() -> None:
    steps = [
        {"v": 1, "step": 1, "time": 10.0, "step_time": 9.0, "completions/mean_length": 3.0},
        {"v": 1, "step": 2, "time": 12.0, "step_time": 1.5, "completions/mean_length": 4.0},
    ]
    step_s, rate = tune.measure_steps(steps, completions_per_step=16)
    assert step_s == 2.0 and math.isclose(rate, 4.0 * 16 / 2.0)
    assert tune.measure_steps([], completions_per_step=16) == (None, None)  # no run folder appeared


def test_a_trial_reads_its_metrics_once(tmp_path, monkeypatch) -> None:
    import subprocess

    from grpo_tui.config.store import load_preset
    from grpo_tui.runs import metrics
    from grpo_tui.tools import bench_memory
    from grpo_tui.tools.demo import make_run

    def fake_run(argv, **kwargs):  # the trial's `grpo-tui run`: a finished run folder appears
        make_run(tmp_path / "runs" / "20260101-000000-tiny-cpu", steps=3)
        return subprocess.CompletedProcess(argv, 0, "", "")

    reads = []
    real = bench_memory.read_records
    monkeypatch.setattr(bench_memory.subprocess, "run", fake_run)

    def counted(path):  # one counter for both names the stream can be read by
        reads.append(path)
        return real(path)

    monkeypatch.setattr(bench_memory, "read_records", counted)
    monkeypatch.setattr(metrics, "read_records", counted)
    preset = load_preset("tiny-cpu")[0]
    got = tune.real_runner("tiny-cpu", preset, [], 8.0, 3, tmp_path / "runs")({}, 600.0)
    assert got.ok and got.step_s is not None and got.tokens_per_s is not None
    assert len(reads) == 1


@pytest.fixture
def user_presets(tmp_path, monkeypatch, tiny_model_path):
    from grpo_tui.config.store import USER_DIR_ENV

    folder = tmp_path / "user-presets"
    monkeypatch.setenv(USER_DIR_ENV, str(folder))
    return folder


def test_tune_tiny_cpu_writes_the_winner(user_presets, tmp_path, capsys) -> None:
    # --limit 8 and a short budget keep it to a few ~10 s trials on a shared CPU.
    argv = ["tiny-cpu", "--memory-cap", "64", "--limit", "8", "--time-budget", "0.4"]
    code = tune.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--steps", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    trials = [line for line in out.splitlines() if line.startswith("trial ")]
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    assert trials and len(rows) == len(trials)
    assert "(best)" in out and "tokens/s" in out
    saved = user_presets / "tiny-cpu-tuned-64g.toml"
    assert saved.exists() and f"saved {saved}" in out
    from grpo_tui.config.store import load_preset

    assert load_preset("tiny-cpu-tuned-64g")[0].grpo.per_device_batch_size == 8


def test_tune_with_a_cap_nothing_fits_writes_nothing(user_presets, tmp_path, capsys) -> None:
    # On the CPU the cap is compared with the trial's peak RSS, which is far above 0.01 GiB.
    argv = ["tiny-cpu", "--memory-cap", "0.01", "--limit", "8", "--time-budget", "0.2", "--steps", "1"]
    assert tune.main([*argv, "--runs-dir", str(tmp_path / "runs")]) == 1
    out = capsys.readouterr().out
    verdict = [line for line in out.splitlines() if line.startswith("nothing fits")]
    assert len(verdict) == 1 and "0.01 GiB" in verdict[0] and "smallest peak" in verdict[0]
    assert not user_presets.exists() or not list(user_presets.iterdir())


FAKE_SEARCH = """
import json, sys
print(json.dumps({"columns": ["#", "settings", "result"]}), flush=True)
for i in (1, 2):
    print(json.dumps({"trial": {"index": i}, "row": [str(i), f"batch {8 * i}", "fit"]}), flush=True)
print(json.dumps({"done": {"message": "best: batch 16; saved it"}}), flush=True)
"""


def _run_screen(tmp_path, monkeypatch, cap: str, command=None) -> tuple[list[list[str]], str]:
    """Open the tune screen from the presets screen (`u`), submit `cap`, and return its rows and status."""
    import asyncio

    from textual.widgets import DataTable, Static

    from grpo_tui.dashboard.app import create_app
    from grpo_tui.dashboard.screens import tune as tune_screen

    if command is not None:
        monkeypatch.setattr(tune_screen, "tune_command", lambda *args, **kwargs: command)
    monkeypatch.setenv("GRPO_TUI_PRESETS_DIR", str(tmp_path / "user-presets"))

    async def scenario() -> tuple[list[list[str]], str]:
        app = create_app(runs_dir=tmp_path / "runs", auto_attach=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await pilot.press("u")
            assert isinstance(app.screen, tune_screen.TuneScreen)
            await pilot.press(*cap, "enter")
            screen = app.screen
            for _ in range(200):  # up to 20 s: a real `grpo-tui tune` starts a Python process
                await pilot.pause(0.1)
                status = str(screen.query_one("#tune-status", Static).render())
                if screen.exit_code is not None or status.startswith(("memory cap:", "time budget:")):
                    break
            table = screen.query_one(DataTable)
            rows = [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
            return rows, str(screen.query_one("#tune-status", Static).render())

    return asyncio.run(scenario())


def test_tune_screen_shows_each_trial_as_it_ends(tmp_path, monkeypatch) -> None:
    import sys

    script = tmp_path / "fake_search.py"
    script.write_text(FAKE_SEARCH)
    rows, status = _run_screen(tmp_path, monkeypatch, "8", [sys.executable, str(script)])
    assert rows == [["1", "batch 8", "fit"], ["2", "batch 16", "fit"]]
    assert status == "best: batch 16; saved it"


def test_tune_screen_shows_the_commands_one_line_error(tmp_path, monkeypatch) -> None:
    rows, status = _run_screen(
        tmp_path, monkeypatch, "9", ["sh", "-c", "echo 'grpo-tui tune: no trial fits' >&2; exit 2"]
    )
    assert rows == [] and status == "grpo-tui tune: no trial fits"


def test_tune_screen_refuses_a_bad_cap_in_one_line(tmp_path, monkeypatch) -> None:
    for cap, shown in (("abc", "'abc'"), ("0", "'0'"), ("-3", "'-3'"), ("nan", "'nan'")):
        rows, status = _run_screen(tmp_path, monkeypatch, cap, ["sh", "-c", "exit 0"])
        assert rows == [] and status == f"memory cap: got {shown}; allowed: a positive number of GiB (e.g. 24)"


def test_measure_steps_counts_the_tokens_the_run_generated() -> None:
    # generation/tokens is measured; the batch the search asked for is only what it asked for.
    steps = [
        {"v": 1, "step": 1, "time": 10.0, "completions/mean_length": 3.0},
        {"v": 1, "step": 2, "time": 12.0, "completions/mean_length": 4.0, "generation/tokens": 96},
    ]
    assert tune.measure_steps(steps, completions_per_step=4096) == (2.0, 48.0)


def test_a_trial_runs_its_own_batch_whatever_the_user_set(tmp_path) -> None:
    from grpo_tui.runs.listing import read_config
    from grpo_tui.tools.bench_memory import run_trial

    # tune and max-batch pass the user's --set to every trial: a batch among them once pinned every trial.
    got = run_trial("tiny-cpu", "chunked", 8, steps=1, runs_dir=tmp_path, extra_sets=["grpo.per_device_batch_size=16"])
    assert got.trial.ok, got.trial.reason
    assert read_config(Path(got.trial.run_dir))["grpo"]["per_device_batch_size"] == 8
    (step,) = got.steps
    assert step["generation/tokens"] == pytest.approx(step["completions/mean_length"] * 8, abs=0.5)
