"""Per-phase wall time: the innermost phase is charged, per optimizer step, merged over ranks."""

from __future__ import annotations

import io
import json

import pytest
from benchmark_scripts import load_benchmark

from grpo_tui.train import phase_memory, profiling


class FakeClock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += seconds


def _phases(clock: FakeClock) -> phase_memory.PhaseMemory:
    return phase_memory.PhaseMemory("cpu", clock=clock)


def test_time_goes_to_the_innermost_phase() -> None:
    clock = FakeClock()
    phases = _phases(clock)
    with phases.track("loss"):
        clock.tick(1.0)  # loss
        with phases.track("scoring"):
            clock.tick(2.0)  # scoring
            with phases.track("generation"):
                clock.tick(4.0)  # generation
            clock.tick(8.0)  # scoring again
        clock.tick(16.0)  # loss again
    clock.tick(32.0)  # between phases (gradient clipping): in the step, in no phase
    with phases.track("optimizer"):
        clock.tick(64.0)
    clock.tick(1000.0)  # after the step (logging): in nothing
    times = phases.take_times()
    assert times == {
        "time_s/generation": 4.0,
        "time_s/scoring": 10.0,
        "time_s/loss": 17.0,
        "time_s/optimizer": 64.0,
        "time_s/step": 127.0,
    }
    assert phases.take_times() == {}  # a new collection; nothing ran since


def test_a_phase_that_did_not_run_is_zero_and_steps_are_averaged() -> None:
    clock = FakeClock()
    phases = _phases(clock)
    for loss_s in (1.0, 3.0):  # two optimizer steps in one record (logging_steps = 2), no generation
        with phases.track("loss"):
            clock.tick(loss_s)
        with phases.track("optimizer"):
            clock.tick(0.5)
    times = phases.take_times()
    assert times["time_s/generation"] == times["time_s/scoring"] == 0.0
    assert times["time_s/loss"] == 2.0 and times["time_s/optimizer"] == 0.5
    assert times["time_s/step"] == 2.5
    assert phases.steps_done == 2


def test_an_error_inside_nested_phases_closes_them_all_once() -> None:
    clock = FakeClock()
    phases = _phases(clock)
    with pytest.raises(RuntimeError):
        with phases.track("loss"):
            phases.begin("generation")  # never ended: the error leaves through loss
            clock.tick(3.0)
            raise RuntimeError("boom")
    clock.tick(5.0)
    times = phases.take_times()
    assert times["time_s/generation"] == 3.0 and times["time_s/loss"] == 0.0
    assert times["time_s/step"] == 3.0


def test_merge_times_is_the_mean_over_ranks() -> None:
    ranks = [
        {"time_s/generation": 4.0, "time_s/loss": 1.0, "time_s/step": 6.0},
        {"time_s/generation": 2.0, "time_s/loss": 3.0, "time_s/step": 6.0},
    ]
    merged = phase_memory.merge_times(ranks)
    assert merged == {"time_s/generation": 3.0, "time_s/loss": 2.0, "time_s/step": 6.0}
    assert merged["time_s/generation"] + merged["time_s/loss"] <= merged["time_s/step"]


def test_profile_step_env_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv(profiling.PROFILE_STEP_ENV, raising=False)
    assert profiling.StepProfiler.from_env(tmp_path, cuda=False) is None
    monkeypatch.setenv(profiling.PROFILE_STEP_ENV, "0")
    with pytest.raises(ValueError, match="GRPO_TUI_PROFILE_STEP: got '0'; allowed"):
        profiling.StepProfiler.from_env(tmp_path, cuda=False)
    monkeypatch.setenv(profiling.PROFILE_STEP_ENV, "3")
    profiler = profiling.StepProfiler.from_env(tmp_path, cuda=False)
    assert profiler is not None and profiler.step == 3 and profiler.path.name == "profile-step3.txt"


def test_gc_pauses_count_collections_only_while_started() -> None:
    import gc

    pauses = profiling.GcPauses()
    gc.collect()  # not started: not counted
    pauses.start()
    pauses.start()  # idempotent: one callback, each collection counted once
    gc.collect()
    gc.collect(0)
    pauses.stop()
    gc.collect()
    assert pauses.counts == [1, 0, 1] and pauses.seconds[2] > 0
    line = pauses.summary()
    assert line.startswith("\ngc pauses: ") and "gen0 1 x" in line and "gen2 1 x" in line


def _record(step: int, **times: float) -> dict:
    phases = {"generation": 100.0, "scoring": 200.0, "loss": 300.0, "optimizer": 50.0}
    return {"step": step, "memory": {"device": "cpu", "gpus": [], "rss_mib": 900.0, "phases": phases}, **times}


def test_phase_rows_show_recent_mean_seconds_and_share_and_tolerate_old_runs() -> None:
    from grpo_tui.dashboard.feed import PHASE_TIME_STEPS, phase_rows
    from grpo_tui.dashboard.state import RunState

    old = RunState()
    old.apply([_record(1), _record(2)])  # written before the time keys existed
    rows = phase_rows(old)
    assert rows["loss"]["peak"] == 300.0
    assert all(row["time_s"] is None and row["share"] is None for row in rows.values())

    state = RunState()
    records = [_record(1, **{"time_s/generation": 99.0, "time_s/step": 100.0})]  # falls out of the window
    for step in range(2, PHASE_TIME_STEPS + 2):
        times = {"generation": 6.0, "scoring": 1.0, "loss": 2.0 + step % 2, "optimizer": 0.5}
        records.append(_record(step, **{f"time_s/{p}": s for p, s in times.items()}, **{"time_s/step": 10.0}))
    state.apply(records)
    rows = phase_rows(state)
    assert rows["generation"]["time_s"] == pytest.approx(6.0)
    assert rows["generation"]["share"] == pytest.approx(0.6)
    assert rows["loss"]["time_s"] == pytest.approx(2.5)
    assert rows["optimizer"]["share"] == pytest.approx(0.05)


def test_phase_table_adds_the_time_column_only_when_times_were_logged() -> None:
    from rich.console import Console

    from grpo_tui.dashboard.widgets.gpu_memory_panel import phase_table

    def text(rows: dict) -> str:
        console = Console(width=56, file=io.StringIO(), color_system=None)
        console.print(phase_table(rows, "chunked → trl at step 3"))
        return console.file.getvalue()

    timed = {"generation": {"peak": 3 * 1024.0, "time_s": 12.5, "share": 0.62}, "loss": {"peak": 4 * 1024.0}}
    out = text(timed)
    assert "time/step" in out and "12.50s 62%" in out and "n/a" in out  # loss logged no time
    assert all(len(line) <= 56 for line in out.splitlines())
    assert "time/step" not in text({"loss": {"peak": 4 * 1024.0}})


def test_step_times_script_reads_the_phase_times_of_a_run(tmp_path, capsys) -> None:
    from grpo_tui.tools.demo import make_run

    step_times = load_benchmark("step_times")
    run = make_run(tmp_path / "run", steps=3, n_gpus=1)
    out = tmp_path / "rows.json"
    assert step_times.main(["--skip-step", "3", "--out", str(out), f"chunked/64={run.path}", "trl/64=/nope"]) == 0
    chunked, missing = json.loads(out.read_text())
    assert chunked["step"] == 2 and chunked["step_s"] > sum(chunked["phases_s"].values()) > 0
    assert chunked["peak_gib"] > 0 and missing["error"] == "no step record"
    table = capsys.readouterr().out
    assert "| chunked | 64 | 2 |" in table and "| trl | 64 | failed: no step record |" in table

    # --mean: steps 2 and 3 averaged (step 1 compiles), the spread kept, the highest peak
    run4 = make_run(tmp_path / "run4", steps=4, n_gpus=1)
    records = [json.loads(line) for line in (run4.path / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in records if "time_s/step" in r}
    assert step_times.main(["--mean", "--skip-step", "4", "--out", str(out), f"chunked/64={run4.path}"]) == 0
    (mean,) = json.loads(out.read_text())
    times = [steps[n]["time_s/step"] for n in (2, 3)]
    assert mean["step"] == "2-3" and mean["step_s"] == pytest.approx(sum(times) / 2, abs=1e-4)
    assert mean["step_s_range"] == [round(min(times), 4), round(max(times), 4)]
    peaks = [max(g["peak_mib"] for g in steps[n]["memory"]["gpus"]) for n in (2, 3)]
    assert mean["peak_gib"] == round(max(peaks) / 1024, 2)


def test_generation_fields_sum_ranks_and_rate_over_the_generation_time() -> None:
    from grpo_tui.train.phase_memory import generation_fields
    from grpo_tui.train.rollouts import RolloutStats

    def stats(tokens, copy_s=None, builds=0, mismatch=(0.0, 0, None)) -> RolloutStats:
        return RolloutStats(tokens, None if copy_s is None else 3.5, copy_s, builds, *mismatch)

    fields = generation_fields("graph", [stats(300), stats(340)], {"time_s/generation": 0.5})
    assert fields == {"generation/backend": "graph", "generation/tokens": 640, "generation/tokens_per_s": 1280.0}
    # A step that reuses an earlier rollout (num_iterations > 1) generated nothing: no rate, not a zero.
    assert "generation/tokens_per_s" not in generation_fields("graph", [stats(0)], {"time_s/generation": 0.0})
    # The decode copy's refresh (the slowest rank) and the mismatch over every rank's tokens
    ranks = [stats(10, 0.25, 1, (0.5, 10, 0.2)), stats(10, 0.5, 1, (1.5, 30, 0.3))]
    fields = generation_fields("graph", ranks, {"time_s/generation": 1.0})
    assert fields["generation/copy_refresh_s"] == 0.5 and fields["generation/copy_builds"] == 1
    assert fields["generation/decode_copy_mib"] == 3.5
    assert fields["generation/logp_mismatch_mean"] == pytest.approx(2.0 / 40)
    assert fields["generation/logp_mismatch_max"] == 0.3


def test_progress_shows_the_backend_and_recent_generation_rate() -> None:
    from grpo_tui.dashboard.feed import generation_label
    from grpo_tui.dashboard.state import RunState

    old = RunState()
    old.apply([_record(1)])
    assert generation_label(old) is None  # runs written before the keys existed show nothing

    state = RunState()
    state.apply(
        [
            _record(1, **{"generation/backend": "generate", "generation/tokens_per_s": 1000.0}),
            _record(2, **{"generation/backend": "graph", "generation/tokens_per_s": 3000.0}),
            _record(3, **{"generation/backend": "graph", "generation/tokens": 0}),  # reused rollout: no rate
        ]
    )
    assert generation_label(state) == "graph · 2,000 tok/s"
    state.apply(
        [
            _record(
                4,
                **{
                    "generation/backend": "graph",
                    "generation/logp_mismatch_mean": 0.0123,
                    "generation/logp_mismatch_max": 0.41,
                },
            )
        ]
    )
    assert generation_label(state) == "graph · 2,000 tok/s · Δlogp 0.0123 (max 0.41)"


def test_the_decode_copy_is_a_line_of_the_generation_phase() -> None:
    from rich.console import Console

    from grpo_tui.dashboard.feed import DECODE_COPY_ROW, phase_rows
    from grpo_tui.dashboard.state import RunState
    from grpo_tui.dashboard.widgets.gpu_memory_panel import phase_table

    state = RunState()
    state.apply([_record(1, **{"time_s/generation": 1.0, "time_s/step": 2.0}), _record(2)])
    assert DECODE_COPY_ROW not in phase_rows(state)  # no copy (full fine-tuning without FSDP, or generate)
    state.apply([_record(3, **{"generation/decode_copy_mib": 3264.0, "time_s/generation": 1.0, "time_s/step": 2.0})])
    rows = phase_rows(state)
    assert list(rows)[:2] == ["generation", DECODE_COPY_ROW] and rows[DECODE_COPY_ROW]["last"] == 3264.0
    console = Console(width=56, file=io.StringIO(), color_system=None)
    console.print(phase_table(rows, None))
    line = next(line for line in console.file.getvalue().splitlines() if "decode copy" in line)
    assert "3.2 GiB" in line and "n/a" not in line and "s " not in line.split("GiB", 1)[1]


def test_plot_steps_draws_one_bar_per_picked_row_and_refuses_a_missing_one(tmp_path) -> None:
    import json

    pytest.importorskip("matplotlib")
    plot = load_benchmark("plot_steps")
    phases = {"generation": 3.0, "scoring": 0.5, "loss": 2.0, "optimizer": 0.01}
    rows = [{"impl": "trl", "batch": "64", "step_s": 5.6, "phases_s": phases, "peak_gib": 10.6}]
    table = tmp_path / "t.json"
    table.write_text(json.dumps(rows))
    out = tmp_path / "p.png"
    assert plot.main(["--out", str(out), f"TRL={table}:trl/64"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="no finished row chunked/64"):
        plot.main(["--out", str(out), f"x={table}:chunked/64"])
    # fsdp_rollouts.py's rows by label (a failed run is no bar), and a bar known only by its total
    fsdp = tmp_path / "f.json"
    step = {"label": "keep", "step_s": 2.8, "generation_s": 1.1, "scoring_s": 0.4, "loss_s": 1.2, "peak_gib": 12.9}
    fsdp.write_text(json.dumps({"rows": [step, {"label": "free", "error": "timed out after 95 s"}]}))
    label, row = plot.pick(f"FSDP2={fsdp}:keep")
    assert label == "FSDP2" and row["phases_s"] == {"generation": 1.1, "scoring": 0.4, "loss": 1.2, "optimizer": None}
    assert plot.pick("TRL=21.22")[1] == {"step_s": 21.22, "phases_s": {}, "peak_gib": None}
    assert plot.main(["--out", str(out), f"FSDP2={fsdp}:keep", "TRL=21.22"]) == 0
    with pytest.raises(SystemExit, match="no finished row free"):
        plot.pick(f"x={fsdp}:free")
