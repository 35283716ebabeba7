"""Naive GRPO loss with materialised logits: the test reference (run it in fp64) and the `naive` baseline.

Autograd does everything here; the full `[B, T, V]` logits exist, which is exactly what the chunked
kernel avoids.
"""

from __future__ import annotations

import torch

from .checks import check_head, check_loss_args, valid_counts
from .loss_math import GrpoMetrics, finish_metrics, per_token_loss, token_weights


def reference_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    ids: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    logits_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of `ids` (differentiable) and entropies (detached) from full logits.

    The logits GEMM runs in the inputs' dtype; the softmax in fp32 (fp64 for fp64 inputs), as TRL did
    before its fused head. `logits_dtype` rounds the logits to that dtype first (gradients pass straight
    through): an fp64 reference of a head that stores its logits in bf16, as every bf16 head does.

    Returns:
        (log-probs, entropies), each of shape ids.shape.
    """
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    if logits_dtype is not None:
        logits = logits.to(logits_dtype).to(hidden.dtype)
    logits = logits.to(torch.float64 if hidden.dtype == torch.float64 else torch.float32)
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logps = logp_all.gather(-1, ids.long().unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():  # entropies are logged, not trained on (as in TRL)
        entropies = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropies


def reference_grpo_loss(
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
    logits_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, GrpoMetrics]:
    """Same contract as `grpo_kernels.fused_linear_grpo_loss`, computed from materialised logits.

    `logits_dtype`: see `reference_logprobs`.
    """
    check_head(hidden, weight, completion_ids, bias)
    valid_counts(completion_ids, None, weight.shape[0])  # the ids' range: every position is scored here
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
        chunk_tokens=None,
    )
    logps, entropies = reference_logprobs(
        hidden, weight, completion_ids, bias=bias, temperature=temperature, logits_dtype=logits_dtype
    )
    mask = completion_mask.to(logps.dtype)
    loss_tok, stats = per_token_loss(
        logps,
        old_logps,
        ref_logps,
        advantages.to(logps.dtype).unsqueeze(1),
        mask,
        beta=beta,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        importance_sampling_level=importance_sampling_level,
    )
    w = token_weights(
        mask,
        loss_type,
        max_completion_length=max_completion_length,
        num_items_in_batch=num_items_in_batch,
        dtype=logps.dtype,
    )
    loss = (loss_tok * w).sum()
    return loss, finish_metrics(stats, logps.detach(), entropies.detach(), mask)
