"""The chunked kernel path (torch twins and interpreted Triton kernels) against the fp64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from grpo_kernels import fused_linear_grpo_loss, selective_logprobs
from grpo_kernels.reference import reference_grpo_loss, reference_logprobs

# fp32: the only differences from fp64 are rounding in GEMMs and reductions over <= 300 terms
FP32_LOSS_RTOL, FP32_GRAD_COS = 1e-5, 0.99999
# fp16 (Triton interpreter): inputs rounded to 11 bits, the logits buffer and dlogits held in fp16
FP16_LOSS_RTOL, FP16_GRAD_COS = 2e-3, 0.9999


def fp16_rounded(inp: dict) -> dict:
    """`inp` with hidden, weight and bias rounded to fp16 but kept in fp64: the reference sees what fp16 sees."""
    return {**inp, **{k: inp[k].half().double() for k in ("hidden", "weight", "bias")}}


def run(fn, inp, dtype, **kw):
    """Loss, (grad hidden, grad weight, grad bias) in fp64, metrics."""
    leaves = [
        None if inp[k] is None else inp[k].to(dtype).clone().requires_grad_() for k in ("hidden", "weight", "bias")
    ]
    h, w, b = leaves
    cast = {k: None if inp[k] is None else inp[k].to(dtype) for k in ("ref", "old")}
    loss, metrics = fn(
        h, w, inp["ids"], inp["mask"], inp["adv"].to(dtype), bias=b, ref_logps=cast["ref"], old_logps=cast["old"], **kw
    )
    loss.backward()
    grads = [None if t is None else t.grad.double() for t in leaves]
    return loss.detach().double(), grads, metrics


def compare(inp, dtype, loss_rtol, grad_cos, chunk_tokens, **kw):
    ref_loss, ref_grads, ref_m = run(reference_grpo_loss, inp, torch.float64, **kw)
    loss, grads, m = run(fused_linear_grpo_loss, inp, dtype, chunk_tokens=chunk_tokens, **kw)
    assert torch.isfinite(loss)
    rel = (loss - ref_loss).abs() / ref_loss.abs().clamp(min=1e-12)
    assert rel <= loss_rtol, f"loss {loss.item()} vs {ref_loss.item()} (rel {rel.item():.2e})"
    for name, g, r in zip(("hidden", "weight", "bias"), grads, ref_grads):
        if r is None:
            continue
        assert torch.isfinite(g).all(), name
        cos = F.cosine_similarity(g.flatten(), r.flatten(), dim=0)
        assert cos >= grad_cos, f"grad {name}: cosine {cos.item():.7f}"
    valid = inp["mask"] != 0
    torch.testing.assert_close(m.logps.double()[valid], ref_m.logps[valid], rtol=loss_rtol * 10, atol=loss_rtol * 10)
    # Masked positions never reach the GEMMs: log-prob, entropy and their hidden-state gradient are exactly 0
    assert (m.logps[~valid] == 0).all() and (m.entropies[~valid] == 0).all()
    assert (grads[0][~valid] == 0).all()
    return ref_m, m


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_loss_types_off_policy_fp32(backend, loss_type, level, make_inputs):
    inp = make_inputs(V=300, off_policy=True, temperature=0.7)
    ref_m, m = compare(
        inp,
        torch.float32,
        FP32_LOSS_RTOL,
        FP32_GRAD_COS,
        chunk_tokens=4,
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=0.04,
        temperature=0.7,
        max_completion_length=7,
        num_items_in_batch=11.0 if loss_type == "dapo" else None,
    )
    for field in ("kl", "entropy", "clip_ratio_low", "clip_ratio_high", "clip_ratio_region"):
        torch.testing.assert_close(getattr(m, field).double(), getattr(ref_m, field), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("T", [1, 6])
def test_on_policy_no_kl_no_bias_odd_vocab(backend, T, make_inputs):
    inp = make_inputs(B=4, T=T, V=131, bias=False, masked_row=True)
    compare(inp, torch.float32, FP32_LOSS_RTOL, FP32_GRAD_COS, chunk_tokens=3, loss_type="dapo", beta=0.0)


def test_large_logit_offset(backend, make_inputs):
    # A shared offset of 60 on every logit: the online softmax and entropy must not cancel
    inp = make_inputs(V=97, offset=60.0, off_policy=True)
    ref_m, m = compare(inp, torch.float32, FP32_LOSS_RTOL, FP32_GRAD_COS, chunk_tokens=8, beta=0.1, loss_type="bnpo")
    torch.testing.assert_close(m.entropy.double(), ref_m.entropy, rtol=1e-5, atol=1e-5)


def test_fp16_triton_interpreter(triton_interpreter, make_inputs):
    inp = fp16_rounded(make_inputs(B=2, T=4, H=32, V=75, off_policy=True))
    compare(inp, torch.float16, FP16_LOSS_RTOL, FP16_GRAD_COS, chunk_tokens=3, beta=0.04, temperature=1.3)


def test_metrics_match_reference_in_fp64(make_inputs):
    # Same precision on both sides, so clip decisions agree exactly and the means to rounding
    inp = make_inputs(B=5, T=7, V=53, off_policy=True)
    ref_m, m = compare(
        inp,
        torch.float64,
        1e-10,
        1 - 1e-10,
        chunk_tokens=5,
        beta=0.2,
        loss_type="grpo",
        importance_sampling_level="token",
    )
    assert ref_m.clip_ratio_region > 0, "the off-policy inputs should clip some tokens"
    valid = inp["mask"] != 0
    for field in ref_m._fields:
        got, want = getattr(m, field), getattr(ref_m, field).to(getattr(m, field).dtype)
        if field in ("logps", "entropies"):  # per token: the reference scores masked positions too, ours skips them
            got, want = got[valid], want[valid]
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_selective_logprobs(backend, make_inputs):
    inp = make_inputs(B=2, T=7, V=150)
    h, w, b = (inp[k].float() for k in ("hidden", "weight", "bias"))
    lp, ent = selective_logprobs(h, w, inp["ids"], bias=b, temperature=0.9, return_entropy=True, chunk_tokens=4)
    ref_lp, ref_ent = reference_logprobs(inp["hidden"], inp["weight"], inp["ids"], bias=inp["bias"], temperature=0.9)
    assert lp.dtype == torch.float32 and lp.shape == (2, 7) and not lp.requires_grad
    torch.testing.assert_close(lp.double(), ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), ref_ent, rtol=1e-5, atol=1e-5)
    only = selective_logprobs(h, w, inp["ids"], bias=b, temperature=0.9)
    torch.testing.assert_close(only, lp)


def test_backward_scales_by_grad_output_and_lean_matches(make_inputs):
    inp = make_inputs(V=41, off_policy=True)
    _, grads1, _ = run(fused_linear_grpo_loss, inp, torch.float32, beta=0.04)
    h, w = (inp[k].float().clone().requires_grad_() for k in ("hidden", "weight"))
    loss, _ = fused_linear_grpo_loss(
        h,
        w,
        inp["ids"],
        inp["mask"],
        inp["adv"].float(),
        bias=inp["bias"].float(),
        ref_logps=inp["ref"].float(),
        old_logps=inp["old"].float(),
        beta=0.04,
        lean=True,
    )
    (loss * -2.5).backward()
    torch.testing.assert_close(h.grad.double(), -2.5 * grads1[0])
    torch.testing.assert_close(w.grad.double(), -2.5 * grads1[1])


def test_bf16_backward_rounds_the_scaled_accumulator_once(monkeypatch, make_inputs):
    # bf16 leaves: backward writes grad_output * the fp32 dW / db accumulators to bf16 (one rounding, bit for
    # bit), scales hidden's bf16 gradient in place, and the result is the reference gradient scaled
    from grpo_kernels import functional

    inp = make_inputs(V=41, off_policy=True)
    kept, chunk_loop = {}, functional.chunk_loop

    def keep(*args, **kwargs):
        out = chunk_loop(*args, **kwargs)
        kept.update(zip(("gh", "gw", "gb"), (t.clone() for t in out[2:])))
        return out

    monkeypatch.setattr(functional, "chunk_loop", keep)
    rounded = {**inp, **{k: inp[k].bfloat16().double() for k in ("hidden", "weight", "bias")}}
    _, ref_grads, _ = run(reference_grpo_loss, rounded, torch.float64, logits_dtype=torch.bfloat16)
    for scale in (1.0, 3.0):
        h, w, b = (inp[k].bfloat16().requires_grad_() for k in ("hidden", "weight", "bias"))
        loss, _ = fused_linear_grpo_loss(
            h, w, inp["ids"], inp["mask"], inp["adv"].float(), bias=b, old_logps=inp["old"].float(), chunk_tokens=7
        )
        (loss * scale).backward()
        assert kept["gw"].dtype == kept["gb"].dtype == torch.float32
        assert torch.equal(w.grad, (kept["gw"] * scale).bfloat16())
        assert torch.equal(b.grad, (kept["gb"] * scale).bfloat16())
        assert torch.equal(h.grad.view_as(kept["gh"]), kept["gh"] * torch.tensor(scale, dtype=torch.bfloat16))
        for g, r in zip((h.grad, w.grad, b.grad), ref_grads):
            r = r * scale
            assert F.cosine_similarity(g.double().flatten(), r.flatten(), dim=0) >= FP16_GRAD_COS
            torch.testing.assert_close(g.double().norm(), r.norm(), rtol=1e-2, atol=0)


def test_second_backward_is_a_one_line_error(make_inputs):
    inp = make_inputs(V=41)
    h, w = (inp[k].bfloat16().requires_grad_() for k in ("hidden", "weight"))
    loss, _ = fused_linear_grpo_loss(h, w, inp["ids"], inp["mask"], inp["adv"].float())
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward can run only once") as error:
        loss.backward()
    assert "\n" not in str(error.value)


def test_no_grad_gives_loss_without_graph(make_inputs):
    inp = make_inputs(V=41)
    with torch.no_grad():
        loss, m = fused_linear_grpo_loss(
            inp["hidden"].requires_grad_(), inp["weight"], inp["ids"], inp["mask"], inp["adv"]
        )
    ref, _ = reference_grpo_loss(inp["hidden"].detach(), inp["weight"], inp["ids"], inp["mask"], inp["adv"])
    assert not loss.requires_grad
    torch.testing.assert_close(loss, ref.detach())


@pytest.mark.parametrize("on_policy", [True, False])
@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_closed_form_token_grad_equals_autograd(on_policy, beta):
    from grpo_kernels.loss_math import per_token_loss, token_level_grad

    n = 400
    lp = -torch.rand(1, n, dtype=torch.float64) * 6
    old = None if on_policy else lp + torch.randn(1, n, dtype=torch.float64) * 0.4
    ref = lp + torch.randn(1, n, dtype=torch.float64) * 0.3
    adv = torch.randn(1, n, dtype=torch.float64)
    adv[0, :20] = 0.0  # zero advantages tie both branches too
    mask = (torch.rand(1, n) > 0.2).double()
    w = mask / 37.0
    x = lp.clone().requires_grad_()
    loss, _ = per_token_loss(
        x, old, ref, adv, mask, beta=beta, epsilon_low=0.2, epsilon_high=0.28, importance_sampling_level="token"
    )
    want = torch.autograd.grad((loss * w).sum(), x)[0]
    got = token_level_grad(lp, old, ref, adv, w, beta=beta, epsilon_low=0.2, epsilon_high=0.28)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)


def test_autocast_casts_like_the_model_head(make_inputs):
    # fp32 master weights and bf16 hidden states under autocast: computed in bf16, grads reach the fp32 leaves
    inp = make_inputs(V=64, bias=False)
    h = inp["hidden"].bfloat16().requires_grad_()
    w = inp["weight"].float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, m = fused_linear_grpo_loss(h, w, inp["ids"], inp["mask"], inp["adv"].float(), chunk_tokens=5)
        lp = selective_logprobs(h, w, inp["ids"])
    loss.backward()
    assert w.grad.dtype == torch.float32 and h.grad.dtype == torch.bfloat16
    ref, _ = reference_grpo_loss(
        h.detach().double(), w.detach().bfloat16().double(), inp["ids"], inp["mask"], inp["adv"]
    )
    assert ((loss.double() - ref).abs() / ref.abs()).item() < 2e-3
    valid = inp["mask"] != 0
    torch.testing.assert_close(lp[valid], m.logps[valid])
    with pytest.raises(ValueError, match="weight dtype"):
        fused_linear_grpo_loss(h, w, inp["ids"], inp["mask"], inp["adv"].float())
