"""The fused forward on CUDA: the captured (and compiled) decode step on the fused decode copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# tests/ is on sys.path (its conftest.py, pytest's prepend import mode)
from test_decode_model import on_copy
from test_generation import EOS, MAX_NEW, PAD, PROMPTS, reference
from test_generation_gpu import BF16_FIRST_TOKENS, BF16_ROWS_AGREEING, graph_decode, load, many_prompts

from grpo_tui.train.decode_model import PLAIN_OPS, compiled_ops, fused_model
from grpo_tui.train.generation import Sampling, StaticDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_fused_graph_is_generate_in_fp32_and_follows_the_refresh(tiny_model_path: Path, compiled: bool) -> None:
    model = load(tiny_model_path, torch.float32)
    copy, decoded = on_copy(model)
    assert fused_model(decoded) is not None
    decoder = StaticDecoder(use_graph=True, compiled=compiled)
    before = graph_decode(decoder, decoded, PROMPTS, [1])
    assert before == reference(model, PROMPTS, [1], do_sample=False)
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():  # an optimizer step's worth of change; the copy is refreshed as each rollout does
        for p in model.parameters():
            p.add_(torch.randn(p.shape, device="cuda", generator=generator) * 0.05)
    copy.refresh(model)
    after = graph_decode(decoder, decoded, PROMPTS, [1])
    assert after == reference(model, PROMPTS, [1], do_sample=False) and after != before
    assert decoder.captures == 1 and decoder.compiled == compiled  # replayed on the refreshed copy


def test_fused_graph_in_bf16_is_its_eager_twin_and_agrees_with_generate(tiny_model_path: Path) -> None:
    model = load(tiny_model_path, torch.bfloat16)
    _, decoded = on_copy(model)
    prompts = many_prompts(64, model.config.vocab_size)
    got = graph_decode(StaticDecoder(use_graph=True), decoded, prompts, [1])
    assert got == graph_decode(StaticDecoder(use_graph=False), decoded, prompts, [1])
    expected = reference(model, prompts, [1], do_sample=False)
    k = BF16_FIRST_TOKENS
    assert sum(a[:k] == b[:k] for a, b in zip(got, expected, strict=True)) / len(prompts) >= BF16_ROWS_AGREEING


def test_fused_graph_samples_what_its_eager_twin_samples(tiny_model_path: Path) -> None:
    model = load(tiny_model_path, torch.float32)
    _, decoded = on_copy(model)
    prompts = many_prompts(16, model.config.vocab_size, seed=1)
    sampling = Sampling(temperature=0.8, top_k=30, top_p=0.95)

    def sampled(decoder: StaticDecoder) -> list[list[int]]:
        with torch.no_grad():
            decoder.generate(decoded, prompts, MAX_NEW, EOS, PAD, sampling)  # fits (and captures) the bucket
            torch.manual_seed(7)
            return decoder.generate(decoded, prompts, MAX_NEW, EOS, PAD, sampling).ids

    got = sampled(StaticDecoder(use_graph=True))
    assert got == sampled(StaticDecoder(use_graph=False))
    assert len({tuple(row) for row in got}) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_prefill_ops_are_the_plain_ones(dtype: torch.dtype) -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=generator).to(dtype)

    compiled = compiled_ops()
    for rows, columns in [(16, 64), (128, 7)]:  # two shapes: one compile serves both
        hidden, heads, weight = rand(rows, columns, 1024), rand(rows, 16, columns, 128), rand(1024)
        cos, sin = rand(rows, 1, columns, 128), rand(rows, 1, columns, 128)
        cases = [
            ("rms_norm", (hidden, weight, 1e-6)),
            ("rope", (heads, cos, sin)),
            ("silu_mul", (hidden,)),
        ]
        for name, args in cases:
            got, plain = getattr(compiled, name)(*args), getattr(PLAIN_OPS, name)(*args)
            if dtype == torch.float32:
                torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-5)
                continue
            # bf16: torch rounds after each op, the compiled kernel may round only at its end, so the two differ
            # by rounding; against the same arithmetic in fp32 the compiled result is within torch's own error
            exact = getattr(PLAIN_OPS, name)(*(a.float() if isinstance(a, torch.Tensor) else a for a in args))
            assert (got.float() - exact).abs().max() <= 2 * (plain.float() - exact).abs().max(), name


def test_packed_prefill_in_bf16_is_as_close_to_fp32_as_the_padded_one(tiny_model_path: Path) -> None:
    # bf16 on CUDA: the packed prefill runs torch's variable-length flash attention, the padded one sdpa over a
    # mask; against the same prompts in fp32 the packed logits and cache are within the padded path's own error
    from test_decode_model import both_prefills

    prompts = many_prompts(64, load(tiny_model_path, torch.float32).config.vocab_size, seed=4)
    exact = both_prefills(on_copy(load(tiny_model_path, torch.float32))[1], prompts)
    half = both_prefills(on_copy(load(tiny_model_path, torch.bfloat16))[1], prompts)
    mask = exact[2]
    valid = mask[None, :, None, :, None].expand_as(exact[0][1])
    for part, name in ((0, "logits"), (1, "cache")):
        reference = exact[0][part] if part == 0 else exact[0][part][valid]
        packed, padded = (half[i][part] if part == 0 else half[i][part][valid] for i in (0, 1))
        packed_error = (packed.float() - reference).abs().max()
        padded_error = (padded.float() - reference).abs().max()
        assert packed_error <= 2 * padded_error + 1e-3, (name, packed_error, padded_error)
