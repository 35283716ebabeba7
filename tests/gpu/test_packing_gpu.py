"""Packing on CUDA: torch's variable-length flash attention is there and agrees with a causal sdpa per row, and
a packed forward and backward of the tiny model give the padded path's hidden states and gradients (bf16 within
its rounding, fp32 through the per-row fallback exactly)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_generation_gpu import load
from test_padding_free import padded_batch

from grpo_tui.losses import packing
from grpo_tui.losses.chunked import add_hidden_states_forward, hidden_states
from grpo_tui.losses.packing import Packing, packed_hidden_states

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = [37, 5, 61, 12, 44, 9, 30, 3]
COMPLETIONS = [90, 2, 17, 0, 128, 55, 1, 70]


def test_flash_varlen_attention_matches_causal_sdpa_per_row() -> None:
    flash = packing._flash()
    assert flash is not None, "torch.nn.attention.varlen is missing: packed training would run sdpa per row"
    gen = torch.Generator(device="cuda").manual_seed(0)
    lengths = [300, 1, 77, 512, 16]
    bounds = (0, *torch.tensor(lengths).cumsum(0).tolist())
    layout = Packing(bounds, torch.tensor(bounds, dtype=torch.int32, device="cuda"), max(lengths))
    q = torch.randn(bounds[-1], 16, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(bounds[-1], 8, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    got = flash(q, k, v, layout, 128**-0.5)
    for start, stop in zip(bounds, bounds[1:], strict=False):
        want = F.scaled_dot_product_attention(
            *(t[start:stop].transpose(0, 1) for t in (q, k, v)), is_causal=True, enable_gqa=True
        ).transpose(0, 1)
        torch.testing.assert_close(got[start:stop], want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_packed_forward_and_backward_equal_the_padded_ones(tiny_model_path: Path, dtype: torch.dtype) -> None:
    model = load(tiny_model_path, dtype).train()
    add_hidden_states_forward(model)
    ids, mask, cap = padded_batch(model.config.vocab_size, PROMPTS, COMPLETIONS)
    ids, mask = ids.cuda(), mask.cuda()
    keep = mask[:, -cap - 1 : -1].bool()
    weights = torch.randn(keep.shape + (model.config.hidden_size,), device="cuda", dtype=dtype)
    out = {}
    for packed in (False, True):
        model.zero_grad()
        forward = packed_hidden_states if packed else hidden_states
        hidden = forward(model, ids, mask, cap)
        (hidden[keep].float() * weights[keep].float()).sum().backward()
        out[packed] = hidden.detach(), [p.grad.float().clone() for p in model.parameters() if p.grad is not None]
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out[True][0][keep].float(), out[False][0][keep].float(), rtol=tol, atol=tol)
    assert (out[True][0][~keep] == 0).all()
    for a, b in zip(out[True][1], out[False][1], strict=True):
        assert (a - b).norm() <= tol * max(1.0, b.norm().item()), (a - b).norm()
