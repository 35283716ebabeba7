"""Public functions: chunked linear + GRPO loss with the gradient formed during the forward pass.

How it works, per chunk of rows (whole sequences under sequence-level sampling):
1. logits = h_c @ W^T (+ b) by cuBLAS into one reused [C, V] buffer (fp32 accumulation inside).
2. `row_stats` (Triton): one read of the buffer -> log-prob of the target, entropy, logsumexp.
3. d(loss)/d(log-prob) per token: token-level sampling in closed form inside `finish_rows` (a small
   Triton kernel; every normaliser is folded into per-token weights computed once from the full mask);
   sequence-level sampling by autograd through the shared loss math on the chunk's whole sequences.
4. `logits_to_grad` (Triton): the buffer becomes d(loss)/d(logits) in place.
5. dH_c = dlogits @ W and dW += dlogits^T @ h_c (fp32 accumulator unless `lean`), db += colsum.
The loss value and the metrics come from all log-probs at once, through the same loss math as the
reference. The returned loss carries the gradients; its backward only scales them by grad_output.
No logits are recomputed: 3 GEMMs in all, plus two memory-bound passes over each chunk.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from . import triton_ops
from .checks import check_chunking, check_head, check_loss_args
from .loss_math import GrpoMetrics, finish_metrics, per_token_loss, token_weights

# Bytes of the reused [C, V] logits buffer that the default chunk size aims at (C = 1536 at V = 152k in bf16):
# with the fp32 dW accumulator this keeps the extra peak under TRL 1.16's fused head at every batch size
CHUNK_BUFFER_BYTES = 448 * 2**20
# Bounds of the default chunk size in rows, and its granularity (whole 256-row GEMM tiles)
MIN_CHUNK, MAX_CHUNK, CHUNK_STEP = 256, 16384, 256
# `torch.addmm(..., out_dtype=torch.float32)` from bf16/fp16 inputs exists from torch 2.8 on CUDA
_HAS_OUT_DTYPE = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)


# Opt-in variants of the chunk loop, for side-by-side timing (`python -m grpo_kernels.bench --variants ...`);
# none is on by default. fast_stats: the multi-row, autotuned `row_stats` kernel. direct_dw: the first
# chunk's dW GEMM writes the fp32 accumulator directly (beta = 0) instead of zero-fill + accumulate.
# lean_host: per-call scratch buffers reused by every chunk and `finish_rows` writing straight into the
# log-prob / entropy vectors (two copy kernels and four allocations fewer per chunk). fast_grad: the
# multi-row, autotuned `logits_to_grad`. fold_cast: the fp32 dW accumulator is cast to the weight's dtype
# inside the backward's scaling by grad_output (one pass over dW instead of a cast and then a scale).
# async_check: the ids' range check runs on the device, without the default's host sync (which leaves the
# GPU idle while the host prepares the first chunk, and in training drains the model's queued forward).
# balanced: equal chunks (e.g. 22 x 1,490 rows at 32,768 tokens instead of 21 x 1,536 + 512): the small
# last chunk's dW GEMM (K = 512) is bound by its fp32 accumulator's read + write, not by its math.
VARIANT_FLAGS = ("fast_stats", "direct_dw", "lean_host", "fast_grad", "fold_cast", "async_check", "balanced")
# A comma-separated subset of VARIANT_FLAGS, "all" or "default" (none); None: env GRPO_KERNELS_VARIANT
VARIANT: str | None = None


def parse_variant(text: str | None) -> frozenset[str]:
    """Flags of a variant spec like "fast_stats,direct_dw", "all" or "default"; ValueError if unknown."""
    names = {x.strip() for x in (text or "").replace("+", ",").split(",") if x.strip()} - {"default"}
    if "all" in names:
        names = (names - {"all"}) | set(VARIANT_FLAGS)
    bad = sorted(names - set(VARIANT_FLAGS))
    if bad:
        raise ValueError(f"grpo_kernels variant: unknown {', '.join(bad)}; allowed: default, all, {', '.join(VARIANT_FLAGS)}")
    return frozenset(names)


def variant_flags() -> frozenset[str]:
    """The variant flags in force: `VARIANT` if set, else the env var GRPO_KERNELS_VARIANT."""
    return parse_variant(VARIANT if VARIANT is not None else os.environ.get("GRPO_KERNELS_VARIANT"))


@contextlib.contextmanager
def use_variant(spec: str) -> Iterator[None]:
    """Run the body with `VARIANT = spec` (validated first), restoring the previous value after."""
    global VARIANT
    parse_variant(spec)
    prev, VARIANT = VARIANT, spec
    try:
        yield
    finally:
        VARIANT = prev


def default_chunk_tokens(vocab: int, dtype: torch.dtype, lean: bool = False) -> int:
    """Rows per chunk so that the logits buffer stays near CHUNK_BUFFER_BYTES (half of it when lean)."""
    budget = CHUNK_BUFFER_BYTES // (2 if lean else 1)
    rows = budget // (vocab * torch.finfo(dtype).bits // 8) // CHUNK_STEP * CHUNK_STEP
    return max(MIN_CHUNK, min(MAX_CHUNK, rows))


def _addmm_acc(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    # acc += a @ b. For an fp32 acc and bf16/fp16 operands, the product is not rounded to bf16 first:
    # rounding each chunk's partial dW before the sum biases training (TRL's fused head notes the same).
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif _HAS_OUT_DTYPE and acc.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def _mm_into(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    # acc = a @ b, overwriting acc (uninitialised memory is fine): the "direct_dw" first chunk
    if acc.dtype == a.dtype:
        torch.mm(a, b, out=acc)
        return
    if _HAS_OUT_DTYPE and acc.is_cuda:
        try:
            # beta = 0: cuBLAS neither reads acc nor needs it zeroed
            torch.addmm(acc, a, b, beta=0, out_dtype=acc.dtype, out=acc)
            return
        except RuntimeError:  # a torch without beta != 1 for out_dtype: zero-fill + accumulate, as the default
            acc.zero_()
            _addmm_acc(acc, a, b)
            return
    torch.mm(a.to(acc.dtype), b.to(acc.dtype), out=acc)


def _chunk_loop(hidden2d, weight, bias, ids, *, inv_t, rows_per_chunk, token_grad, seq_grad, want, lean):
    """Run the chunks; returns (logps, entropies, grad_hidden, grad_weight, grad_bias).

    token_grad: dict of [N] tensors and scalars for `triton_ops.finish_rows` (token-level sampling);
    seq_grad: callable (start, end, logps) -> [n] d(loss)/d(logps) (sequence level); both None: no gradient.
    """
    n_rows, _ = hidden2d.shape
    vocab = weight.shape[0]
    flags = variant_flags()
    fast_stats, direct_dw, lean_host, fast_grad, fold_cast = (f in flags for f in VARIANT_FLAGS[:5])
    stats_dtype = torch.float64 if hidden2d.dtype == torch.float64 else torch.float32
    logps = torch.empty((n_rows,), device=hidden2d.device, dtype=stats_dtype)
    entropies = torch.empty_like(logps)
    chunk_rows = min(n_rows, rows_per_chunk)
    buf = torch.empty((chunk_rows, vocab), device=hidden2d.device, dtype=hidden2d.dtype)
    gh = torch.empty_like(hidden2d) if want[0] else None
    acc_dtype = weight.dtype if (lean or weight.dtype in (torch.float32, torch.float64)) else torch.float32
    new_acc = torch.empty if direct_dw else torch.zeros
    gw = new_acc(weight.shape, device=weight.device, dtype=acc_dtype) if want[1] else None
    gb = torch.zeros((vocab,), device=weight.device, dtype=stats_dtype) if want[2] else None
    w_t = weight.t()
    stats_out = scratch = None
    if lean_host:
        # One set of small buffers for every chunk instead of fresh allocations per chunk
        n_seg = triton_ops.stats_segments(vocab)
        stats_out = (
            torch.empty((3, chunk_rows, n_seg), device=hidden2d.device, dtype=stats_dtype),
            torch.empty((chunk_rows,), device=hidden2d.device, dtype=stats_dtype),
        )
        scratch = torch.empty((2, chunk_rows), device=hidden2d.device, dtype=stats_dtype)
    first = True
    for start in range(0, n_rows, rows_per_chunk):
        end = min(start + rows_per_chunk, n_rows)
        tile = buf[: end - start]  # [n, V]
        h_c = hidden2d[start:end]  # [n, H]
        if bias is None:
            torch.mm(h_c, w_t, out=tile)
        else:
            torch.addmm(bias, h_c, w_t, out=tile)
        parts, target_logit = triton_ops.row_stats(tile, ids[start:end], inv_t, fast=fast_stats, out=stats_out)
        chunk_grad = None
        if token_grad is not None and any(want):
            chunk_grad = {k: (v[start:end] if isinstance(v, torch.Tensor) else v) for k, v in token_grad.items()}
        if lean_host:
            # finish_rows writes the chunk's log-probs and entropies in place: no copies afterwards
            dst = (logps[start:end], entropies[start:end], scratch[0, : end - start], scratch[1, : end - start])
            lp, ent, lse, g = triton_ops.finish_rows(parts, target_logit, chunk_grad, out=dst)
        else:
            lp, ent, lse, g = triton_ops.finish_rows(parts, target_logit, chunk_grad)
            logps[start:end] = lp
            entropies[start:end] = ent
        if seq_grad is not None and any(want):
            g = seq_grad(start, end, lp)
        if g is None:
            continue
        triton_ops.logits_to_grad(tile, ids[start:end], lse, g, inv_t, fast=fast_grad)
        if gh is not None:
            torch.mm(tile, weight, out=gh[start:end])
        if gw is not None and direct_dw and first:
            _mm_into(gw, tile.t(), h_c)
        elif gw is not None:
            _addmm_acc(gw, tile.t(), h_c)
        first = False
        if gb is not None:
            gb += tile.sum(0, dtype=gb.dtype)
    del buf, tile  # free the chunk buffer before the fp32 -> bf16 copy of dW
    if gw is not None and gw.dtype != weight.dtype and not fold_cast:
        gw = gw.to(weight.dtype)
    if gb is not None:
        gb = gb.to(weight.dtype)
    return logps, entropies, gh, gw, gb


def _scaled(grad: torch.Tensor, grad_output: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # grad * grad_output in `dtype`: in place when it is already there; else (fold_cast: the fp32 dW
    # accumulator) one kernel that reads fp32 and writes `dtype`
    if grad.dtype == dtype:
        return grad.mul_(grad_output.to(dtype))
    return torch.mul(grad, grad_output.to(grad.dtype), out=torch.empty(grad.shape, dtype=dtype, device=grad.device))


class _LossWithGrads(torch.autograd.Function):
    """A loss value whose gradients were computed already; backward scales them by grad_output."""

    @staticmethod
    def forward(ctx, loss, hidden, weight, bias, grads):  # type: ignore[override]
        ctx.grads = grads
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (hidden, weight, bias))
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        if ctx.grads is None:
            raise RuntimeError("fused_linear_grpo_loss: backward can run only once (the gradients were handed over)")
        # In place: the gradients are ours, and a copy would cost another weight-sized buffer
        out = [None if g is None else _scaled(g, grad_output, d) for g, d in zip(ctx.grads, ctx.dtypes)]
        ctx.grads = None
        return None, out[0], out[1], out[2], None


def _autocast_inputs(hidden, weight, bias):
    # Under autocast the model's own lm_head would run in the autocast dtype: do the same (the casts are
    # differentiable, so fp32 master weights still get their gradient), then run with autocast off
    dev = hidden.device.type
    if not torch.is_autocast_enabled(dev):
        return hidden, weight, bias
    dtype = torch.get_autocast_dtype(dev)
    cast = lambda t: t if t is None or t.dtype == dtype or not t.is_floating_point() else t.to(dtype)  # noqa: E731
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
            default `default_chunk_tokens(V, dtype, lean)`.
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
            hidden, weight, completion_ids, completion_mask, advantages, bias=bias, old_logps=old_logps,
            ref_logps=ref_logps, beta=beta, epsilon_low=epsilon_low, epsilon_high=epsilon_high, loss_type=loss_type,
            temperature=temperature, max_completion_length=max_completion_length,
            num_items_in_batch=num_items_in_batch, importance_sampling_level=importance_sampling_level,
            chunk_tokens=chunk_tokens, lean=lean,
        )  # fmt: skip


def _fused_linear_grpo_loss(
    hidden, weight, completion_ids, completion_mask, advantages, *, bias, old_logps, ref_logps, beta, epsilon_low,
    epsilon_high, loss_type, temperature, max_completion_length, num_items_in_batch, importance_sampling_level,
    chunk_tokens, lean,
):  # fmt: skip
    """`fused_linear_grpo_loss` with autocast resolved."""
    check_head(hidden, weight, completion_ids, bias, sync="async_check" not in variant_flags())
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
    if "balanced" in variant_flags():
        n_chunks = -(-(batch * seq) // rows)
        even = -(-(batch * seq) // n_chunks)
        rows = min(rows, -(-even // 16) * 16 if rows >= 256 else even)  # 16-row multiples keep GEMMs aligned
    if importance_sampling_level == "sequence":
        rows = max(1, rows // seq) * seq  # the sequence ratio couples a sequence's tokens
    grad_on = torch.is_grad_enabled()
    want = tuple(grad_on and t is not None and t.requires_grad for t in (hidden, weight, bias))

    mask2d = completion_mask.to(stats_dtype)
    weights = token_weights(
        mask2d, loss_type, max_completion_length=max_completion_length, num_items_in_batch=num_items_in_batch,
        dtype=stats_dtype,
    )  # fmt: skip
    adv = advantages.to(stats_dtype).unsqueeze(1)  # (B, 1)
    old = old_logps.to(stats_dtype) if old_logps is not None else None
    ref = ref_logps.to(stats_dtype) if ref_logps is not None and beta != 0.0 else None
    clip = dict(epsilon_low=epsilon_low, epsilon_high=epsilon_high)
    if importance_sampling_level == "token":
        seq_grad = None
        flat = lambda t: None if t is None else t.reshape(-1)  # noqa: E731
        token_grad = dict(old=flat(old), ref=flat(ref), adv=adv.expand(batch, seq).reshape(-1), w=flat(weights),
                          beta=beta, **clip)  # fmt: skip
    else:
        token_grad = None

        def seq_grad(start: int, end: int, lp: torch.Tensor) -> torch.Tensor:
            # The sequence ratio couples a sequence's tokens: autograd through the loss math on (n / T, T)
            rows = slice(start // seq, end // seq)
            with torch.enable_grad():
                x = lp.detach().view(-1, seq).requires_grad_()
                loss_tok, _ = per_token_loss(
                    x, None if old is None else old[rows], None if ref is None else ref[rows], adv[rows],
                    mask2d[rows], beta=beta, importance_sampling_level="sequence", **clip,
                )  # fmt: skip
                return torch.autograd.grad((loss_tok * weights[rows]).sum(), x)[0].reshape(-1)

    with torch.no_grad():
        logps, entropies, gh, gw, gb = _chunk_loop(
            hidden.reshape(-1, width), weight, bias, completion_ids.reshape(-1).long(), inv_t=1.0 / temperature,
            rows_per_chunk=rows, token_grad=token_grad, seq_grad=seq_grad, want=want, lean=lean,
        )  # fmt: skip
        # The loss value and the logged metrics from all log-probs at once: the same code as the reference
        logps, entropies = logps.view(batch, seq), entropies.view(batch, seq)
        loss_tok, stats = per_token_loss(
            logps, old, ref, adv, mask2d, beta=beta, importance_sampling_level=importance_sampling_level, **clip
        )
        loss = (loss_tok * weights).sum()
    metrics = finish_metrics(stats, logps, entropies, mask2d)
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
    if isinstance(hidden, torch.Tensor) and isinstance(weight, torch.Tensor):
        hidden, weight, bias = _autocast_inputs(hidden, weight, bias)
    check_head(hidden, weight, ids, bias)
    check_chunking(temperature, chunk_tokens)
    rows = chunk_tokens or default_chunk_tokens(weight.shape[0], hidden.dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        logps, entropies, *_ = _chunk_loop(
            hidden.reshape(-1, hidden.shape[-1]), weight, bias, ids.reshape(-1).long(), inv_t=1.0 / temperature,
            rows_per_chunk=rows, token_grad=None, seq_grad=None, want=(False, False, False), lean=False,
        )  # fmt: skip
    if return_entropy:
        return logps.view(ids.shape), entropies.view(ids.shape)
    return logps.view(ids.shape)
