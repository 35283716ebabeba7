"""The realistic-length workload benchmarks force on the decoder, and the benchmark that measures it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from hypothesis import given
from hypothesis import strategies as st

workload = load_benchmark("workload")


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
