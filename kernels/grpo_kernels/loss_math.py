"""GRPO per-token loss math, shared by the chunked kernel path and the materialised reference.

Semantics follow TRL 1.16 `GRPOTrainer._compute_loss` for loss types grpo, bnpo, dr_grpo and dapo,
token- and sequence-level importance sampling, WITHOUT TRL's division by the gradient-accumulation
steps (the caller applies it). The loss is written as `sum(per_token_loss * token_weight)` so that it
splits into independent chunks of rows (whole sequences for sequence-level sampling): every
normaliser is folded into `token_weight`, computed once from the full mask.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IS_LEVELS = ("token", "sequence")


class ChunkStats(NamedTuple):
    """Sums over one chunk, turned into TRL's logged means by `finish_metrics` (all 0-dim tensors)."""

    kl_sum: torch.Tensor  # sum(kl * mask)
    token_count: torch.Tensor  # sum(mask)
    clip_low_sum: torch.Tensor  # token level: sum(clipped * mask); sequence level: sum over sequences
    clip_high_sum: torch.Tensor
    clip_region_sum: torch.Tensor
    clip_count: torch.Tensor  # token level: sum(mask); sequence level: number of sequences


def token_weights(
    mask: torch.Tensor,
    loss_type: str,
    *,
    max_completion_length: int | None,
    num_items_in_batch: float | torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Per-token weights w such that `loss = sum(per_token_loss * w)` reproduces TRL's normalisation.

    Args:
        mask: (B, T) completion mask (0/1).
        loss_type: grpo (mean over each sequence's tokens, then over sequences), bnpo (mean over all
            tokens of this call), dr_grpo (sum / (B * max_completion_length)), dapo (sum /
            num_items_in_batch, default: this call's token count).
        max_completion_length: required for dr_grpo.
        num_items_in_batch: dapo's normaliser, already rescaled by the caller as TRL does.
        dtype: dtype of the returned weights.

    Returns:
        (B, T) weights, zero where the mask is zero.
    """
    m = mask.to(dtype)
    batch = m.shape[0]
    if loss_type == "grpo":
        return m / m.sum(-1, keepdim=True).clamp(min=1.0) / batch
    if loss_type == "bnpo":
        return m / m.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return m / (batch * max_completion_length)
    if loss_type == "dapo":
        if num_items_in_batch is None:
            normaliser = m.sum()
        else:
            normaliser = torch.as_tensor(num_items_in_batch, dtype=dtype, device=m.device)
        return m / normaliser.clamp(min=1.0)
    raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")


def per_token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
    importance_sampling_level: str,
) -> tuple[torch.Tensor, ChunkStats]:
    """TRL's clipped-ratio objective plus beta * k3 KL for rows of whole sequences.

    Args:
        logps: (b, t) current log-probs (differentiable).
        old_logps: (b, t) behaviour-policy log-probs, None for on-policy (old = logps.detach()).
        ref_logps: (b, t) reference log-probs, used when beta != 0.
        advantages: (b, 1) per-sequence advantages.
        mask: (b, t) completion mask. For sequence-level sampling each row must be a whole sequence.
        beta, epsilon_low, epsilon_high, importance_sampling_level: as in TRL.

    Returns:
        ((b, t) per-token loss, unmasked; chunk statistics for the logged metrics).
    """
    m = mask.to(logps.dtype)
    old = logps.detach() if old_logps is None else old_logps.to(logps.dtype)
    log_ratio = logps - old
    if importance_sampling_level == "token":
        log_w = log_ratio
    else:
        # One ratio per sequence: the masked mean of the token log-ratios
        log_w = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    loss = loss.expand_as(logps)
    kl_sum = logps.new_zeros(())
    if beta != 0.0:
        delta = ref_logps.to(logps.dtype) - logps
        kl = torch.exp(delta) - delta - 1
        loss = loss + beta * kl
        kl_sum = (kl.detach() * m).sum()
    with torch.no_grad():
        # TRL counts a clip only where it changes the objective: low side for A < 0, high side for A > 0
        low = ((coef_1 < 1 - epsilon_low) & (advantages < 0)).to(m.dtype)
        high = ((coef_1 > 1 + epsilon_high) & (advantages > 0)).to(m.dtype)
        region = torch.clamp(low + high, max=1.0)
        if importance_sampling_level == "token":
            sums = [(x * m).sum() for x in (low, high, region)]
            clip_count = m.sum()
        else:
            sums = [x.sum() for x in (low, high, region)]
            clip_count = torch.tensor(float(m.shape[0]), dtype=m.dtype, device=m.device)
    stats = ChunkStats(kl_sum, m.sum().detach(), sums[0], sums[1], sums[2], clip_count)
    return loss, stats


def token_level_grad(
    logps: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    *,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
) -> torch.Tensor:
    """d(sum(per_token_loss * weights)) / d(logps) for token-level sampling, in closed form.

    Mirrors autograd through `per_token_loss` exactly, ties included: torch.min splits the gradient
    evenly between equal arguments (every token on-policy, where ratio == 1) and torch.clamp passes it
    on the closed interval. The Triton row kernel implements the same formula.
    """
    old = logps if old_logps is None else old_logps.to(logps.dtype)
    ratio = torch.exp(logps - old)
    lo, hi = 1 - epsilon_low, 1 + epsilon_high
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, lo, hi) * advantages
    inside = ((ratio >= lo) & (ratio <= hi)).to(logps.dtype)
    take_u = (unclipped < clipped).to(logps.dtype) + 0.5 * (unclipped == clipped).to(logps.dtype)
    take_c = (unclipped > clipped).to(logps.dtype) + 0.5 * (unclipped == clipped).to(logps.dtype)
    grad = -(take_u + take_c * inside) * advantages * ratio
    if beta != 0.0:
        grad = grad + beta * (1 - torch.exp(ref_logps.to(logps.dtype) - logps))
    return grad * weights


class GrpoMetrics(NamedTuple):
    """What TRL logs for one loss call (local to this process; reduce across ranks with the counts).

    Means are 0-dim fp32 tensors (no host sync); `kl` is 0 when beta == 0.
    """

    logps: torch.Tensor  # (B, T) per-token log-probs, detached
    entropies: torch.Tensor  # (B, T) per-token entropies, detached
    kl: torch.Tensor  # masked mean of the k3 KL to the reference
    entropy: torch.Tensor  # masked mean entropy
    clip_ratio_low: torch.Tensor  # TRL's clip_ratio/low_mean
    clip_ratio_high: torch.Tensor  # TRL's clip_ratio/high_mean
    clip_ratio_region: torch.Tensor  # TRL's clip_ratio/region_mean
    token_count: torch.Tensor  # sum of the mask (the count behind kl and entropy)
    clip_count: torch.Tensor  # tokens (token level) or sequences (sequence level) behind the clip ratios


def finish_metrics(stats: ChunkStats, logps: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor) -> GrpoMetrics:
    """Turn summed chunk statistics into TRL's masked means."""
    count = stats.token_count.clamp(min=1.0)
    clip_count = stats.clip_count.clamp(min=1.0)
    entropy = (entropies * mask.to(entropies.dtype)).sum() / count
    return GrpoMetrics(
        logps=logps.detach(),
        entropies=entropies.detach(),
        kl=stats.kl_sum / count,
        entropy=entropy,
        clip_ratio_low=stats.clip_low_sum / clip_count,
        clip_ratio_high=stats.clip_high_sum / clip_count,
        clip_ratio_region=stats.clip_region_sum / clip_count,
        token_count=stats.token_count,
        clip_count=stats.clip_count,
    )
