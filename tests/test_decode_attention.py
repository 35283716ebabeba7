"""The decoder's folded grouped-query attention against the unfolded one (every query head on its repeated KV head)."""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load_benchmark
from hypothesis import given, settings
from hypothesis import strategies as st
from test_generation import EOS, PROMPTS, decode, reference  # tests/ is on sys.path (pytest prepend import mode)

from grpo_tui.train.decode_attention import (
    DECODE_ATTENTION,
    attention_context,
    folded_attention,
    folded_heads,
    sdpa_backend_list,
)
from grpo_tui.train.generation import Sampling, StaticDecoder


def unfolded(query, key, value, mask, scaling):
    group = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)  # repeat_kv's order
    scores = query @ key.transpose(-1, -2) * scaling
    scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return (scores.softmax(-1) @ value).transpose(1, 2)


@pytest.mark.parametrize("length", [1, 5])  # a decode step, a prefill
@pytest.mark.parametrize("additive", [False, True])
def test_folded_matches_unfolded(length: int, additive: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    rows, heads, kv_heads, keys, dim = 3, 8, 2, 11, 16
    query = torch.randn(rows, heads, length, dim, generator=generator, dtype=torch.float64)
    key = torch.randn(rows, kv_heads, keys, dim, generator=generator, dtype=torch.float64)
    value = torch.randn(rows, kv_heads, keys, dim, generator=generator, dtype=torch.float64)
    mask = torch.rand(rows, 1, length, keys, generator=generator) > 0.4
    mask[..., 0] = True  # no fully masked row
    given = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, torch.finfo(torch.float64).min)
    out, weights = folded_attention(None, query, key, value, given if additive else mask, scaling=dim**-0.5)
    assert weights is None and out.shape == (rows, length, heads, dim)
    torch.testing.assert_close(out, unfolded(query, key, value, given if additive else mask, dim**-0.5))


def test_a_per_head_mask_is_refused() -> None:
    q, kv = torch.zeros(1, 4, 1, 8), torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="shared by the heads"):
        folded_attention(None, q, kv, kv, torch.ones(1, 4, 1, 3, dtype=torch.bool))


def test_folded_heads_sets_and_always_restores_the_implementation(tiny_model_path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa")
    with pytest.raises(RuntimeError), folded_heads(model):
        assert model.config._attn_implementation == DECODE_ATTENTION
        raise RuntimeError("a failed rollout")
    assert model.config._attn_implementation == "sdpa"


@pytest.fixture
def kernel_calls(monkeypatch) -> list[tuple]:
    """The query shapes grpo_kernels.decode_attention was called with (it still runs)."""
    from grpo_kernels import decode_attention as da

    calls, original = [], da.decode_attention

    def spy(query, *args, **kwargs):
        calls.append(tuple(query.shape))
        return original(query, *args, **kwargs)

    monkeypatch.setattr(da, "decode_attention", spy)
    return calls


def test_triton_is_accepted_beside_the_sdpa_names_and_unknown_names_are_refused() -> None:
    from torch.nn.attention import SDPBackend

    assert sdpa_backend_list(("triton",)) == []
    assert sdpa_backend_list(("math", "triton")) == [SDPBackend.MATH]
    with pytest.raises(ValueError, match="sdpa backend: got fastest; allowed: cudnn, flash, efficient, math, triton"):
        attention_context(("triton", "fastest"))
    with pytest.raises(ValueError) as error:
        StaticDecoder(use_graph=False, sdpa_backends=("Triton",))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("additive", [False, True])
def test_the_triton_switch_sends_decode_steps_to_the_kernel(triton_kernel, kernel_calls, additive: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    rows, heads, kv_heads, keys, dim = 3, 8, 2, 70, 16
    query = torch.randn(rows, 1, heads, dim, generator=generator).transpose(1, 2)  # as transformers hands it
    key, value = (torch.randn(rows, kv_heads, keys, dim, generator=generator) for _ in range(2))
    index = torch.arange(keys)
    mask = ((index >= torch.tensor([0, 9, 30])[:, None]) & (index < 50))[:, None, None]  # [R, 1, 1, L]
    if additive:  # eager attention's mask stays on sdpa
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    expected, _ = folded_attention(None, query, key, value, mask, scaling=dim**-0.5)
    with attention_context(("triton",)):
        got, weights = folded_attention(None, query, key, value, mask, scaling=dim**-0.5)
    assert weights is None and got.shape == (rows, 1, heads, dim)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert kernel_calls == ([] if additive else [(rows, heads, 1, dim)])
    folded_attention(None, query, key, value, mask, scaling=dim**-0.5)  # the switch is off again after the block
    assert len(kernel_calls) == (0 if additive else 1)


def test_prefill_stays_on_sdpa_with_the_switch_on(kernel_calls) -> None:
    query, key = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    with attention_context(("triton",)):
        got, _ = folded_attention(None, query, key, key, mask, scaling=0.25)
    torch.testing.assert_close(got, unfolded(query, key, key, mask, 0.25))
    assert kernel_calls == []


def test_the_eager_twin_with_the_kernel_matches_generate(tiny_model_path, triton_kernel, kernel_calls) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    expected = reference(model, PROMPTS, EOS, do_sample=False)
    assert (
        decode(StaticDecoder(use_graph=False, sdpa_backends=("triton",)), model, EOS, Sampling(greedy=True)) == expected
    )
    assert kernel_calls and all(shape[2] == 1 for shape in kernel_calls)  # the decode steps ran the kernel


def test_the_graph_decoder_uses_the_kernel_by_default_where_triton_is_installed(tiny_model_path, kernel_calls) -> None:
    # The trainer's graph backend builds StaticDecoder without naming kernels: decode steps go to
    # grpo_kernels.decode_attention (its torch twin on CPU tensors), and the completions still equal generate's.
    import importlib.util

    from transformers import AutoModelForCausalLM

    from grpo_tui.train.decode_attention import DEFAULT_DECODE_ATTENTION

    held = ("efficient", "math")  # sdpa off cuDNN, which plans again for each new cache length
    assert DEFAULT_DECODE_ATTENTION == (("triton", *held) if importlib.util.find_spec("triton") else held)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    expected = reference(model, PROMPTS, EOS, do_sample=False)
    assert decode(StaticDecoder(use_graph=False), model, EOS, Sampling(greedy=True)) == expected
    assert bool(kernel_calls) == bool(DEFAULT_DECODE_ATTENTION)
    calls = len(kernel_calls)
    decode(StaticDecoder(use_graph=False, sdpa_backends=()), model, EOS, Sampling(greedy=True))  # sdpa only
    assert len(kernel_calls) == calls


def _decode_bench():
    return load_benchmark("decode_attention_bench")


def test_decode_attention_bench_smoke_on_cpu(tmp_path, capsys) -> None:
    import json

    bench = _decode_bench()
    assert bench.main(["--device", "cpu", "--shapes", "3x96x40", "--out", str(tmp_path)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    summary = json.loads(line)
    assert (summary["rows"], summary["length"], summary["filled"]) == (3, 96, 40)
    assert summary["best"]["err"] < 1e-5 and summary["default_us"] == summary["best"]["us"] > 0
    saved = json.loads((tmp_path / "decode-attention.json").read_text())
    assert saved["shapes"] == [summary] and len(saved["timings"]) == 1


def test_decode_attention_bench_grid_option(tmp_path, capsys) -> None:
    bench = _decode_bench()
    assert bench.parse_grid("block=32,64;stages=2")["block"] == (32, 64)
    assert bench.parse_grid("block=32,64;stages=2")["stages"] == (2,)
    assert bench.parse_grid("")["stages"] == bench.GRID["stages"]
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--device", "cpu", "--grid", "blocks=32", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "--grid: got 'blocks=32'; allowed: NAME=INT[,INT...] with NAME in block, stages" in capsys.readouterr().err


@pytest.mark.parametrize("shapes", ["128x512", "128x512x512", "0x512x300", "axbxc"])
def test_decode_attention_bench_refuses_bad_shapes(tmp_path, capsys, shapes: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _decode_bench().main(["--device", "cpu", "--shapes", shapes, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert f"--shapes: got {shapes!r}; allowed: ROWSxLENGTHxFILLED" in capsys.readouterr().err


def test_a_head_size_the_kernel_does_not_cover_stays_on_sdpa(kernel_calls) -> None:
    # The kernel is the decoder's default: a model with head size 24 (not a power of two) must still decode
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(2, 4, 1, 24, generator=generator)
    key, value = (torch.randn(2, 2, 9, 24, generator=generator) for _ in range(2))
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[0, ..., :3] = False
    with attention_context(("triton",)):
        got, _ = folded_attention(None, query, key, value, mask, scaling=24**-0.5)
    torch.testing.assert_close(got, unfolded(query, key, value, mask, 24**-0.5))
    assert kernel_calls == []


def test_a_failing_kernel_falls_back_to_sdpa_for_good(tiny_model_path, monkeypatch) -> None:
    # The kernel is the default on every CUDA GPU; one it cannot run on must not end the training run
    from transformers import AutoModelForCausalLM

    from grpo_kernels import decode_attention as da

    calls = []

    def broken(query, *args, **kwargs):
        calls.append(tuple(query.shape))
        raise RuntimeError("PassManager::run failed\nlong compiler output")

    monkeypatch.setattr(da, "decode_attention", broken)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    expected = reference(model, PROMPTS, EOS, do_sample=False)
    reasons: list[str] = []
    decoder = StaticDecoder(use_graph=False, sdpa_backends=("triton",), on_kernel_failure=reasons.append)
    assert decode(decoder, model, EOS, Sampling(greedy=True)) == expected
    assert reasons == ["decode attention kernel failed (RuntimeError: PassManager::run failed)"]
    tried = len(calls)
    assert tried >= 1 and decoder._sdpa == ()
    assert decode(decoder, model, EOS, Sampling(greedy=True)) == expected  # later rollouts: sdpa, no retry
    assert len(calls) == tried and len(reasons) == 1


def test_out_of_memory_in_the_kernel_is_not_hidden(tiny_model_path, monkeypatch) -> None:
    from transformers import AutoModelForCausalLM

    from grpo_kernels import decode_attention as da

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(da, "decode_attention", oom)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32, attn_implementation="sdpa")
    decoder = StaticDecoder(use_graph=False, sdpa_backends=("triton",), on_kernel_failure=pytest.fail)
    with pytest.raises(torch.OutOfMemoryError):
        decode(decoder, model, EOS, Sampling(greedy=True))
    assert decoder._sdpa == ("triton",)


def test_rollouts_say_the_kernel_fallback_in_one_line_and_an_event(capsys) -> None:
    from types import SimpleNamespace

    from grpo_tui.train.rollouts import Rollouts

    events = []
    rollouts = Rollouts.__new__(Rollouts)  # only the reporting half: no trainer is built
    rollouts.trainer = SimpleNamespace(
        accelerator=SimpleNamespace(is_main_process=True), state=SimpleNamespace(global_step=6)
    )
    rollouts._on_event = lambda name, **fields: events.append((name, fields))
    rollouts._kernel_failed("decode attention kernel failed (RuntimeError: x)")
    out = capsys.readouterr().out
    assert out == "grpo-tui: graph decoding with sdpa attention: decode attention kernel failed (RuntimeError: x)\n"
    assert events == [
        (
            "generation_fallback",
            {
                "requested": "graph (decode kernel)",
                "used": "graph (sdpa attention)",
                "reason": "decode attention kernel failed (RuntimeError: x)",
                "step": 7,  # the rollout of the step being trained
            },
        )
    ]


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40) | st.sampled_from(["2\u00b2x512x3", "block=\u00b9", "128x512x30\u0660"]))
def test_decode_attention_bench_options_any_text_parses_or_is_one_line(text: str) -> None:
    # --shapes and --grid take any string: a parse, or one line naming what is allowed, never a traceback
    bench = _decode_bench()
    for parse, flag in ((bench.parse_shapes, "--shapes"), (bench.parse_grid, "--grid")):
        try:
            parse(text)
        except ValueError as error:
            message = str(error)
            assert (
                message.startswith(f"{flag}: got ") and "allowed:" in message and "\n" not in message.replace(text, "")
            )


def test_training_attention_holds_the_named_kernels_with_math_as_the_last_resort() -> None:
    from grpo_tui.train.decode_attention import training_attention

    b = torch.backends.cuda

    def flags() -> tuple[bool, ...]:
        return b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()

    before = flags()
    with training_attention(()):  # none named: torch's choice, untouched
        assert flags() == before
    with training_attention(("flash",)):
        assert flags() == (False, True, False, True)
    with training_attention(("cudnn", "math")):
        assert flags() == (True, False, False, True)
    assert flags() == before
    with pytest.raises(ValueError, match="sdpa backend: got fastest; allowed: cudnn, flash, efficient, math"):
        training_attention(("fastest",))
