"""The decoder's folded grouped-query attention against the unfolded one (every query head on its repeated KV head)."""

from __future__ import annotations

import pytest
import torch

from grpo_tui.train.decode_attention import DECODE_ATTENTION, folded_attention, folded_heads


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
