"""Masked rows skipped: every mask shape against the fp64 reference, on the torch twins and interpreted Triton.

The kernel gathers only the valid rows into its GEMMs; padding must change neither the loss, nor the metrics,
nor the gradients of valid positions, and the gradient of a masked position must be exactly 0.
"""

from __future__ import annotations

import pytest
import torch
from test_numerics import FP16_GRAD_COS, FP16_LOSS_RTOL, FP32_GRAD_COS, FP32_LOSS_RTOL, compare, fp16_rounded

from grpo_kernels import fused_linear_grpo_loss, selective_logprobs
from grpo_kernels.reference import reference_grpo_loss, reference_logprobs
from grpo_kernels.rows import plan_chunks

LOSS_KW = {"beta": 0.04, "temperature": 0.8, "max_completion_length": 9, "num_items_in_batch": None}


def _masks(B: int, T: int) -> dict[str, torch.Tensor]:
    """Mask shapes worth a case each, (B, T) int64; each keeps at least one valid token (else see below)."""
    g = torch.Generator().manual_seed(B * 100 + T)
    suffix = torch.ones(B, T, dtype=torch.int64)
    for b, n in enumerate(torch.randint(1, T + 1, (B,), generator=g).tolist()):
        suffix[b, n:] = 0  # right padding: the usual completion mask
    holes = (torch.rand(B, T, generator=g) > 0.4).long()  # not a suffix: tool masks punch holes anywhere
    holes[0, T - 1] = 1
    empty_rows = suffix.clone()
    empty_rows[1:3] = 0  # whole sequences of padding (in the middle of the batch)
    single = torch.zeros(B, T, dtype=torch.int64)
    single[B - 1, T // 2] = 1  # one valid token in the whole batch
    return {"suffix": suffix, "holes": holes, "empty_rows": empty_rows, "single_token": single}


@pytest.mark.parametrize("mask_name", ["suffix", "holes", "empty_rows", "single_token"])
@pytest.mark.parametrize(
    "loss_type,level", [("grpo", "token"), ("bnpo", "sequence"), ("dr_grpo", "token"), ("dapo", "sequence")]
)
def test_masks_match_reference_fp32(backend, make_inputs, mask_name, loss_type, level):
    inp = make_inputs(B=5, T=6, V=131, off_policy=True, temperature=0.8)
    inp["mask"] = _masks(5, 6)[mask_name]
    # chunk_tokens 4: chunks hold parts of sequences (token level) or several short sequences (sequence level;
    # a sequence of 6 valid rows then gets a chunk of its own)
    compare(
        inp,
        torch.float32,
        FP32_LOSS_RTOL,
        FP32_GRAD_COS,
        chunk_tokens=4,
        loss_type=loss_type,
        importance_sampling_level=level,
        **LOSS_KW,
    )


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masks_match_reference_exactly_in_fp64(make_inputs, level):
    # fp64 both sides: clip decisions agree, so every metric and gradient matches to rounding
    inp = make_inputs(B=5, T=7, V=53, off_policy=True, temperature=0.8)
    inp["mask"] = _masks(5, 7)["empty_rows"] * _masks(5, 7)["holes"]
    inp["mask"][0, 0] = 1
    ref_m, m = compare(
        inp,
        torch.float64,
        1e-10,
        1 - 1e-10,
        chunk_tokens=5,
        loss_type="grpo",
        importance_sampling_level=level,
        **LOSS_KW,
    )
    fields = ("kl", "entropy", "clip_ratio_low", "clip_ratio_high", "clip_ratio_region", "token_count", "clip_count")
    for field in fields:
        torch.testing.assert_close(getattr(m, field), getattr(ref_m, field), rtol=1e-9, atol=1e-12)


def test_masks_fp16_triton_interpreter(triton_interpreter, make_inputs):
    inp = fp16_rounded(make_inputs(B=4, T=5, H=32, V=75, off_policy=True))
    inp["mask"] = _masks(4, 5)["holes"]
    compare(inp, torch.float16, FP16_LOSS_RTOL, FP16_GRAD_COS, chunk_tokens=3, beta=0.04, temperature=1.3)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_padding_is_never_read(backend, make_inputs, level):
    # NaN hidden states, out-of-vocabulary ids (-100, as TRL labels padding) and garbage old/ref log-probs at
    # masked positions: the loss, metrics and gradients equal those of clean inputs
    inp = make_inputs(B=4, T=6, V=97, off_policy=True)
    inp["mask"] = _masks(4, 6)["empty_rows"]
    pad = inp["mask"] == 0
    kw = {"loss_type": "bnpo", "importance_sampling_level": level, "beta": 0.1, "chunk_tokens": 5}
    clean = _loss_grads(inp, **kw)
    dirty = dict(inp)
    dirty["hidden"] = inp["hidden"].masked_fill(pad.unsqueeze(-1), float("nan"))
    dirty["ids"] = inp["ids"].masked_fill(pad, -100)
    dirty["old"] = inp["old"].masked_fill(pad, -1e4)  # exp(logp - old) would overflow to inf if used
    dirty["ref"] = inp["ref"].masked_fill(pad, 1e4)
    got = _loss_grads(dirty, **kw)
    for a, b in zip(got, clean):
        assert torch.equal(a, b)
    assert (got[1][pad] == 0).all()


def _loss_grads(inp, **kw):
    h, w, b = (inp[k].float().clone().requires_grad_() for k in ("hidden", "weight", "bias"))
    loss, m = fused_linear_grpo_loss(
        h,
        w,
        inp["ids"],
        inp["mask"],
        inp["adv"].float(),
        bias=b,
        old_logps=inp["old"].float(),
        ref_logps=inp["ref"].float(),
        **kw,
    )
    loss.backward()
    return loss.detach(), h.grad, w.grad, b.grad, m.logps, m.entropies, m.kl, m.clip_ratio_region


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_whole_batch_padding_gives_zero_loss_and_zero_grads(backend, make_inputs, level):
    inp = make_inputs(B=3, T=4, V=40, off_policy=True)
    h, w, b = (inp[k].float().clone().requires_grad_() for k in ("hidden", "weight", "bias"))
    mask = torch.zeros(3, 4, dtype=torch.int64)
    loss, m = fused_linear_grpo_loss(
        h,
        w,
        inp["ids"],
        mask,
        inp["adv"].float(),
        bias=b,
        old_logps=inp["old"].float(),
        ref_logps=inp["ref"].float(),
        beta=0.1,
        importance_sampling_level=level,
    )
    ref, _ = reference_grpo_loss(
        inp["hidden"],
        inp["weight"],
        inp["ids"],
        mask,
        inp["adv"],
        bias=inp["bias"],
        old_logps=inp["old"],
        ref_logps=inp["ref"],
        beta=0.1,
        importance_sampling_level=level,
    )
    loss.backward()  # a differentiable zero, as TRL's head gives an all-masked microbatch
    assert loss.item() == 0.0 and ref.item() == 0.0
    for t in (h.grad, w.grad, b.grad, m.logps, m.entropies):
        assert torch.equal(t, torch.zeros_like(t))
    assert m.token_count.item() == 0 and torch.isfinite(m.entropy) and torch.isfinite(m.kl)


def test_selective_logprobs_with_mask(backend, make_inputs):
    inp = make_inputs(B=3, T=7, V=150)
    mask = _masks(3, 7)["holes"]
    h, w, b = (inp[k].float() for k in ("hidden", "weight", "bias"))
    ids = inp["ids"].masked_fill(mask == 0, -100)  # padding labelled as TRL does: never read
    lp, ent = selective_logprobs(h, w, ids, mask=mask, bias=b, temperature=0.9, return_entropy=True, chunk_tokens=4)
    ref_lp, ref_ent = reference_logprobs(inp["hidden"], inp["weight"], inp["ids"], bias=inp["bias"], temperature=0.9)
    valid = mask != 0
    torch.testing.assert_close(lp.double()[valid], ref_lp[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double()[valid], ref_ent[valid], rtol=1e-5, atol=1e-5)
    assert (lp[~valid] == 0).all() and (ent[~valid] == 0).all()
    none = selective_logprobs(h, w, inp["ids"], mask=torch.zeros_like(mask), bias=b)
    assert torch.equal(none, torch.zeros(3, 7))
    with pytest.raises(ValueError, match=r"mask must have shape \(3, 7\)"):
        selective_logprobs(h, w, ids, mask=mask[:, :6])
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 150\)"):
        selective_logprobs(h, w, ids)  # without the mask the -100s are read


def test_plan_chunks_keeps_sequences_whole_and_skips_padding():
    counts = [3, 0, 2, 6, 1, 0]
    valid = torch.zeros(6, 6, dtype=torch.bool)
    for b, n in enumerate(counts):
        valid[b, :n] = True
    chunks = plan_chunks(valid.reshape(-1), 36, counts, 4, whole_sequences=True)
    # 3 + 0, then + 2 would make 5 > 4: cut; 2 alone (+ 6 > 4); 6 alone (longer than the budget); 1 + 0
    assert [c.seqs for c in chunks] == [slice(0, 2), slice(2, 3), slice(3, 4), slice(4, 6)]
    assert [c.size for c in chunks] == [3, 2, 6, 1]
    assert torch.cat([c.rows for c in chunks]).tolist() == valid.reshape(-1).nonzero().squeeze(1).tolist()
    token = plan_chunks(valid.reshape(-1), 36, [12], 5, whole_sequences=False)
    assert [c.size for c in token] == [5, 5, 2] and all(c.seqs is None for c in token)
    full = plan_chunks(None, 12, [4, 4, 4], 8, whole_sequences=True)  # no padding: slices, no gather
    assert [c.rows for c in full] == [slice(0, 8), slice(8, 12)]
    assert plan_chunks(torch.zeros(8, dtype=torch.bool), 8, [0, 0], 4, whole_sequences=True) == []


def _op_counts(fn) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key: e.count for e in prof.key_averages()}


@pytest.mark.parametrize("grad", [False, True], ids=["scoring", "loss"])
def test_per_row_inputs_gathered_and_outputs_scattered_once_per_call(make_inputs, grad):
    # Each launch counts where a call is host-bound (scoring 4k tokens), so the ids and the gradient's per-token
    # terms are gathered once and the log-probs and entropies scattered once, however many chunks there are:
    # only the hidden rows move per chunk
    inp = make_inputs(B=5, T=6, V=131, off_policy=True)
    mask = _masks(5, 6)["holes"]
    chunks = -(-int(mask.sum()) // 3)
    assert chunks >= 4
    h, w, ids = inp["hidden"], inp["weight"], inp["ids"]
    if grad:
        h, w = h.clone().requires_grad_(), w.clone().requires_grad_()

        def call():
            loss, _ = fused_linear_grpo_loss(h, w, ids, mask, inp["adv"], old_logps=inp["old"], chunk_tokens=3)
            loss.backward()
    else:

        def call():
            selective_logprobs(h, w, ids, mask=mask, chunk_tokens=3, return_entropy=True)

    counts = _op_counts(call)
    # log-prob and entropy once each; with the gradient also dH once, after the loop (kept in valid-row order)
    assert counts.get("aten::index_copy_", 0) == 2 + (1 if grad else 0)
    # the ids (and for the loss old, adv, w) once; the hidden rows once per chunk
    assert counts.get("aten::index_select", 0) == (4 if grad else 1) + chunks


def test_scoring_finishes_every_row_in_one_launch(backend, monkeypatch, make_inputs):
    # A 4k-token scoring call is host-bound: the chunks only write their rows' statistics, and one finish_rows
    # launch per call turns them into log-probs and entropies (equal to the reference, masked or not)
    from grpo_kernels import triton_ops

    inp = make_inputs(B=3, T=7, V=150)
    calls = []
    finish = triton_ops.finish_rows
    monkeypatch.setattr(triton_ops, "finish_rows", lambda *a, **k: calls.append(1) or finish(*a, **k))
    h, w, b = (inp[k].float() for k in ("hidden", "weight", "bias"))
    ref_lp, ref_ent = reference_logprobs(inp["hidden"], inp["weight"], inp["ids"], bias=inp["bias"])
    for mask in (None, _masks(3, 7)["holes"]):
        calls.clear()
        lp, ent = selective_logprobs(h, w, inp["ids"], mask=mask, bias=b, return_entropy=True, chunk_tokens=4)
        assert len(calls) == 1
        valid = torch.ones(3, 7, dtype=torch.bool) if mask is None else mask != 0
        torch.testing.assert_close(lp.double()[valid], ref_lp[valid], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ent.double()[valid], ref_ent[valid], rtol=1e-5, atol=1e-5)
