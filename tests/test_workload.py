"""Realistic completion lengths: the draw, the variable that forces it on a run's rollouts, and the benchmark that
measures it on the decoder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from hypothesis import given
from hypothesis import strategies as st

from grpo_tui.tasks import workload
from grpo_tui.tasks.workload import LENGTHS_ENV, ForcedLengths, forced_lengths_from_env, parse_lengths


@given(rows=st.integers(1, 600), cap=st.integers(1, 4096), seed=st.integers(0, 2**32))
def test_lengths_are_seeded_and_within_the_cap(rows: int, cap: int, seed: int) -> None:
    lengths = workload.realistic_lengths(rows, cap, seed)
    assert lengths == workload.realistic_lengths(rows, cap, seed)
    assert len(lengths) == rows and all(1 <= n <= cap for n in lengths)
    assert lengths.count(cap) >= round(workload.AT_CAP * rows)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("rows", "cap"), [(128, 1024), (64, 2048), (32, 1024)])
def test_lengths_average_about_a_third_of_the_cap_with_a_tenth_at_it(rows: int, cap: int, seed: int) -> None:
    lengths = workload.realistic_lengths(rows, cap, seed)
    assert 0.28 <= sum(lengths) / (rows * cap) <= 0.42
    assert 0.08 <= lengths.count(cap) / rows <= 0.13


@pytest.mark.parametrize(("rows", "cap"), [(0, 10), (10, 0), (-1, 5)])
def test_empty_shapes_are_one_line_errors(rows: int, cap: int) -> None:
    with pytest.raises(ValueError, match="allowed: both at least 1"):
        workload.realistic_lengths(rows, cap)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("cap", None),
        ("realistic", ForcedLengths(0)),
        ("realistic:0", ForcedLengths(0)),
        ("realistic:42", ForcedLengths(42)),
    ],
)
def test_the_variable_names_cap_or_a_seeded_draw(raw: str, expected: ForcedLengths | None) -> None:
    assert parse_lengths(raw) == expected
    assert forced_lengths_from_env({LENGTHS_ENV: raw}) == expected


@pytest.mark.parametrize(
    "raw", ["Realistic", "realistic:", "realistic:-1", "realistic:1.5", "realistic:\u0663", "cap\n"]
)
def test_a_bad_value_is_one_line_naming_the_variable(raw: str) -> None:
    with pytest.raises(ValueError) as exc:
        forced_lengths_from_env({LENGTHS_ENV: raw})
    line = str(exc.value)
    assert line.startswith(f"{LENGTHS_ENV}: got ") and "allowed: cap, realistic or realistic:SEED" in line
    assert len(line.splitlines()) == 1


def test_unset_or_empty_forces_nothing() -> None:
    assert forced_lengths_from_env({}) is None and forced_lengths_from_env({LENGTHS_ENV: ""}) is None


def test_each_slice_draws_its_own_lengths_and_a_seed_draws_them_again() -> None:
    draw = ForcedLengths(7).draw
    first = draw(64, 512, step=3, rank=1, part=0)
    assert first == ForcedLengths(7).draw(64, 512, step=3, rank=1, part=0)
    others = [
        draw(64, 512, 4, 1, 0),
        draw(64, 512, 3, 0, 0),
        draw(64, 512, 3, 1, 1),
        ForcedLengths(8).draw(64, 512, 3, 1, 0),
    ]
    assert all(other != first for other in others)
    assert all(1 <= n <= 512 for n in first) and first.count(512) >= round(workload.AT_CAP * 64)


def test_benchmark_smoke_on_cpu(tiny_model_path: Path, tmp_path: Path) -> None:
    bench = load_benchmark("real_lengths")
    assert bench.main(["--device", "cpu", "--tiny", "--shapes", "16x40", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "real-lengths.json").read_text())["rows"]
    assert row["to-cap"]["generated"] == 16 * 40
    assert row["kept"]["row_counts"] == [16] and row["compacted"]["row_counts"][0] == 16
    assert len(row["compacted"]["row_counts"]) >= 2  # the draw leaves at most half the rows by the first checks
    for name in ("kept", "compacted"):
        assert row[name]["generated"] <= sum(workload.realistic_lengths(16, 40, 0))


@pytest.mark.parametrize("shapes", ["128", "0x10", "8x", "ax4", "8x4,"])
def test_benchmark_refuses_bad_shapes(shapes: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        load_benchmark("real_lengths").main(["--tiny", "--shapes", shapes, "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "allowed: ROWSxCAP pairs" in capsys.readouterr().err


@pytest.mark.slow
def test_whole_step_benchmark_smoke_on_cpu(tiny_model_path: Path, tmp_path: Path) -> None:
    bench = load_benchmark("real_length_steps")
    assert (
        bench.main(["--tiny", "--specs", "trl-head-graph,ours,ours-to-cap", "--steps", "2", "--out", str(tmp_path)])
        == 0
    )
    result = json.loads((tmp_path / "real-length-steps.json").read_text())
    rows = {r["spec"]: r for r in result["rows"]}
    assert set(rows) == {"trl-head-graph", "ours", "ours-to-cap"} and "--tiny" in result["command"]
    for row in rows.values():
        assert row["steps"] == [2] and row["step_s"] > 0 and row["batch"] == 8 and row["cap"] == 4
        assert 0 < row["valid_share"]["loss"] <= 1
        assert row["valid_tokens"] > row["generated_tokens"] > 0  # prompts and completions against completions
    # The realistic draw really shortens the completions against the run to the cap
    assert rows["ours"]["mean_length"] < rows["ours-to-cap"]["mean_length"]
    targets = result["targets"]["tiny 8x4"]
    assert 0 < targets["valid_share"] < 1 and targets["step_vs_trl_user"] is None  # trl-user did not run
    assert targets["step_vs_trl_head"] == pytest.approx(
        rows["ours"]["step_s"] / rows["trl-head-graph"]["step_s"], abs=1e-3
    )


@pytest.mark.parametrize(
    ("flag", "value", "allowed"),
    [("--shapes", "0.6b:128", "MODEL:ROWSxCAP"), ("--shapes", "7b:8x4", "MODEL:ROWSxCAP"), ("--specs", "mine", "ours")],
)
def test_whole_step_benchmark_refuses_bad_input(
    flag: str, value: str, allowed: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exc:
        load_benchmark("real_length_steps").main([flag, value, "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert allowed in err[-1] and f": error: {flag}" in err[-1]  # usage, then one line


def test_whole_step_targets_are_the_issue_ratios() -> None:
    targets = load_benchmark("real_length_steps").targets

    def row(spec: str, step: float, gen: float, score: float, loss: float, tokens: float, valid: float) -> dict:
        label = f"0.6b 128x1024 {spec}"
        return dict(
            label=label,
            spec=spec,
            step_s=step,
            generation_s=gen,
            scoring_s=score,
            loss_s=loss,
            generated_tokens=tokens,
            valid_tokens=valid,
        )

    # Completions 0.4 of the run to the cap's; with the prompts (20,000 tokens in both) 0.5
    rows = [
        row("trl-user", 40.0, 30.0, 4.0, 6.0, 40_000, 60_000),
        row("trl-head-graph", 10.0, 2.0, 3.0, 5.0, 40_000, 60_000),
        row("ours", 4.0, 1.5, 1.0, 1.5, 40_000, 60_000),
        row("ours-compact", 3.6, 1.1, 1.0, 1.5, 40_000, 60_000),
        row("ours-efficient", 3.0, 1.1, 0.5, 1.0, 40_000, 60_000),
        row("ours-to-cap", 9.0, 4.0, 2.0, 3.0, 100_000, 120_000),
        {"label": "0.6b 128x1024 ours", "spec": "ours", "error": "oom"},  # a failed run counts nowhere
    ]
    got = targets(rows)["0.6b 128x1024"]
    assert got["valid_share"] == got["compact_valid_share"] == 0.4
    assert got["train_valid_share"] == 0.5
    assert got["step_vs_trl_head"] == 0.4 and got["step_vs_trl_user"] == 0.1 and got["compact_step_vs_trl_head"] == 0.36
    assert got["train_allowance"] == pytest.approx(2.5 / (1.3 * 0.5 * 5.0), abs=1e-3)
    assert got["train_allowance_completions"] == pytest.approx(2.5 / (1.3 * 0.4 * 5.0), abs=1e-3)
    assert got["decode_allowance"] == pytest.approx(1.5 / (1.3 * 0.4 * 4.0), abs=1e-3)
    assert got["compact_decode_allowance"] == pytest.approx(1.1 / (1.3 * 0.4 * 4.0), abs=1e-3)
    assert got["efficient_step_vs_trl_head"] == 0.3
    assert got["efficient_train_allowance"] == pytest.approx(1.5 / (1.3 * 0.5 * 5.0), abs=1e-3)
    assert "compact_valid_share" not in targets(rows[:3] + rows[5:6])["0.6b 128x1024"]
    # Rows measured before valid tokens were recorded: no train allowance, the completions' one still
    older = [{k: v for k, v in r.items() if k != "valid_tokens"} for r in rows]
    got = targets(older)["0.6b 128x1024"]
    assert got["train_allowance"] is None and got["train_allowance_completions"] is not None


def test_whole_step_rows_count_valid_tokens_and_read_again_from_their_runs(tmp_path: Path) -> None:
    from grpo_tui.runs.metrics import MetricsWriter

    bench = load_benchmark("real_length_steps")
    # TRL's num_tokens runs on over the steps; a step's valid tokens are what it added
    runs = bench.run_folder(tmp_path, "0.6b", 8, 4, "ours")
    (runs / "run-a").mkdir(parents=True)
    writer = MetricsWriter(runs / "run-a" / "metrics.jsonl")
    for step, total, seconds in ((1, 100, 9.0), (2, 230, 2.0), (3, 330, 4.0)):
        writer.write({"step": step, "num_tokens": total, "time_s/step": seconds, "generation/tokens": 10 * step})
    writer.close()
    # A step whose record lacks the count leaves the next step's unknown, not twice as large
    assert bench.valid_tokens([{"step": 1, "num_tokens": 10}, {"step": 2}, {"step": 3, "num_tokens": 50}]) == {1: 10}
    row = bench.read_row({"label": "0.6b 8x4 ours", "spec": "ours", "batch": 8, "cap": 4, "exit": 0}, runs)
    assert row["steps"] == [2, 3] and row["valid_tokens"] == 115.0 and row["step_s"] == 3.0
    assert row["generated_tokens"] == 25.0 and row["exit"] == 0
    # --merge --reread: a row whose run folder is beside its file is read again, for the steps it had
    old = {"label": "0.6b 8x4 ours", "spec": "ours", "batch": 8, "cap": 4, "exit": None, "steps": [2], "step_s": 2.0}
    lost = {"label": "0.6b 8x4 trl-user", "spec": "trl-user", "batch": 8, "cap": 4, "steps": [2], "step_s": 8.0}
    part = tmp_path / "real-length-steps.json"
    part.write_text(json.dumps({"command": "call a", "device": "GPU A", "rows": [old, lost]}))
    assert bench.main(["--merge", str(part), str(part), "--reread", "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "real-length-steps.json").read_text())
    rows = {r["spec"]: r for r in result["rows"]}
    assert rows["ours"]["valid_tokens"] == 130.0 and rows["ours"]["step_s"] == 2.0 and rows["ours"]["exit"] is None
    assert rows["trl-user"] == lost  # no run folder: kept as it was
    assert result["command"] == "call a"  # the same file twice lists its command once
    # Without --reread the rows stay as the files have them
    assert bench.main(["--merge", str(part), "--out", str(tmp_path / "plain")]) == 0
    plain = json.loads((tmp_path / "plain" / "real-length-steps.json").read_text())
    assert "valid_tokens" not in plain["rows"][0]


def test_whole_step_reread_needs_merge(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        load_benchmark("real_length_steps").main(["--reread", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--reread: allowed only with --merge" in capsys.readouterr().err


def test_whole_step_results_of_several_calls_merge_into_one(tmp_path: Path) -> None:
    bench = load_benchmark("real_length_steps")

    def part(name: str, command: str, rows: list[dict], device: str = "GPU A") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"command": command, "device": device, "rows": rows}))
        return path

    def row(spec: str, step: float, tokens: float = 40_000) -> dict:
        return dict(
            label=f"0.6b 128x1024 {spec}",
            spec=spec,
            step_s=step,
            generation_s=1.0,
            scoring_s=1.0,
            loss_s=1.0,
            generated_tokens=tokens,
        )

    first = part("a.json", "call a", [row("ours", 4.0), row("trl-head-graph", 10.0), row("ours-to-cap", 9.0, 100_000)])
    second = part("b.json", "call b", [row("trl-user", 40.0), row("ours", 5.0)])
    assert bench.main(["--merge", str(first), str(second), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "real-length-steps.json").read_text())
    assert result["command"] == "call a\ncall b" and result["device"] == "GPU A"
    assert sorted(r["spec"] for r in result["rows"]) == ["ours", "ours-to-cap", "trl-head-graph", "trl-user"]
    got = result["targets"]["0.6b 128x1024"]
    # The later call's `ours` row replaced the earlier one, and the ratios span both calls
    assert got["step_vs_trl_head"] == 0.5 and got["step_vs_trl_user"] == 0.125
    # --specs keeps those specs' rows only (an earlier call's row of a spec measured before a change is dropped)
    specs = "trl-user,trl-head-graph,ours-to-cap"
    assert bench.main(["--merge", str(first), str(second), "--out", str(tmp_path / "kept"), "--specs", specs]) == 0
    kept = json.loads((tmp_path / "kept" / "real-length-steps.json").read_text())
    assert sorted(r["spec"] for r in kept["rows"]) == sorted(specs.split(","))
    assert kept["targets"]["0.6b 128x1024"] == {}


@pytest.mark.parametrize(
    ("content", "allowed"),
    [
        (b"\xff\xfe not json", "cannot read"),
        (b'{"rows": []}', "rows and command"),
        (b'{"rows": [{"spec": "ours"}], "command": "c"}', "without a label"),
        (b'{"rows": [{"label": "a b", "spec": "ours", "step_s": "9"}], "command": "c"}', "not a number"),
        (b'{"rows": [], "command": "c", "device": "GPU B"}', "one device per result"),
    ],
)
def test_whole_step_merge_refuses_bad_files(
    content: bytes, allowed: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"command": "c", "device": "GPU A", "rows": []}))
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(SystemExit) as exc:
        load_benchmark("real_length_steps").main(["--merge", str(good), str(bad), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert allowed in err[-1] and ": error: --merge" in err[-1]
    assert not (tmp_path / "o").exists()  # nothing written


ROW_VALUES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)


@given(
    content=st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | st.lists(
        st.fixed_dictionaries(
            {"label": st.sampled_from(["0.6b 8x4 ours", "x"]), "spec": st.sampled_from(["ours", "ours-to-cap", "q"])},
            optional={k: ROW_VALUES for k in ("step_s", "generation_s", "scoring_s", "loss_s", "generated_tokens")},
        ),
        max_size=4,
    ).map(lambda rows: json.dumps({"command": "c", "rows": rows}).encode())
)
def test_whole_step_merge_of_any_bytes_is_a_result_or_one_line(content: bytes) -> None:
    import tempfile

    merge = load_benchmark("real_length_steps").merge
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "part.json"
        path.write_bytes(content)
        try:
            result = merge([path])
        except ValueError as exc:
            assert str(exc).startswith("--merge: ") and "\n" not in str(exc)
        else:
            assert isinstance(result["targets"], dict)
