"""The logits GEMM with the row statistics in its epilogue (`grpo_kernels.gemm_stats`, opt-in) against
cuBLAS/torch.mm + `row_stats`, and through `finish_rows` against log_softmax in fp64."""

from __future__ import annotations

import pytest
import torch
from seeds import next_seed

from grpo_kernels import fused_linear_grpo_loss, selective_logprobs, triton_ops
from grpo_kernels import gemm_stats as gs
from grpo_kernels.reference import reference_logprobs


def _inputs(n: int, width: int, vocab: int, dtype: torch.dtype, bias: bool):
    generator = torch.Generator().manual_seed(next_seed())
    hidden = torch.randn(n, width, generator=generator).to(dtype)
    weight = (torch.randn(vocab, width, generator=generator) / width**0.5).to(dtype)
    b = torch.randn(vocab, generator=generator).to(dtype) if bias else None
    ids = torch.randint(0, vocab, (n,), generator=generator)
    ids[0], ids[-1] = 0, vocab - 1  # the first and last column: the edges of the first and last tile
    return hidden, weight, b, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("n", "vocab", "bias"), [(21, 70, True), (16, 64, False), (1, 33, True)])
def test_kernel_matches_the_two_pass_path(backend, dtype, n: int, vocab: int, bias: bool) -> None:
    hidden, weight, b, ids = _inputs(n, 24, vocab, dtype, bias)
    block_n = 32  # tiny vocabularies still cross tiles, and the last tile is partial where V % 32 != 0
    logits = torch.empty(n, vocab + 5, dtype=dtype)[:, :vocab]  # a row stride wider than V, as chunk buffers
    parts, target = gs.gemm_stats(hidden, weight, b, ids, 0.7, out=logits, block_n=block_n)
    expected_logits = (hidden @ weight.t() + (b if bias else 0)).to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(logits, expected_logits, **tol)
    # the same statistics row_stats takes from those logits (segments of block_n columns)
    ref_parts, ref_target = gs.gemm_stats_torch(hidden, weight, b, ids, 0.7, block_n=block_n)
    assert parts.shape == (3, n, -(-vocab // block_n))
    torch.testing.assert_close(parts, ref_parts, **tol)
    torch.testing.assert_close(target, ref_target, **tol)
    # folded by finish_rows: log-probs and entropies of log_softmax over the whole row
    logp, ent, lse, _ = triton_ops.finish_rows(parts, target)
    z = expected_logits.double() * 0.7
    full = torch.log_softmax(z, -1)
    torch.testing.assert_close(logp.double(), full.gather(1, ids[:, None]).squeeze(1), **tol)
    torch.testing.assert_close(ent.double(), -(full.exp() * full).sum(-1), **tol)
    torch.testing.assert_close(lse.double(), torch.logsumexp(z, -1), **tol)


def test_scoring_writes_no_logits(backend) -> None:
    # Without `out` only the statistics are produced (the point of the kernel for scoring)
    hidden, weight, b, ids = _inputs(9, 16, 40, torch.float32, True)
    parts, target = gs.gemm_stats(hidden, weight, b, ids, 1.0, block_n=16)
    ref_parts, ref_target = gs.gemm_stats_torch(hidden, weight, b, ids, 1.0, block_n=16)
    torch.testing.assert_close(parts, ref_parts, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(target, ref_target, rtol=1e-5, atol=1e-5)


def test_no_rows(backend) -> None:
    hidden, weight, b, ids = _inputs(1, 16, 40, torch.float32, False)
    parts, target = gs.gemm_stats(hidden[:0], weight, b, ids[:0], 1.0, block_n=16)
    assert parts.shape == (3, 0, 3) and target.shape == (0,)


def _loss_and_grads(inp: dict, dtype: torch.dtype, **kw):
    hidden = inp["hidden"].to(dtype).requires_grad_()
    weight = inp["weight"].to(dtype).requires_grad_()
    bias = inp["bias"].to(dtype).requires_grad_()
    loss, metrics = fused_linear_grpo_loss(
        hidden, weight, inp["ids"], inp["mask"], inp["adv"].to(dtype), bias=bias, old_logps=inp["old"],
        ref_logps=inp["ref"], beta=0.04, temperature=0.8, chunk_tokens=4, **kw,
    )  # fmt: skip
    loss.backward()
    return loss.detach(), (hidden.grad, weight.grad, bias.grad), metrics


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_loss_with_fused_stats_equals_the_default_path(backend, make_inputs, monkeypatch, level, loss_type) -> None:
    monkeypatch.setattr(gs, "BLOCK_N", 32)  # V = 131: five tiles, the last partial
    inp = make_inputs(B=5, T=6, V=131, off_policy=True, temperature=0.8)
    inp["mask"][2, 3:] = 0  # padding inside the batch: gathered chunks
    kw = dict(loss_type=loss_type, importance_sampling_level=level)
    loss, grads, metrics = _loss_and_grads(inp, torch.float32, fused_stats=True, **kw)
    ref_loss, ref_grads, ref_metrics = _loss_and_grads(inp, torch.float32, **kw)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(metrics.logps, ref_metrics.logps, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(metrics.entropies, ref_metrics.entropies, rtol=1e-5, atol=1e-5)
    assert (grads[0][inp["mask"] == 0] == 0).all()  # masked rows: gradient exactly 0, as on the default path


def test_scoring_with_fused_stats_matches_the_reference(backend, make_inputs, monkeypatch) -> None:
    monkeypatch.setattr(gs, "BLOCK_N", 64)
    inp = make_inputs(B=3, T=7, V=150)
    mask = torch.ones(3, 7, dtype=torch.int64)
    mask[0, 4:], mask[2] = 0, 0  # right padding and a sequence of padding only
    h, w, b = (inp[k].float() for k in ("hidden", "weight", "bias"))
    ids = inp["ids"].masked_fill(mask == 0, -100)  # never read
    lp, ent = selective_logprobs(
        h, w, ids, mask=mask, bias=b, temperature=0.9, return_entropy=True, chunk_tokens=4, fused_stats=True
    )
    ref_lp, ref_ent = reference_logprobs(inp["hidden"], inp["weight"], inp["ids"], bias=inp["bias"], temperature=0.9)
    valid = mask != 0
    torch.testing.assert_close(lp.double()[valid], ref_lp[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double()[valid], ref_ent[valid], rtol=1e-5, atol=1e-5)
    assert (lp[~valid] == 0).all() and (ent[~valid] == 0).all()
