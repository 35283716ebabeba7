"""grpo_kernels.token_choice compiled on CUDA: Qwen3's vocabulary in bf16 and draws against softmax over many rows
(the captured decode step drawing what its eager twin draws: tests/gpu/test_generation_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from grpo_kernels.token_choice import choose_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("greedy", [True, False])
def test_qwen3_vocabulary_in_bf16(greedy: bool) -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(128, 151936, device="cuda", generator=generator) * 3).bfloat16()
    seed, step = torch.tensor([9], device="cuda"), torch.tensor([3], device="cuda")
    token, logp = choose_tokens(logits, seed, step, temperature=0.8, greedy=greedy)
    expected = torch.log_softmax(logits.float() / 0.8, -1).gather(1, token[:, None])[:, 0]
    torch.testing.assert_close(logp, expected, rtol=1e-4, atol=1e-4)
    if greedy:
        assert token.tolist() == logits.float().argmax(-1).tolist()
    else:
        assert len(set(token.tolist())) > 100  # 128 rows of different logits: different draws


def test_draws_follow_softmax_over_many_rows() -> None:
    probs = torch.tensor([0.02, 0.08, 0.1, 0.3, 0.5], device="cuda")
    rows = 200_000
    logits = probs.log().repeat(rows, 1)
    token, _ = choose_tokens(logits, torch.tensor([1], device="cuda"), torch.tensor([0], device="cuda"))
    counts = torch.bincount(token, minlength=5).double()
    expected = probs.double() * rows
    assert ((counts - expected) ** 2 / expected).sum().item() < 18.5  # df 4: p = 1e-3
