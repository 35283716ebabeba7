"""The kernel benchmark's CLI contract and table, on CPU (the timing itself needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import bench


def _cpu_inputs(batch: int, seq: int, hidden: int, vocab: int, seed: int = 0) -> dict:
    """Tiny fp32 CPU stand-in for `bench.make_inputs` (same signature and dict layout)."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        hidden=torch.randn(batch, seq, hidden, generator=g).requires_grad_(),
        weight=(torch.randn(vocab, hidden, generator=g) * 0.3).requires_grad_(),
        ids=torch.randint(0, vocab, (batch, seq), generator=g), mask=torch.ones(batch, seq, dtype=torch.long),
        adv=torch.randn(batch, generator=g), ref=-torch.rand(batch, seq, generator=g) * 3 - 2,
    )  # fmt: skip


def _loss_and_grads(providers, inp: dict, *, chunk_tokens: int) -> dict:
    """Run each provider's bench closure once: {provider: (loss, grad hidden, grad weight)}."""
    out = {}
    for provider in providers:
        loss = bench.loss_fn(provider, inp, 0.04, chunk_tokens=chunk_tokens)()
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


def test_variant_options_name_providers_and_reject_unknown(capsys):
    assert bench._variant_providers("fast_stats,all,default,direct_dw+lean_host,default") == [
        "chunked+fast_stats", "chunked+all", "chunked#2", "chunked+direct_dw+lean_host", "chunked#3",
    ]  # fmt: skip
    assert bench.main(["--variants", "fast_stats,turbo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("--variants: unknown turbo; allowed:") and "\n" not in err
    assert bench.main(["--liger-reps", "0"]) == 2
    assert capsys.readouterr().err.startswith("--reps/--liger-reps")


def test_variant_providers_run_their_variant_and_agree_on_cpu(monkeypatch):
    # The bench's variant closures switch the chunk loop's flags while they run, then restore them
    from grpo_kernels import functional

    seen = []
    real = functional._chunk_loop
    monkeypatch.setattr(functional, "_chunk_loop", lambda *a, **k: (seen.append(functional.variant_flags()), real(*a, **k))[1])
    inp = _cpu_inputs(2, 5, 16, 40, seed=1)
    providers = ["naive", "chunked", *bench._variant_providers("fast_stats,direct_dw,lean_host,all,default")]
    out = _loss_and_grads(providers, inp, chunk_tokens=3)
    assert seen == [frozenset(), frozenset({"fast_stats"}), frozenset({"direct_dw"}), frozenset({"lean_host"}),
                    frozenset(functional.VARIANT_FLAGS), frozenset()]  # fmt: skip
    assert functional.VARIANT is None
    for provider in out:
        for a, b in zip(out[provider], out["naive"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_main_end_to_end_with_variants_on_cpu(monkeypatch, tmp_path, capsys):
    # The whole CLI flow (records, checks of every variant against naive, JSON, table last) on tiny CPU
    # inputs; only the CUDA-specific pieces are replaced: input placement and the event-timed measure
    import json

    calls = []

    def cpu_measure(step, inp, reps, warmup=2):
        calls.append(reps)
        out = step()
        if isinstance(out, torch.Tensor):
            out.backward()
        return 1.0 + len(calls), 0.0, 0.0

    monkeypatch.setattr(bench, "make_inputs", _cpu_inputs)
    monkeypatch.setattr(bench, "measure", cpu_measure)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu-test")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    out = tmp_path / "k.json"
    argv = ["--batch", "1,2", "--seq", "4", "--hidden", "8", "--vocab", "30", "--chunk-tokens", "3",
            "--providers", "floor,naive,chunked,liger", "--variants", "fast_stats,all,default", "--reps", "3",
            "--liger-reps", "1", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    res = json.loads(out.read_text())
    provs = ["floor", "naive", "chunked", "liger", "chunked+fast_stats", "chunked+all", "chunked#2"]
    assert [r["provider"] for r in res["records"]] == provs * 2
    assert res["variants"] == {"chunked+fast_stats": "fast_stats", "chunked+all": "all", "chunked#2": "default (repeat)"}
    assert res["reps"] == {"default": 3, "liger": 1}
    for chk in res["checks"]:
        for p in ("chunked", "chunked-lean", "chunked+fast_stats", "chunked+all"):
            assert chk[p]["grad_weight_cos"] > 0.99999 and chk[p]["loss_rel_err"] < 1e-5, (p, chk[p])
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-4].startswith("| batch (tokens) | floor | naive | chunked | liger | chunked+fast_stats |")
    assert printed[-1].startswith("| 2 (8) |")
