"""Opt-in variants of the chunk loop (fast_stats, direct_dw, lean_host, fast_grad, fold_cast, all): same numerics as the default.

Each variant runs the default's reference comparisons on the torch twins and on the interpreted Triton
kernels (`backend` fixture), fp32 and fp16; plus direct checks of the pieces that differ.
"""

from __future__ import annotations

import pytest
import torch
from test_numerics import FP16_GRAD_COS, FP16_LOSS_RTOL, FP32_GRAD_COS, FP32_LOSS_RTOL, compare, fp16_rounded

from grpo_kernels import functional, selective_logprobs, triton_ops
from grpo_kernels.reference import reference_grpo_loss, reference_logprobs


def test_token_level_off_policy_bias_temperature(backend, variant, make_inputs):
    # 20 rows in chunks of 6: a partial last chunk; V = 300 crosses several segments in the triton backend
    inp = make_inputs(V=300, off_policy=True, temperature=0.7)
    ref_m, m = compare(
        inp, torch.float32, FP32_LOSS_RTOL, FP32_GRAD_COS, chunk_tokens=6, loss_type="dapo", beta=0.04,
        temperature=0.7, num_items_in_batch=11.0,
    )  # fmt: skip
    for field in ("kl", "entropy", "clip_ratio_low", "clip_ratio_high", "clip_ratio_region"):
        torch.testing.assert_close(getattr(m, field).double(), getattr(ref_m, field), rtol=1e-4, atol=1e-6)


def test_sequence_level(backend, variant, make_inputs):
    inp = make_inputs(V=131, off_policy=True)
    compare(inp, torch.float32, FP32_LOSS_RTOL, FP32_GRAD_COS, chunk_tokens=7, loss_type="bnpo", beta=0.1,
            importance_sampling_level="sequence")  # fmt: skip


def test_single_token_odd_vocab_no_bias(backend, variant, make_inputs):
    inp = make_inputs(B=5, T=1, V=97, bias=False, offset=0.0)
    compare(inp, torch.float32, FP32_LOSS_RTOL, FP32_GRAD_COS, chunk_tokens=2, loss_type="grpo", beta=0.0)


def test_fp16_triton_interpreter(variant, triton_interpreter, make_inputs):
    inp = fp16_rounded(make_inputs(B=3, T=3, H=32, V=75, off_policy=True))
    compare(inp, torch.float16, FP16_LOSS_RTOL, FP16_GRAD_COS, chunk_tokens=4, beta=0.04, temperature=1.3)


def test_selective_logprobs(backend, variant, make_inputs):
    inp = make_inputs(B=3, T=3, V=150)
    h, w, b = (inp[k].float() for k in ("hidden", "weight", "bias"))
    lp, ent = selective_logprobs(h, w, inp["ids"], bias=b, temperature=0.9, return_entropy=True, chunk_tokens=4)
    ref_lp, ref_ent = reference_logprobs(inp["hidden"], inp["weight"], inp["ids"], bias=inp["bias"], temperature=0.9)
    torch.testing.assert_close(lp.double(), ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 5, 8])
def test_fast_row_stats_fills_every_output_like_the_default(backend, n):
    # Poisoned output buffers: every partial and target logit of the first n rows must be written; rows
    # past n (the reused buffer's tail) must stay untouched
    g = torch.Generator().manual_seed(n)
    V = 200
    logits = torch.randn(n, V, generator=g) * 3 + 20
    targets = torch.randint(0, V, (n,), generator=g)
    targets[0] = V - 1  # last column of the last (partial) segment
    want_parts, want_tgt = triton_ops.row_stats(logits, targets, 0.8)
    n_seg = triton_ops.stats_segments(V)
    assert want_parts.shape == (3, n, n_seg)
    parts_buf = torch.full((3, n + 3, n_seg), float("nan"))
    tgt_buf = torch.full((n + 3,), float("nan"))
    parts, tgt = triton_ops.row_stats(logits, targets, 0.8, fast=True, out=(parts_buf, tgt_buf))
    torch.testing.assert_close(parts, want_parts, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tgt, want_tgt)
    assert parts_buf[:, n:].isnan().all() and tgt_buf[n:].isnan().all()


@pytest.mark.parametrize("n", [1, 5])
def test_fast_logits_to_grad_equals_default(backend, n):
    g = torch.Generator().manual_seed(n)
    V = 150
    logits = torch.randn(n, V, generator=g) * 2
    targets = torch.randint(0, V, (n,), generator=g)
    lse = torch.logsumexp(logits / 0.9, 1)
    grad = torch.randn(n, generator=g)
    want, got = logits.clone(), logits.clone()
    triton_ops.logits_to_grad(want, targets, lse, grad, 1 / 0.9)
    triton_ops.logits_to_grad(got, targets, lse, grad, 1 / 0.9, fast=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("spec", ["fold_cast", "default"])
def test_fp16_weight_grad_is_fp16_and_scaled_by_grad_output(spec, monkeypatch, make_inputs):
    # fold_cast hands the fp32 accumulator to backward, which scales and casts in one pass
    monkeypatch.setattr(functional, "VARIANT", spec)
    inp = make_inputs(B=3, T=4, H=16, V=60, bias=False)
    h, w = (inp[k].half().requires_grad_() for k in ("hidden", "weight"))
    loss, _ = functional.fused_linear_grpo_loss(h, w, inp["ids"], inp["mask"], inp["adv"].half(), chunk_tokens=5)
    (loss * -3.0).backward()
    assert w.grad.dtype == torch.float16 and h.grad.dtype == torch.float16
    h2, w2 = (inp[k].half().double().requires_grad_() for k in ("hidden", "weight"))
    ref, _ = reference_grpo_loss(h2, w2, inp["ids"], inp["mask"], inp["adv"])
    (ref * -3.0).backward()
    for got, want in ((w.grad, w2.grad), (h.grad, h2.grad)):
        got = got.double()
        assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) >= 0.9999
        assert abs(got.norm() / want.norm() - 1) < 1e-2  # the -3 scale is applied once


def test_mm_into_ignores_what_the_accumulator_held():
    a = torch.randn(7, 5, dtype=torch.float16)
    b = torch.randn(5, 3, dtype=torch.float16)
    acc = torch.full((7, 3), float("nan"))
    functional._mm_into(acc, a, b)
    torch.testing.assert_close(acc, a.float() @ b.float())
    acc16 = torch.full((7, 3), float("nan"), dtype=torch.float16)
    functional._mm_into(acc16, a.float().half(), b)
    assert not acc16.isnan().any()


def test_async_check_still_rejects_bad_ids_off_cuda(monkeypatch, make_inputs):
    # On CPU there is no device queue to drain: the range check stays a clear ValueError
    monkeypatch.setattr(functional, "VARIANT", "async_check")
    inp = make_inputs(V=20, bias=False)
    ids = inp["ids"].clone()
    ids[0, 0] = 20
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 20\)"):
        functional.fused_linear_grpo_loss(inp["hidden"], inp["weight"], ids, inp["mask"], inp["adv"])


def test_variant_specs_and_switches(monkeypatch):
    assert functional.parse_variant(None) == frozenset()
    assert functional.parse_variant("default") == frozenset()
    assert functional.parse_variant("all") == frozenset(functional.VARIANT_FLAGS)
    assert functional.parse_variant("fast_stats+direct_dw") == {"fast_stats", "direct_dw"}
    with pytest.raises(ValueError, match="unknown bogus; allowed: default, all, fast_stats"):
        functional.parse_variant("fast_stats,bogus")
    monkeypatch.setattr(functional, "VARIANT", None)
    monkeypatch.setenv("GRPO_KERNELS_VARIANT", "lean_host")
    assert functional.variant_flags() == {"lean_host"}
    with functional.use_variant("direct_dw"):
        assert functional.variant_flags() == {"direct_dw"}
    assert functional.VARIANT is None and functional.variant_flags() == {"lean_host"}
    monkeypatch.delenv("GRPO_KERNELS_VARIANT")
    assert functional.variant_flags() == frozenset()
