"""benchmarks/kernel/kernel_profile.py (where a head call's time goes) and profiling.live_at_peak (what is live at a
rollout's memory peak): the parts that run without a GPU."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import load_benchmark
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_tui.train.profiling import live_at_peak


def _profile():
    return load_benchmark("kernel/kernel_profile")


def test_busy_time_is_the_union_of_kernel_intervals() -> None:
    busy = _profile().busy_ms
    assert busy([]) == 0
    # overlapping [0, 3000) and [1000, 4000) us -> 4 ms; a disjoint [10000, 10500) adds 0.5; one inside adds 0
    assert busy([(1000.0, 4000.0), (0.0, 3000.0), (10000.0, 10500.0), (1500.0, 2000.0)]) == pytest.approx(4.5)


def test_smoke_on_cpu_writes_rows_and_tables(tmp_path, capsys) -> None:
    code = _profile().main(
        ["--device", "cpu", "--cases", "loss:48:0,scoring:48:75", "--calls", "2", "--out", str(tmp_path)]
    )
    assert code == 0
    result = json.loads((tmp_path / "kernel-profile.json").read_text())
    rows = result["rows"]
    assert [(r["mode"], r["padding"], r["provider"]) for r in rows] == [
        ("loss", 0, "chunked"),
        ("scoring", 75, "chunked"),
    ]
    # 48 valid tokens at 75% padding of T = 16 positions: 12 sequences; unpadded: 3
    assert [r["batch"] for r in rows] == [3, 12]
    assert all(r["wall_ms"] > 0 and r["idle_fraction"] is None for r in rows)
    assert "--cases loss:48:0,scoring:48:75" in result["command"]
    text = (tmp_path / "scoring-48-75-chunked.txt").read_text()
    assert "## kernels (torch.profiler)" in text and "selective_logprobs" in text  # cProfile saw the call
    assert "| scoring | 48 | 75% | chunked |" in capsys.readouterr().out


def test_a_failing_case_is_one_row_and_the_others_run(tmp_path, capsys, monkeypatch) -> None:
    profile = _profile()
    real = profile.make_call

    def make_call(mode, provider, inp):
        if mode == "loss":
            raise ModuleNotFoundError("No module named 'trl'\nmore lines")
        return real(mode, provider, inp)

    monkeypatch.setattr(profile, "make_call", make_call)
    code = profile.main(
        ["--device", "cpu", "--cases", "loss:48:0,scoring:48:0", "--calls", "1", "--out", str(tmp_path)]
    )
    assert code == 0
    rows = json.loads((tmp_path / "kernel-profile.json").read_text())["rows"]
    assert rows[0]["error"] == "failed (ModuleNotFoundError: No module named 'trl')"
    assert rows[1]["mode"] == "scoring" and rows[1]["wall_ms"] > 0
    assert (
        "| loss | 48 | 0% | chunked | failed (ModuleNotFoundError: No module named 'trl') |" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--cases", "loss:4096"], "--cases: got 'loss:4096'; allowed: MODE:VALID_TOKENS:PADDING"),
        (["--cases", "decode:4096:0"], "--cases: got 'decode:4096:0'; allowed"),
        (["--cases", "loss:0:0"], "--cases: got 'loss:0:0'; allowed"),
        (["--cases", "scoring:64:100"], "--cases: got 'scoring:64:100'; allowed"),
        (
            ["--providers", "naive"],
            "--providers: got 'naive'; allowed: a comma-separated subset of floor, trl, chunked",
        ),
        (["--providers", ","], "--providers: got ','; allowed"),
        (["--calls", "0"], "--calls: got 0; allowed: an integer >= 1"),
    ],
)
def test_bad_options_are_one_line(tmp_path, capsys, argv: list[str], words: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _profile().main(["--device", "cpu", *argv, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def _valid_cases(cases) -> bool:
    return all(mode in ("loss", "scoring") and n > 0 and 0 <= pct < 100 for mode, n, pct in cases)


def _valid_providers(providers) -> bool:
    return bool(providers) and set(providers) <= set(_profile().PROVIDERS)


OPTIONS = {"--cases": ("parse_cases", _valid_cases), "--providers": ("parse_providers", _valid_providers)}
ODD = ["loss:4\u00b2:0", "scoring:64:\u0661", "loss:64:0,", "trl,chunked", "chunked,,floor", "TRL"]


@pytest.mark.parametrize("flag", list(OPTIONS))
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=30) | st.sampled_from(ODD))
def test_options_any_text_parse_or_are_one_line(flag: str, text: str) -> None:
    parse, valid = OPTIONS[flag]
    try:
        parsed = getattr(_profile(), parse)(text)
    except ValueError as error:
        message = str(error)
        assert message.startswith(f"{flag}: got ") and "allowed:" in message and "\n" not in message.replace(text, "")
    else:
        assert valid(parsed)


def _alloc(addr: int, size: int, filename: str, line: int = 1) -> dict:
    frames = [{"filename": "/opt/torch/.venv/lib/python3.12/site-packages/torch/nn/functional.py", "line": 9}]
    frames.append({"filename": filename.replace("/p/", "/opt/torch/.venv/p/"), "line": line, "name": "f"})
    return {"action": "alloc", "addr": addr, "size": size, "frames": frames}


def test_live_at_peak_takes_the_live_set_at_the_highest_total() -> None:
    events = [
        _alloc(1, 100, "/p/generation.py", 10),
        _alloc(2, 300, "/p/generation.py", 20),
        {"action": "free_requested", "addr": 2, "size": 300},
        {"action": "free_completed", "addr": 2, "size": 300},  # freed once only
        _alloc(3, 250, "/p/generation.py", 10),
        _alloc(4, 60, "/p/cache.py", 5),  # the peak: 100 + 250 + 60 = 410 (above 100 + 300; that block is gone)
        {"action": "free_requested", "addr": 1, "size": 100},
        {"action": "free_requested", "addr": 99, "size": 7},  # allocated before recording: ignored
        _alloc(5, 200, "/p/cache.py", 5),  # 410 - 100 + 200 = 510: a new peak
    ]
    peak, sites = live_at_peak(events[:-1])
    assert peak == 410
    # grouped by the innermost frame outside torch, largest first
    assert sites == [("/opt/torch/.venv/p/generation.py:10 (f)", 350, 2), ("/opt/torch/.venv/p/cache.py:5 (f)", 60, 1)]
    peak, sites = live_at_peak(events)
    assert peak == 510 and sites[0] == ("/opt/torch/.venv/p/cache.py:5 (f)", 260, 2)
    assert live_at_peak([]) == (0, [])
