"""Public functions: chunked linear + GRPO loss with the gradient formed during the forward pass.

Only the valid rows (mask != 0) reach the GEMMs: each chunk gathers its valid rows and per-row outputs are
scattered back (`rows.plan_chunks`), so padding costs nothing; skipped rows get log-prob 0, entropy 0 and a
gradient of exactly 0. How it works, per chunk of valid rows (whole sequences under sequence-level sampling):
1. logits = h_c @ W^T (+ b) by cuBLAS into one reused [C, V] buffer (fp32 accumulation inside).
2. `probs.probs_pass` (Triton): one read and one write of the buffer -> the statistics (log-prob of the target,
   entropy, logsumexp) and, in place, the softmax unnormalised against a per-row shift known before the pass
   (the target's logit); scoring reads the buffer once with `row_stats` instead.
3. d(loss)/d(log-prob) per token: token-level sampling in closed form inside `finish_rows` (a small
   Triton kernel; every normaliser is folded into per-token weights computed once from the full mask);
   sequence-level sampling by autograd through the shared loss math on the chunk's whole sequences.
   `finish_rows` also writes the target's column, so that d(loss)/d(logits) = c * buffer with a per-row c.
4. dW += buffer^T @ (c * h_c) (fp32 accumulator unless `lean`), db += buffer^T c, dH_c = c * (buffer @ W).
The loss value and the metrics come from all log-probs at once, through the same loss math as the
reference. The returned loss carries the gradients; its backward only scales them by grad_output (writing
the fp32 dW/db accumulators into the leaves' dtype in the same pass).
No logits are recomputed: 3 GEMMs in all, plus one memory-bound pass over each chunk. One host sync per
call (`checks.valid_counts`: the ids' range and the valid-row counts, which size the GEMMs).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from .casts import scaled_cast
from .checks import check_chunking, check_head, check_loss_args, valid_counts
from .chunk_loop import chunk_loop
from .loss_math import GrpoMetrics, finish_metrics, per_token_loss, token_weights
from .rows import Chunk, plan_chunks

# Bytes of the reused [C, V] logits buffer that the default chunk size aims at (C = 1536 at V = 152k in bf16):
# with the fp32 dW accumulator this keeps the extra peak under TRL 1.16's fused head at every batch size
CHUNK_BUFFER_BYTES = 448 * 2**20
# From this many valid tokens a loss call takes the larger buffer below (C = 2048 at V = 152k): each chunk's dW
# GEMM then adds a longer product (K = C) into the fp32 accumulator, whose read and write cost the same per
# chunk (on the H200 56.7 vs 59.1 ms at 32k tokens, 28.1 vs 28.9 at 16k: `benchmarks/kernel/bench.py
# --sweep-chunks`). TRL's head holds >= 1,275 MiB from 16k tokens on, ours then ~1,230-1,260 MiB; below, 1,536
# rows keep us under its 1,179 MiB at 4k
LARGE_CALL_TOKENS = 16384
LARGE_CALL_BUFFER_BYTES = 600 * 2**20
# The same for scoring (`selective_logprobs`; no dW accumulator, so the buffer is nearly the whole extra peak):
# C = 768 at V = 152k in bf16 (223 MiB), under TRL 1.16's scoring peak at 4k tokens (264 MiB) and still
# faster than it; 512 rows (149 MiB) 2-10% slower than 768 on the H200 (`bench.py --scoring-chunks`), behind TRL
# at 16k-32k tokens
SCORING_BUFFER_BYTES = 224 * 2**20
# Bounds of the default chunk size in rows, and its granularity (whole 256-row GEMM tiles)
MIN_CHUNK, MAX_CHUNK, CHUNK_STEP = 256, 16384, 256


def default_chunk_tokens(
    vocab: int, dtype: torch.dtype, lean: bool = False, *, scoring: bool = False, tokens: int = 0
) -> int:
    """Rows per chunk so that the logits buffer stays under its budget: CHUNK_BUFFER_BYTES for the loss
    (LARGE_CALL_BUFFER_BYTES from LARGE_CALL_TOKENS valid `tokens` on; half of CHUNK_BUFFER_BYTES when lean), or
    SCORING_BUFFER_BYTES for scoring."""
    if scoring:
        budget = SCORING_BUFFER_BYTES
    elif lean:
        budget = CHUNK_BUFFER_BYTES // 2
    else:
        budget = LARGE_CALL_BUFFER_BYTES if tokens >= LARGE_CALL_TOKENS else CHUNK_BUFFER_BYTES
    rows = budget // (vocab * torch.finfo(dtype).bits // 8) // CHUNK_STEP * CHUNK_STEP
    return max(MIN_CHUNK, min(MAX_CHUNK, rows))


class _MaskTerms(NamedTuple):
    """The loss's per-token terms that need only the mask (and the caller's old/ref/advantages)."""

    mask2d: torch.Tensor  # (B, T) the mask in the stats dtype
    weights: torch.Tensor  # (B, T) TRL's normalisers folded into per-token weights
    adv: torch.Tensor  # (B, 1)
    old: torch.Tensor | None  # (B, T), 0 at skipped positions; None: on-policy
    ref: torch.Tensor | None  # (B, T), 0 at skipped positions; None: no KL term


class _LossWithGrads(torch.autograd.Function):
    """A loss value whose gradients were computed already; backward scales them by grad_output.

    dW and db arrive as the chunk loop's fp32 accumulators (bf16/fp16 leaves unless lean): backward writes
    grad_output * acc straight into the leaf's dtype, one pass and one rounding, where a copy to that dtype
    after the loop and an in-place scale took two passes over the weight (~0.27 + 0.45 ms at V = 152k on the
    H200, `benchmarks/kernel/bench.py --profile`). The accumulator now lives until backward in place of that copy: never beside the chunk buffer, and at
    backward it and the result are the same two tensors that the end of the forward held before.
    """

    @staticmethod
    def forward(ctx, loss, hidden, weight, bias, grads):  # type: ignore[override]
        ctx.grads = grads
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (hidden, weight, bias))
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        if ctx.grads is None:
            raise RuntimeError("fused_linear_grpo_loss: backward can run only once (the gradients were handed over)")
        grads, ctx.grads = ctx.grads, None
        return None, *(_scaled(g, dtype, grad_output) for g, dtype in zip(grads, ctx.dtypes)), None


def _scaled(grad: torch.Tensor | None, dtype: torch.dtype, grad_output: torch.Tensor) -> torch.Tensor | None:
    # grad * grad_output in `dtype`. Already in it: in place (the gradient is ours, a copy would cost another
    # weight-sized buffer); an accumulator: one kernel reads it and writes the leaf's dtype (`casts`)
    if grad is None:
        return None
    if grad.dtype == dtype:
        return grad.mul_(grad_output.to(dtype))
    return scaled_cast(grad, grad_output, dtype)


def _autocast_inputs(hidden, weight, bias):
    # Under autocast the model's own lm_head would run in the autocast dtype: do the same (the casts are
    # differentiable, so fp32 master weights still get their gradient), then run with autocast off
    dev = hidden.device.type
    if not torch.is_autocast_enabled(dev):
        return hidden, weight, bias
    dtype = torch.get_autocast_dtype(dev)
    cast = lambda t: t if t is None or t.dtype == dtype or not t.is_floating_point() else t.to(dtype)  # noqa: E731 - a one-line helper local to this call
    return cast(hidden), cast(weight), cast(bias)


def fused_linear_grpo_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    old_logps: torch.Tensor | None = None,
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: str = "dapo",
    temperature: float = 1.0,
    max_completion_length: int | None = None,
    num_items_in_batch: float | torch.Tensor | None = None,
    importance_sampling_level: str = "token",
    chunk_tokens: int | None = None,
    lean: bool = False,
) -> tuple[torch.Tensor, GrpoMetrics]:
    """GRPO loss of `hidden @ weight.T (+ bias)` without materialising the logits.

    Equals TRL 1.16 `GRPOTrainer._compute_loss` before its division by the gradient-accumulation steps.
    Caller's scaling per loss_type (to match TRL in training): grpo, bnpo, dr_grpo: divide the returned
    loss by the current gradient-accumulation steps. dapo: pass `num_items_in_batch` already rescaled as
    TRL does (`num_items_in_batch / num_processes * grad_accum / steps_per_generation`) and do not divide
    further; default normaliser: this call's mask sum.

    Args:
        hidden: (B, T, H) last hidden states at the positions predicting `completion_ids`.
        weight: (V, H) lm_head weight; bias: optional (V,).
        completion_ids: (B, T) int ids; completion_mask: (B, T); advantages: (B,).
        old_logps: (B, T) behaviour log-probs, None = on-policy; ref_logps: (B, T), required if beta > 0.
        beta, epsilon_low, epsilon_high, loss_type, temperature, max_completion_length,
        num_items_in_batch, importance_sampling_level: as in TRL's GRPOConfig.
        chunk_tokens: rows per chunk (rounded down to whole sequences for sequence-level sampling);
            default `default_chunk_tokens(V, dtype, lean, tokens=<valid tokens>)`.
        lean: accumulate the weight gradient in the weight's dtype and use half-size chunks: less
            memory, but each chunk's partial dW is rounded to bf16 before the sum.

    Under autocast, hidden, weight and bias are cast to the autocast dtype first (as the model's own
    lm_head would be); gradients flow back through the casts. Otherwise their dtypes must match.

    Returns:
        (scalar loss: fp32, fp64 for fp64 inputs; GrpoMetrics).
    """
    if isinstance(hidden, torch.Tensor) and isinstance(weight, torch.Tensor):
        hidden, weight, bias = _autocast_inputs(hidden, weight, bias)
    with torch.autocast(hidden.device.type if isinstance(hidden, torch.Tensor) else "cpu", enabled=False):
        return _fused_linear_grpo_loss(
            hidden,
            weight,
            completion_ids,
            completion_mask,
            advantages,
            bias=bias,
            old_logps=old_logps,
            ref_logps=ref_logps,
            beta=beta,
            epsilon_low=epsilon_low,
            epsilon_high=epsilon_high,
            loss_type=loss_type,
            temperature=temperature,
            max_completion_length=max_completion_length,
            num_items_in_batch=num_items_in_batch,
            importance_sampling_level=importance_sampling_level,
            chunk_tokens=chunk_tokens,
            lean=lean,
        )


def _fused_linear_grpo_loss(
    hidden,
    weight,
    completion_ids,
    completion_mask,
    advantages,
    *,
    bias,
    old_logps,
    ref_logps,
    beta,
    epsilon_low,
    epsilon_high,
    loss_type,
    temperature,
    max_completion_length,
    num_items_in_batch,
    importance_sampling_level,
    chunk_tokens,
    lean,
):
    """`fused_linear_grpo_loss` with autocast resolved."""
    check_head(hidden, weight, completion_ids, bias)
    check_loss_args(
        hidden,
        completion_mask,
        advantages,
        old_logps,
        ref_logps,
        beta=beta,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        loss_type=loss_type,
        temperature=temperature,
        max_completion_length=max_completion_length,
        importance_sampling_level=importance_sampling_level,
        chunk_tokens=chunk_tokens,
    )
    batch, seq, width = hidden.shape
    vocab = weight.shape[0]
    stats_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    by_sequence = importance_sampling_level == "sequence"
    valid = completion_mask != 0  # (B, T)
    grad_on = torch.is_grad_enabled()
    want = tuple(grad_on and t is not None and t.requires_grad for t in (hidden, weight, bias))

    # The one host sync first: the GEMMs need the counts. The work that needs only the mask (below) is queued
    # once the chunk loop has launched its first chunk's GEMM and pass, so the device works while the host
    # prepares it (on the H200 21 launches and ~1.2 ms of host time preceded the first GEMM of a bench rep:
    # `benchmarks/kernel/kernel_profile.py`)
    counts = valid_counts(completion_ids, valid, vocab, per_sequence=by_sequence)
    chunks = plan_chunks(
        valid.reshape(-1),
        batch * seq,
        counts,
        chunk_tokens or default_chunk_tokens(vocab, hidden.dtype, lean, tokens=sum(counts)),
        whole_sequences=by_sequence,
    )

    @functools.cache
    def mask_terms() -> _MaskTerms:
        # Computed once, when first asked. Skipped positions get log-prob 0; old/ref 0 there too make their ratio 1
        # and KL 0, as in TRL (whose own scoring returns 0 at padding), so no inf * 0 from the masked positions
        # can reach the loss value
        mask2d = completion_mask.to(stats_dtype)
        return _MaskTerms(
            mask2d=mask2d,
            weights=token_weights(
                mask2d,
                loss_type,
                max_completion_length=max_completion_length,
                num_items_in_batch=num_items_in_batch,
                dtype=stats_dtype,
            ),
            adv=advantages.to(stats_dtype).unsqueeze(1),
            old=None if old_logps is None else torch.where(valid, old_logps.to(stats_dtype), 0.0),
            ref=None if ref_logps is None or beta == 0.0 else torch.where(valid, ref_logps.to(stats_dtype), 0.0),
        )

    clip = dict(epsilon_low=epsilon_low, epsilon_high=epsilon_high)
    if not by_sequence:
        seq_grad = None

        def token_grad() -> dict:
            t = mask_terms()
            flat = lambda x: None if x is None else x.reshape(-1)  # noqa: E731 - a one-line helper local to this call
            adv = t.adv.expand(batch, seq).reshape(-1)
            return dict(old=flat(t.old), ref=flat(t.ref), adv=adv, w=flat(t.weights), beta=beta, **clip)
    else:
        token_grad = None

        def seq_grad(chunk: Chunk, lp: torch.Tensor) -> torch.Tensor:
            # The sequence ratio couples a sequence's tokens: autograd through the loss math on the chunk's
            # (b, T) sequences, its valid rows put back in place (skipped positions 0, masked out there)
            seqs, t = chunk.seqs, mask_terms()
            with torch.enable_grad():
                x = lp.detach().requires_grad_()
                if isinstance(chunk.rows, slice):
                    dense = x.view(-1, seq)
                else:
                    at = chunk.rows - seqs.start * seq  # [n] positions in the chunk's (b * T) block
                    n_seq = seqs.stop - seqs.start
                    dense = x.new_zeros(n_seq * seq).index_put((at,), x).view(n_seq, seq)
                loss_tok, _ = per_token_loss(
                    dense,
                    None if t.old is None else t.old[seqs],
                    None if t.ref is None else t.ref[seqs],
                    t.adv[seqs],
                    t.mask2d[seqs],
                    beta=beta,
                    importance_sampling_level="sequence",
                    **clip,
                )
                return torch.autograd.grad((loss_tok * t.weights[seqs]).sum(), x)[0]

    with torch.no_grad():
        logps, entropies, gh, gw, gb = chunk_loop(
            hidden.reshape(-1, width),
            weight,
            bias,
            completion_ids.reshape(-1).long(),
            chunks,
            inv_t=1.0 / temperature,
            token_grad=token_grad,
            seq_grad=seq_grad,
            want=want,
            lean=lean,
        )
        # The loss value and the logged metrics from all log-probs at once: the same code as the reference
        logps, entropies = logps.view(batch, seq), entropies.view(batch, seq)
        t = mask_terms()
        loss_tok, stats = per_token_loss(
            logps, t.old, t.ref, t.adv, t.mask2d, beta=beta, importance_sampling_level=importance_sampling_level, **clip
        )
        loss = (loss_tok * t.weights).sum()
    metrics = finish_metrics(stats, logps, entropies, t.mask2d)
    if any(want):
        loss = _LossWithGrads.apply(loss, hidden, weight, bias, (None if gh is None else gh.view_as(hidden), gw, gb))
    return loss, metrics


@torch.no_grad()
def selective_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_tokens: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of `ids` under `hidden @ weight.T (+ bias)` / temperature, without logits or autograd.

    Args:
        hidden: (..., H); weight: (V, H); ids: hidden.shape[:-1] ints; bias: optional (V,).
        mask: ids.shape, nonzero where a position is scored (e.g. the completion mask); the others are
            skipped (no GEMM work) and get log-prob 0 and entropy 0, as TRL's fused head returns; their ids
            are never read (padding may hold -100). None: every position is scored.
        temperature: logits are divided by it; return_entropy: also return the entropies.
        chunk_tokens: rows per chunk; default `default_chunk_tokens(V, dtype, scoring=True)`, a smaller
            chunk than the loss's (no dW accumulator here: the chunk buffer is most of the extra memory).

    Returns:
        fp32 log-probs of shape ids.shape (fp64 for fp64 inputs), and the entropies if asked.
    """
    if isinstance(hidden, torch.Tensor) and isinstance(weight, torch.Tensor):
        hidden, weight, bias = _autocast_inputs(hidden, weight, bias)
    check_head(hidden, weight, ids, bias)
    check_chunking(temperature, chunk_tokens)
    counts = valid_counts(ids, mask, weight.shape[0])  # the one host sync
    chunks = plan_chunks(
        None if mask is None else (mask != 0).reshape(-1),
        ids.numel(),
        counts,
        chunk_tokens or default_chunk_tokens(weight.shape[0], hidden.dtype, scoring=True),
        whole_sequences=False,
    )
    with torch.autocast(hidden.device.type, enabled=False):
        logps, entropies, *_ = chunk_loop(
            hidden.reshape(-1, hidden.shape[-1]),
            weight,
            bias,
            ids.reshape(-1).long(),
            chunks,
            inv_t=1.0 / temperature,
            token_grad=None,
            seq_grad=None,
            want=(False, False, False),
            lean=False,
        )
    if return_entropy:
        return logps.view(ids.shape), entropies.view(ids.shape)
    return logps.view(ids.shape)
