"""Public functions: chunked linear + GRPO loss with the gradient formed during the forward pass.

How it works, per chunk of rows (whole sequences under sequence-level sampling):
1. logits = h_c @ W^T (+ b) by cuBLAS into one reused [C, V] buffer (fp32 accumulation inside).
2. `row_stats` (Triton): one read of the buffer -> log-prob of the target, entropy, logsumexp.
3. The GRPO loss of the chunk in torch with autograd on a detached leaf of the log-probs (exact TRL
   semantics, every normaliser folded into per-token weights computed once from the full mask)
   gives d(loss)/d(log-prob) per token.
4. `logits_to_grad` (Triton): the buffer becomes d(loss)/d(logits) in place.
5. dH_c = dlogits @ W and dW += dlogits^T @ h_c (fp32 accumulator unless `lean`), db += colsum.
The returned loss carries these gradients; its backward only scales them by the incoming gradient.
No logits are recomputed: 3 GEMMs in all, plus two memory-bound passes over each chunk.
"""

from __future__ import annotations

import torch

from . import triton_ops
from .checks import check_head, check_loss_args
from .loss_math import GrpoMetrics, add_stats, finish_metrics, per_token_loss, token_weights

# Bytes of the reused [C, V] logits buffer that the default chunk size aims at (C = 1024 at V = 152k in bf16)
CHUNK_BUFFER_BYTES = 320 * 2**20
# Bounds of the default chunk size in rows
MIN_CHUNK, MAX_CHUNK = 128, 16384
# `torch.addmm(..., out_dtype=torch.float32)` from bf16/fp16 inputs exists from torch 2.8 on CUDA
_HAS_OUT_DTYPE = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


def default_chunk_tokens(vocab: int, dtype: torch.dtype, lean: bool = False) -> int:
    """Rows per chunk so that the logits buffer stays near CHUNK_BUFFER_BYTES (half of it when lean)."""
    budget = CHUNK_BUFFER_BYTES // (2 if lean else 1)
    rows = max(1, budget // (vocab * torch.finfo(dtype).bits // 8))
    return max(MIN_CHUNK, min(MAX_CHUNK, 1 << (rows.bit_length() - 1)))


def _addmm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    # acc += a @ b. For an fp32 acc and bf16/fp16 operands, the product is not rounded to bf16 first:
    # rounding each chunk's partial dW before the sum biases training (TRL's fused head notes the same).
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif _HAS_OUT_DTYPE and acc.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def _chunk_loop(hidden2d, weight, bias, ids, *, inv_t, rows_per_chunk, grad_of_logps, want, lean):
    """Run the chunks; returns (logps, entropies, grad_hidden, grad_weight, grad_bias)."""
    n_rows, _ = hidden2d.shape
    vocab = weight.shape[0]
    stats_dtype = torch.float64 if hidden2d.dtype == torch.float64 else torch.float32
    logps = torch.empty((n_rows,), device=hidden2d.device, dtype=stats_dtype)
    entropies = torch.empty_like(logps)
    buf = torch.empty((min(n_rows, rows_per_chunk), vocab), device=hidden2d.device, dtype=hidden2d.dtype)
    gh = torch.empty_like(hidden2d) if want[0] else None
    acc_dtype = weight.dtype if (lean or weight.dtype in (torch.float32, torch.float64)) else torch.float32
    gw = torch.zeros(weight.shape, device=weight.device, dtype=acc_dtype) if want[1] else None
    gb = torch.zeros((vocab,), device=weight.device, dtype=stats_dtype) if want[2] else None
    w_t = weight.t()
    for start in range(0, n_rows, rows_per_chunk):
        end = min(start + rows_per_chunk, n_rows)
        tile = buf[: end - start]  # [n, V]
        h_c = hidden2d[start:end]  # [n, H]
        if bias is None:
            torch.mm(h_c, w_t, out=tile)
        else:
            torch.addmm(bias, h_c, w_t, out=tile)
        lp, ent, lse = triton_ops.logprob_stats(tile, ids[start:end], inv_t)
        logps[start:end] = lp
        entropies[start:end] = ent
        g = grad_of_logps(start, end, lp) if grad_of_logps is not None else None
        if g is None or not any(want):
            continue
        triton_ops.logits_to_grad(tile, ids[start:end], lse, g, inv_t)
        if gh is not None:
            torch.mm(tile, weight, out=gh[start:end])
        if gw is not None:
            _addmm_acc(gw, tile.t(), h_c)
        if gb is not None:
            gb += tile.sum(0, dtype=gb.dtype)
    del buf  # free the chunk buffer before the fp32 -> bf16 copy of dW
    if gw is not None and gw.dtype != weight.dtype:
        gw = gw.to(weight.dtype)
    if gb is not None:
        gb = gb.to(weight.dtype)
    return logps, entropies, gh, gw, gb


class _LossWithGrads(torch.autograd.Function):
    """A loss value whose gradients were computed already; backward scales them by grad_output."""

    @staticmethod
    def forward(ctx, loss, hidden, weight, bias, grads):  # type: ignore[override]
        ctx.grads = grads
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        if ctx.grads is None:
            raise RuntimeError("fused_linear_grpo_loss: backward can run only once (the gradients were handed over)")
        # In place: the gradients are ours, and a copy would cost another weight-sized buffer
        out = [None if g is None else g.mul_(grad_output.to(g.dtype)) for g in ctx.grads]
        ctx.grads = None
        return None, out[0], out[1], out[2], None


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
            default `default_chunk_tokens(V, dtype, lean)`.
        lean: accumulate the weight gradient in the weight's dtype and use half-size chunks: less
            memory, but each chunk's partial dW is rounded to bf16 before the sum.

    Returns:
        (scalar loss: fp32, fp64 for fp64 inputs; GrpoMetrics).
    """
    check_head(hidden, weight, completion_ids, bias)
    check_loss_args(
        hidden, completion_mask, advantages, old_logps, ref_logps, beta=beta, epsilon_low=epsilon_low,
        epsilon_high=epsilon_high, loss_type=loss_type, temperature=temperature,
        max_completion_length=max_completion_length, importance_sampling_level=importance_sampling_level,
        chunk_tokens=chunk_tokens,
    )  # fmt: skip
    batch, seq, width = hidden.shape
    vocab = weight.shape[0]
    stats_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    rows = chunk_tokens or default_chunk_tokens(vocab, hidden.dtype, lean)
    if importance_sampling_level == "sequence":
        rows = max(1, rows // seq) * seq  # the sequence ratio couples a sequence's tokens
    grad_on = torch.is_grad_enabled()
    want = tuple(grad_on and t is not None and t.requires_grad for t in (hidden, weight, bias))

    mask = completion_mask.to(stats_dtype).reshape(-1)
    weights = token_weights(
        completion_mask.to(stats_dtype), loss_type, max_completion_length=max_completion_length,
        num_items_in_batch=num_items_in_batch, dtype=stats_dtype,
    ).reshape(-1)  # fmt: skip
    adv = advantages.to(stats_dtype).unsqueeze(1).expand(batch, seq).reshape(-1)
    old = old_logps.to(stats_dtype).reshape(-1) if old_logps is not None else None
    ref = ref_logps.to(stats_dtype).reshape(-1) if ref_logps is not None else None
    state = {"loss": torch.zeros((), device=hidden.device, dtype=stats_dtype), "stats": None}

    def grad_of_logps(start: int, end: int, lp: torch.Tensor) -> torch.Tensor | None:
        # Token level: any row split works, rows are viewed as one (1, n) batch; sequence level: (n/T, T)
        shape = (1, end - start) if importance_sampling_level == "token" else ((end - start) // seq, seq)
        adv_c = adv[start:end].view(shape)
        if importance_sampling_level == "sequence":
            adv_c = adv_c[:, :1]
        with torch.enable_grad():
            x = lp.detach().view(shape).requires_grad_(any(want))
            loss_tok, stats = per_token_loss(
                x, None if old is None else old[start:end].view(shape),
                None if ref is None else ref[start:end].view(shape), adv_c, mask[start:end].view(shape),
                beta=beta, epsilon_low=epsilon_low, epsilon_high=epsilon_high,
                importance_sampling_level=importance_sampling_level,
            )  # fmt: skip
            chunk_loss = (loss_tok * weights[start:end].view(shape)).sum()
            g = torch.autograd.grad(chunk_loss, x)[0].reshape(-1) if any(want) else None
        state["loss"] += chunk_loss.detach()
        state["stats"] = add_stats(state["stats"], stats)
        return g

    with torch.no_grad():
        logps, entropies, gh, gw, gb = _chunk_loop(
            hidden.reshape(-1, width), weight, bias, completion_ids.reshape(-1).long(), inv_t=1.0 / temperature,
            rows_per_chunk=rows, grad_of_logps=grad_of_logps, want=want, lean=lean,
        )  # fmt: skip
    metrics = finish_metrics(state["stats"], logps.view(batch, seq), entropies.view(batch, seq), completion_mask)
    loss = state["loss"]
    if any(want):
        loss = _LossWithGrads.apply(loss, hidden, weight, bias, (None if gh is None else gh.view_as(hidden), gw, gb))
    return loss, metrics


@torch.no_grad()
def selective_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    return_entropy: bool = False,
    chunk_tokens: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of `ids` under `hidden @ weight.T (+ bias)` / temperature, without logits or autograd.

    Args:
        hidden: (..., H); weight: (V, H); ids: hidden.shape[:-1] ints; bias: optional (V,).
        temperature: logits are divided by it; return_entropy: also return the entropies.
        chunk_tokens: rows per chunk (default by vocabulary size).

    Returns:
        fp32 log-probs of shape ids.shape (fp64 for fp64 inputs), and the entropies if asked.
    """
    check_head(hidden, weight, ids, bias)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens <= 0):
        raise ValueError(f"chunk_tokens must be a positive int or None, got {chunk_tokens!r}")
    rows = chunk_tokens or default_chunk_tokens(weight.shape[0], hidden.dtype)
    logps, entropies, *_ = _chunk_loop(
        hidden.reshape(-1, hidden.shape[-1]), weight, bias, ids.reshape(-1).long(), inv_t=1.0 / temperature,
        rows_per_chunk=rows, grad_of_logps=None, want=(False, False, False), lean=False,
    )  # fmt: skip
    if return_entropy:
        return logps.view(ids.shape), entropies.view(ids.shape)
    return logps.view(ids.shape)
