"""The end-to-end memory benchmark's pure parts: the batch search and the metrics summary."""

import json

import pytest

from grpo_tui.runs.metrics import read_records
from grpo_tui.tools.bench_memory import _impl_list, _int_list, _summarise
from grpo_tui.tools.max_batch import find_max_batch


@pytest.mark.parametrize("capacity", [0, 8, 24, 64, 72, 1000, 4096])
def test_find_max_batch_finds_the_largest_fitting_multiple(capacity):
    calls = []

    def fits(batch):
        calls.append(batch)
        return batch <= capacity

    best, tried = find_max_batch(fits, step=8, start=16, limit=4096)
    assert best == (min(capacity, 4096) // 8) * 8
    assert tried == calls
    assert all(b % 8 == 0 for b in tried)
    # Doubling then bisection: logarithmic in the range, never a linear scan.
    assert len(tried) <= 2 * 10


def test_summarise_reads_phase_peaks_step_time_and_oom(tmp_path):
    recs = [
        {"v": 1, "event": "start", "time": 0},
        {
            "v": 1,
            "step": 1,
            "time": 1,
            "step_time": 9.0,
            "memory": {"gpus": [{"peak_mib": 2048}], "phases": {"generation": 1024, "loss": 3072}},
        },
        {
            "v": 1,
            "step": 2,
            "time": 2,
            "step_time": 2.0,
            "memory": {"gpus": [{"peak_mib": 1024}], "phases": {"generation": 4096, "loss": 512}},
        },
        {"v": 1, "event": "oom", "phase": "scoring", "step": 3, "time": 3},
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 3, "trunc')
    phases, peak, step_s, oom = _summarise(read_records(path))
    assert phases == {"generation": 4.0, "loss": 3.0}
    assert peak == 4.0
    assert step_s == 2.0  # the first (warm-up) step is left out
    assert oom["phase"] == "scoring"


def test_list_arguments_reject_bad_values():
    import argparse

    assert _int_list("8,16") == [8, 16]
    assert _impl_list("chunked,trl") == ["chunked", "trl"]
    for bad in ("8,x", "0", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            _int_list(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="allowed"):
        _impl_list("chunked,fast")


def test_memory_cap_env_is_validated_and_ignored_on_cpu(monkeypatch):
    from grpo_tui.train.phase_memory import MEMORY_CAP_ENV, apply_memory_cap

    monkeypatch.delenv(MEMORY_CAP_ENV, raising=False)
    assert apply_memory_cap("cpu") is None
    monkeypatch.setenv(MEMORY_CAP_ENV, "24")
    assert apply_memory_cap("cpu") is None  # a cap only exists for a CUDA allocator
    for bad in ("lots", "0", "-3"):
        monkeypatch.setenv(MEMORY_CAP_ENV, bad)
        with pytest.raises(ValueError, match="allowed: a positive number of GiB"):
            apply_memory_cap("cpu")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "memory", "no-such-preset"], "no-such-preset: unknown preset"),
        (["max-batch", "tiny-cpu", "--set", "grpo.nope=1"], "grpo.nope: unknown key"),
    ],
)
def test_bad_preset_is_one_line_before_any_trial(argv, message, tmp_path, capsys, monkeypatch):
    from grpo_tui.cli import main
    from grpo_tui.tools import bench_memory, max_batch

    monkeypatch.chdir(tmp_path)
    for module in (bench_memory, max_batch):
        monkeypatch.setattr(module, "run_trial", lambda *a, **k: pytest.fail("a trial ran"))
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def _fake_search(tmp_path, monkeypatch, stop_at=None):
    """max-batch over fake trials: batches up to 48 fit, larger ones run out of memory in the loss phase; the
    search is stopped (KeyboardInterrupt, as a call's time limit would) when it reaches `stop_at`."""
    from grpo_tui.tools import bench_memory, max_batch

    out = tmp_path / "out"
    ran: list[int] = []

    def fake_trial(preset, impl, batch, **kwargs):
        if ran:  # every earlier trial is on disk before the next one starts
            on_disk = json.loads((out / "max-batch.json").read_text())["results"][-1]["trials"]
            assert [t["batch"] for t in on_disk] == ran
        if batch == stop_at:
            raise KeyboardInterrupt
        ran.append(batch)
        ok = batch <= 48
        trial = bench_memory.Trial(
            impl, batch, ok, peak_gib=batch / 4 if ok else None, oom_phase=None if ok else "loss"
        )
        return bench_memory.TrialRun(trial, [])

    monkeypatch.setattr(max_batch, "run_trial", fake_trial)
    argv = ["tiny-cpu", "--impl", "chunked", "--start", "32", "--multiple", "16", "--out", str(out)]
    return out, lambda: max_batch.max_batch_main(argv)


def test_max_batch_says_why_a_trial_failed_and_reports_the_largest_fit(tmp_path, capsys, monkeypatch):
    out, search = _fake_search(tmp_path, monkeypatch)
    assert search() == 0
    (entry,) = json.loads((out / "max-batch.json").read_text())["results"]
    assert entry["max_batch"] == 48 and [t["batch"] for t in entry["trials"]] == [32, 64, 48]
    printed = capsys.readouterr().out
    assert "batch    64: does not fit (peak — GiB): OOM in loss" in printed
    assert "| chunked | 48 |" in (out / "max-batch.md").read_text()


def test_max_batch_cut_short_keeps_the_trials_it_ran(tmp_path, monkeypatch):
    out, search = _fake_search(tmp_path, monkeypatch, stop_at=48)
    with pytest.raises(KeyboardInterrupt):
        search()
    (entry,) = json.loads((out / "max-batch.json").read_text())["results"]
    assert entry["max_batch"] is None and [t["batch"] for t in entry["trials"]] == [32, 64]
    assert "| chunked | searching |" in (out / "max-batch.md").read_text()
