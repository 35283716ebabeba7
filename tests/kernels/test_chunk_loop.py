"""The chunk loop: the dW accumulator's GEMMs, and what is queued before its first chunk."""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import chunk_loop, fused_linear_grpo_loss


def test_first_dw_gemm_overwrites_the_accumulator():
    # The first chunk's dW GEMM writes the accumulator (beta = 0) instead of adding to a zero-filled one: its
    # old contents are never read; later chunks add to it
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(7, 5, generator=g), torch.randn(5, 4, generator=g)
    for dtype in (torch.float32, torch.float16):
        acc = torch.full((7, 4), float("nan"))
        chunk_loop.addmm_acc(acc, a.to(dtype), b.to(dtype), first=True)
        want = a.to(dtype).float() @ b.to(dtype).float()
        torch.testing.assert_close(acc, want)
        chunk_loop.addmm_acc(acc, a.to(dtype), b.to(dtype))
        torch.testing.assert_close(acc, 2 * want)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_mask_terms_follow_the_first_chunks_launches(monkeypatch, make_inputs, level):
    # The per-token terms that need only the mask (token weights, old/ref masked) are prepared once the first
    # chunk's GEMM and pass are queued, not before: in a bench rep they held back the first GEMM by ~1.2 ms of
    # host time on the H200 (`benchmarks/kernel/kernel_profile.py`). Once per call, whatever the chunk count.
    from grpo_kernels import functional, probs

    order = []
    real_pass, real_weights = probs.probs_pass, functional.token_weights
    monkeypatch.setattr(probs, "probs_pass", lambda *a, **k: order.append("pass") or real_pass(*a, **k))
    monkeypatch.setattr(functional, "token_weights", lambda *a, **k: order.append("weights") or real_weights(*a, **k))
    inp = make_inputs(B=4, T=6, V=53, off_policy=True)
    h = inp["hidden"].clone().requires_grad_()
    loss, _ = fused_linear_grpo_loss(
        h,
        inp["weight"],
        inp["ids"],
        inp["mask"],
        inp["adv"],
        old_logps=inp["old"],
        chunk_tokens=5,
        importance_sampling_level=level,
    )
    loss.backward()
    assert order[0] == "pass" and order.count("weights") == 1 and order.count("pass") >= 3
