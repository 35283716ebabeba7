"""grpo_kernels.token_choice: the decoder's token choice in one pass, under the Triton interpreter.

Blocks and slices are shrunk (16-column quarters, 4 slices), so small vocabularies cross several loop steps and
slices per row. The argmax and the log-probs are checked against torch; the draws against softmax's
probabilities (a chi-square over hundreds of rows, one fixed seed: the test is deterministic; tests/gpu run the
same check over many more).
"""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import token_choice as tc
from grpo_kernels import triton_ops


@pytest.fixture
def kernel(triton_kernel, monkeypatch):
    monkeypatch.setattr(tc, "QUARTER", 16)
    monkeypatch.setattr(tc, "SPLITS", 4)


def seed_step(seed: int = 5, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([seed]), torch.tensor([step])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("greedy", [True, False])
def test_the_log_prob_is_log_softmax_at_the_token_and_greedy_is_the_argmax(kernel, dtype, greedy) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 301, generator=generator) * 4).to(dtype)  # 301: no whole number of blocks or slices
    logits[2, 7] = logits[2, 250] = logits[2].max() + 1  # a tie across slices: the first column wins
    logits[3, :100] = float("-inf")  # masked columns (a whole slice of them)
    token, logp = tc.choose_tokens(logits, *seed_step(), temperature=0.7, greedy=greedy)
    expected = torch.log_softmax(logits.float() / 0.7, -1).gather(1, token[:, None])[:, 0]
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    assert token.dtype == torch.long and (token[3] >= 100).item()
    if greedy:
        assert token.tolist() == logits.float().argmax(-1).tolist() and token[2].item() == 7


def test_draws_follow_softmax_and_the_seed_and_step_decide_them(kernel, monkeypatch) -> None:
    # Every row the same logits over 6 tokens (one masked): the share of each token over 800 draws (one slice a
    # row: the interpreter runs a program in milliseconds)
    monkeypatch.setattr(tc, "SPLITS", 1)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, float("-inf"), 0.5]]).repeat(800, 1)
    token, logp = tc.choose_tokens(logits, *seed_step(11), temperature=1.0)
    probs = torch.softmax(logits[0], -1)
    counts = torch.bincount(token, minlength=6).double()
    assert counts[4] == 0  # -inf is never drawn
    live = probs > 0
    expected = probs[live].double() * len(token)
    chi2 = ((counts[live] - expected) ** 2 / expected).sum().item()
    assert chi2 < 23.5, chi2  # df 4: p = 1e-4
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(1, token[:, None])[:, 0])
    few = logits[:64]
    again = tc.choose_tokens(few, *seed_step(11), temperature=1.0)[0]
    assert again.tolist() == token[:64].tolist()  # the same seed and step: the same draws
    for seed, step in ((11, 1), (12, 0)):  # another step or seed: other draws
        assert tc.choose_tokens(few, *seed_step(seed, step), temperature=1.0)[0].tolist() != again.tolist()


def test_a_temperature_sharpens_the_draws(kernel, monkeypatch) -> None:
    monkeypatch.setattr(tc, "SPLITS", 1)
    logits = torch.tensor([[0.0, 1.0, 2.0]]).repeat(200, 1)
    hot = tc.choose_tokens(logits, *seed_step(), temperature=4.0)[0]
    cold = tc.choose_tokens(logits, *seed_step(), temperature=0.25)[0]
    # p(2) at T = 0.25: 0.9817; at T = 4: 0.4223
    assert (cold == 2).float().mean() > 0.9 and 0.3 < (hot == 2).float().mean() < 0.55


def test_bad_inputs_are_one_line_errors(monkeypatch) -> None:
    monkeypatch.setattr(triton_ops, "FORCE_BACKEND", "torch")
    with pytest.raises(ValueError, match=r"choose_tokens: \[R, V\] logits .* on a device the kernel runs on") as error:
        tc.choose_tokens(torch.zeros(2, 8), *seed_step())
    assert "\n" not in str(error.value)
    monkeypatch.setattr(triton_ops, "FORCE_BACKEND", "triton")
    if triton_ops.HAS_TRITON and triton_ops.INTERPRET:
        with pytest.raises(ValueError, match="temperature must be > 0, got 0.0"):
            tc.choose_tokens(torch.zeros(2, 8), *seed_step(), temperature=0.0)
