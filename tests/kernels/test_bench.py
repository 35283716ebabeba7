"""The kernel benchmark's CLI contract and table, on CPU (the timing itself needs CUDA)."""

from __future__ import annotations

import json

import pytest
import torch
from benchmark_scripts import load_benchmark  # tests/ is on sys.path (its conftest.py)

bench = load_benchmark("kernel/bench")
bench_padded = load_benchmark("kernel/bench_padded")
bench_providers = load_benchmark("kernel/bench_providers")
timing = load_benchmark("kernel/timing")


def _cpu_inputs(batch: int, seq: int, hidden: int, vocab: int, seed: int = 0, device: str = "cpu") -> dict:
    """Tiny fp32 CPU stand-in for `bench_providers.make_inputs` (same signature and dict layout; always CPU)."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden=torch.randn(batch, seq, hidden, generator=g).requires_grad_(),
        weight=(torch.randn(vocab, hidden, generator=g) * 0.3).requires_grad_(),
        ids=torch.randint(0, vocab, (batch, seq), generator=g),
        mask=torch.ones(batch, seq, dtype=torch.long),
        adv=torch.randn(batch, generator=g),
        ref=-torch.rand(batch, seq, generator=g) * 3 - 2,
    )


def _loss_and_grads(providers, inp: dict, *, chunk_tokens: int) -> dict:
    """Run each provider's bench closure once: {provider: (loss, grad hidden, grad weight)}."""
    out = {}
    for provider in providers:
        loss = bench_providers.loss_fn(provider, inp, 0.04, chunk_tokens=chunk_tokens)()
        loss.backward()
        out[provider] = (loss.detach(), inp["hidden"].grad.clone(), inp["weight"].grad.clone())
        inp["hidden"].grad = inp["weight"].grad = None
    return out


def test_bad_options_give_one_line_errors(capsys):
    assert bench.main(["--providers", "floor,fast"]) == 2
    assert "--providers: unknown fast" in capsys.readouterr().err
    assert bench.main(["--batch", "8,x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("--batch:") and "\n" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without CUDA")
def test_without_cuda_says_so(capsys):
    assert bench.main(["--batch", "8"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_table_has_ratios_to_floor_and_trl():
    recs = [
        {"provider": "floor", "batch": 8, "tokens": 4096, "ms": 5.0, "extra_peak_mib": 1500.0},
        {"provider": "trl", "batch": 8, "tokens": 4096, "ms": 9.0, "extra_peak_mib": 1170.0},
        {"provider": "liger", "batch": 8, "tokens": 4096, "ms": None, "extra_peak_mib": None, "error": "OOM"},
        {"provider": "chunked", "batch": 8, "tokens": 4096, "ms": 6.0, "extra_peak_mib": 1000.0},
    ]
    lines = bench.table(recs).splitlines()
    assert lines[0] == "| batch (tokens) | floor | trl | liger | chunked |"
    assert "| 8 (4,096) |" in lines[2] and "OOM" in lines[2]
    assert "6.0 ms / 1,000 MiB (1.20x floor, 1.50x faster than trl)" in lines[2]


def test_providers_agree_on_cpu():
    # What is timed is what is tested: the bench's closures for naive, trl and ours give one loss and gradient
    inp = _cpu_inputs(2, 6, 16, 50, seed=0)
    out = _loss_and_grads(("naive", "trl", "chunked", "chunked-lean"), inp, chunk_tokens=4)
    for provider in ("trl", "chunked", "chunked-lean"):
        for a, b in zip(out[provider], out["naive"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _cpu_run(monkeypatch, argv: list[str]) -> tuple[int, list[int]]:
    """bench.main on tiny CPU inputs: only the CUDA-specific pieces are replaced (input placement, timing)."""
    calls: list[int] = []

    def cpu_measure(step, inp, reps, warmup=2):
        calls.append(reps)
        out = step()
        if isinstance(out, torch.Tensor):
            out.backward()
        return 1.0 + len(calls), 0.0, 0.0, timing.state_summary([(1500.0, 690.04), None, (1700.0, 699.0)])

    monkeypatch.setattr(bench, "make_inputs", _cpu_inputs)
    monkeypatch.setattr(bench_providers, "make_inputs", _cpu_inputs)  # the padded mode's source
    monkeypatch.setattr(timing, "measure", cpu_measure)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu-test")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return bench.main(argv), calls


def test_main_end_to_end_on_cpu(monkeypatch, tmp_path, capsys):
    # The whole CLI flow (records, checks against naive, JSON, table last) on tiny CPU inputs
    out = tmp_path / "k.json"
    argv = [
        "--batch",
        "1,2",
        "--seq",
        "4",
        "--hidden",
        "8",
        "--vocab",
        "30",
        "--chunk-tokens",
        "3",
        "--providers",
        "floor,naive,chunked,trl",
        "--reps",
        "3",
        "--out",
        str(out),
    ]
    rc, calls = _cpu_run(monkeypatch, argv)
    assert rc == 0 and calls == [3] * 8
    res = json.loads(out.read_text())
    assert [r["provider"] for r in res["records"]] == ["floor", "naive", "chunked", "trl"] * 2
    assert res["reps"] == {"default": 3, "liger": 3} and res["gpu"] == "cpu-test"
    # Each record says under which clock and power its time was taken (medians of the reads that answered)
    assert all(r["sm_mhz"] == 1600.0 and r["power_w"] == 694.5 for r in res["records"])
    for chk in res["checks"]:
        for p in ("chunked", "chunked-lean"):
            assert chk[p]["grad_weight_cos"] > 0.99999 and chk[p]["loss_rel_err"] < 1e-5, (p, chk[p])
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-4].startswith("| batch (tokens) | floor | naive | chunked | trl |")
    assert printed[-1].startswith("| 2 (8) |")


def test_draw_lengths_sum_exactly_with_the_asked_padding():
    for pct in (0, 25, 50, 75):
        lengths = bench_padded.draw_lengths(4096, 512, 512 * (1 - pct / 100), seed=3)
        assert sum(lengths) == 4096 and all(1 <= n <= 512 for n in lengths)
        padding = 1 - 4096 / (len(lengths) * 512)
        assert abs(padding - pct / 100) < 0.03, (pct, padding)
        assert lengths == bench_padded.draw_lengths(4096, 512, 512 * (1 - pct / 100), seed=3)  # fixed seed
    assert len(set(bench_padded.draw_lengths(4096, 512, 256, seed=0))) > 10  # spread, not one length
    assert bench_padded.draw_lengths(1024, 512, 512) == [512, 512]
    assert bench_padded.draw_lengths(5, 512, 300) == [5]
    pooled = bench_padded.draw_lengths(1000, 64, 30, seed=1, pool=[20, 40, 100])
    assert sum(pooled) == 1000 and max(pooled) <= 64


def test_lengths_from_a_list_or_a_metrics_stream(tmp_path):
    lst = tmp_path / "lengths.json"
    lst.write_text("[100, 200, 300]")
    assert bench_padded.lengths_from_file(str(lst)) == (200.0, [100, 200, 300])
    stream = tmp_path / "metrics.jsonl"
    stream.write_text(
        '{"event": "start"}\n{"step": 1, "completions/mean_length": 150.0}\n\n{"step": 2, "completion_length": 250}\n'
    )
    assert bench_padded.lengths_from_file(str(stream)) == (200.0, None)
    lst.write_text('{"a": 1}')
    with pytest.raises(ValueError, match="JSON list of positive ints"):
        bench_padded.lengths_from_file(str(lst))


def test_padded_options_give_one_line_errors(capsys):
    assert bench.main(["--padding", "0,100"]) == 2
    assert capsys.readouterr().err.startswith("--padding: expected comma-separated percentages in [0, 100)")
    assert bench.main(["--padding", "25", "--providers", "liger"]) == 2
    assert "--providers: unknown liger; allowed: floor, trl" in capsys.readouterr().err
    assert bench.main(["--padding", "25", "--valid-tokens", "0"]) == 2
    assert capsys.readouterr().err.startswith("--valid-tokens:")
    assert bench.main(["--padding", "25", "--scoring-chunks", "512"]) == 2
    assert capsys.readouterr().err.startswith("--scoring-chunks: needs --scoring")
    assert bench.main(["--padding", "25", "--scoring", "--scoring-chunks", "0"]) == 2
    assert capsys.readouterr().err.startswith("--scoring-chunks: expected")


def test_padded_providers_agree_on_cpu():
    # trl (valid rows only, labels -100), ours and naive give one loss and gradient on a padded batch, and
    # one set of scores at the valid positions
    lengths = [6, 2, 0, 4]
    inp = _cpu_inputs(4, 6, 16, 50, seed=2)
    inp["mask"] = bench_padded.right_padding_mask(lengths, 6)
    out = _loss_and_grads(("naive", "trl", "chunked", "chunked-lean"), inp, chunk_tokens=4)
    for provider in ("trl", "chunked", "chunked-lean"):
        for a, b in zip(out[provider], out["naive"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    valid = inp["mask"] != 0
    scores = {p: bench_providers.score_fn(p, inp, chunk_tokens=4)() for p in ("naive", "trl", "chunked")}
    for p in ("trl", "chunked"):
        for a, b in zip(scores[p], scores["naive"]):
            torch.testing.assert_close(a[valid], b[valid], rtol=1e-5, atol=1e-5)
            assert (a[~valid] == 0).all()
    assert bench_providers.score_fn("floor", inp)() is None


def test_padded_mode_end_to_end_on_cpu(monkeypatch, tmp_path, capsys):
    lengths_file = tmp_path / "lengths.json"
    lengths_file.write_text("[3, 5, 8, 1]")
    out = tmp_path / "p.json"
    argv = [
        "--padding",
        "0,50",
        "--valid-tokens",
        "16,24",
        "--lengths",
        str(lengths_file),
        "--scoring",
        "--scoring-chunks",
        "3,7",
        "--seq",
        "8",
        "--hidden",
        "8",
        "--vocab",
        "30",
        "--chunk-tokens",
        "5",
        "--reps",
        "2",
        "--out",
        str(out),
    ]
    rc, calls = _cpu_run(monkeypatch, argv)
    assert rc == 0
    res = json.loads(out.read_text())
    recs = res["records"]
    # 2 sizes x (0%, 50%, real) x (5 loss + 4 scoring providers + ours' scoring at 2 more chunk sizes)
    assert len(recs) == len(calls) == 2 * 3 * 11
    assert {(r["valid_tokens"], r["padding"]) for r in recs} == {
        (n, p) for n in (16, 24) for p in ("0%", "50%", "real")
    }
    by = {(r["mode"], r["valid_tokens"], r["padding"], r["provider"]): r for r in recs}
    assert by[("loss", 16, "0%", "floor")]["batch"] == 2 and by[("loss", 16, "0%", "floor")]["padding_frac"] == 0
    assert by[("loss", 24, "50%", "trl")]["padding_frac"] == pytest.approx(0.5, abs=0.1)
    assert ("scoring", 16, "0%", "chunked-lean") not in by
    assert ("scoring", 24, "real", "chunked-c7") in by and ("loss", 24, "real", "chunked-c7") not in by
    assert all(r["ms"] is not None for r in recs), [r for r in recs if r["ms"] is None]
    for chk in res["checks"]:
        assert chk["chunked"]["grad_hidden_cos"] > 0.99999 and chk["chunked"]["loss_rel_err"] < 1e-5, chk
    assert res["lengths"]["file"] == str(lengths_file)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-14].startswith("| mode | valid tokens | padding (B x T) | floor | trl | chunked |")
    assert printed[-12].startswith("| loss | 16 | 0% (0.0% of 2 x 8) | ")
    assert printed[-1].startswith("| scoring | 24 | real lengths (")


def test_padded_table_formats_cells_as_the_plain_one():
    shape = {"mode": "loss", "valid_tokens": 4096, "padding": "25%", "padding_frac": 0.25, "batch": 8, "seq": 683}
    recs = [
        {**shape, "provider": "floor", "ms": 5.0, "extra_peak_mib": 1500.0},
        {**shape, "provider": "trl", "ms": 9.0, "extra_peak_mib": 1170.0},
        {**shape, "provider": "naive", "ms": None, "extra_peak_mib": None, "error": "OOM"},
        {**shape, "provider": "chunked", "ms": 6.0, "extra_peak_mib": 1000.0},
    ]
    row = bench_padded.table(recs).splitlines()[2]
    assert row.startswith("| loss | 4,096 | 25% (25.0% of 8 x 683) | 5.0 ms / 1,500 MiB |")
    assert "| OOM |" in row and row.endswith("| 6.0 ms / 1,000 MiB (1.20x floor, 1.50x faster than trl) |")
    assert timing.cell("chunked", recs[3], 5.0, 9.0) == "6.0 ms / 1,000 MiB (1.20x floor, 1.50x faster than trl)"


def test_state_summary_takes_medians_of_the_reads_that_answered():
    assert timing.state_summary([(1500.0, 690.0), (1400.0, 700.0), (1900.0, 650.04)]) == {
        "sm_mhz": 1500.0,
        "power_w": 690.0,
    }
    assert timing.state_summary([None, (1800.0, 512.345)]) == {"sm_mhz": 1800.0, "power_w": 512.3}
    assert timing.state_summary([None, None]) == {} and timing.state_summary([]) == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer where no GPU is there to read")
def test_gpu_state_is_none_without_a_gpu():
    # The bench's timing must not depend on NVML: without a GPU (or NVML) the read is None, not an error
    assert timing.gpu_state() is None
