"""Input validation shared by the kernel path and the reference: bad input raises a one-line ValueError."""

from __future__ import annotations

import torch

from .loss_math import IS_LEVELS, LOSS_TYPES

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ")"


def check_head(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Check the lm_head inputs' shapes and dtypes: hidden (..., H), weight (V, H), ids = hidden.shape[:-1], bias (V,).

    The ids' range needs their values: `valid_counts` checks it, in the call's one host sync.
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dim() < 2:
        raise ValueError("hidden must be a tensor of shape (B, T, H)")
    if hidden.dtype not in _FLOATS:
        raise ValueError(f"hidden must be fp16, bf16, fp32 or fp64, got {hidden.dtype}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must have shape (V, H) with H = hidden.shape[-1] = {hidden.shape[-1]}, got {_shape(weight)}"
        )
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight dtype {weight.dtype} must equal hidden dtype {hidden.dtype}")
    if weight.device != hidden.device:
        raise ValueError(f"weight is on {weight.device} but hidden is on {hidden.device}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != hidden.dtype):
        raise ValueError(
            f"bias must have shape ({weight.shape[0]},) and dtype {hidden.dtype}, got {_shape(bias)} {bias.dtype}"
        )
    if ids.shape != hidden.shape[:-1]:
        raise ValueError(f"ids must have shape {tuple(hidden.shape[:-1])} (hidden.shape[:-1]), got {_shape(ids)}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got {ids.dtype}")


def valid_counts(ids: torch.Tensor, mask: torch.Tensor | None, vocab: int, *, per_sequence: bool = False) -> list[int]:
    """Check that the ids of valid positions lie in [0, vocab); return how many positions are valid.

    The call's one host sync: the ids' range and the counts come back in one read (the chunk loop needs
    the counts on the host to size its cuBLAS GEMMs). Ids at masked positions are never read, so padding
    may hold anything (e.g. -100).

    Args:
        ids: (B, ...) integer ids; mask: ids.shape, nonzero = valid (a bool mask is used as it is); None: every
            position is valid.
        vocab: the vocabulary size V.
        per_sequence: count per leading row of ids (B counts) instead of in total (one count).

    Returns:
        The counts as host ints.
    """
    if mask is not None and tuple(mask.shape) != tuple(ids.shape):
        raise ValueError(f"mask must have shape {tuple(ids.shape)} (the ids' shape), got {_shape(mask)}")
    rows = ids.shape[0] if per_sequence else 1
    if ids.numel() == 0:
        return [0] * rows
    if mask is None:
        seen, counts = ids, None
    else:
        valid = mask if mask.dtype == torch.bool else mask != 0
        seen = torch.where(valid, ids, 0)
        counts = valid.reshape(rows, -1).sum(1)  # [rows]
    extremes = torch.stack(torch.aminmax(seen)).long()  # one reduction for both
    values = (extremes if counts is None else torch.cat([extremes, counts])).tolist()
    if values[0] < 0 or values[1] >= vocab:
        raise ValueError(f"ids must lie in [0, {vocab}) (the vocabulary size)")
    return values[2:] if counts is not None else [ids.numel() // rows] * rows


def check_loss_args(
    hidden: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    old_logps: torch.Tensor | None,
    ref_logps: torch.Tensor | None,
    *,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
    loss_type: str,
    temperature: float,
    max_completion_length: int | None,
    importance_sampling_level: str,
    chunk_tokens: int | None,
) -> None:
    """Check the GRPO loss arguments (shapes against hidden's (B, T, H))."""
    if hidden.dim() != 3:
        raise ValueError(f"hidden must have shape (B, T, H), got {_shape(hidden)}")
    bt = tuple(hidden.shape[:2])
    if tuple(completion_mask.shape) != bt:
        raise ValueError(f"completion_mask must have shape {bt}, got {_shape(completion_mask)}")
    if advantages.shape != bt[:1]:
        raise ValueError(f"advantages must have shape ({bt[0]},) (one per sequence), got {_shape(advantages)}")
    for name, t in (("old_logps", old_logps), ("ref_logps", ref_logps)):
        if t is not None and tuple(t.shape) != bt:
            raise ValueError(f"{name} must have shape {bt}, got {_shape(t)}")
        if t is not None and not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    if importance_sampling_level not in IS_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {', '.join(IS_LEVELS)}, got {importance_sampling_level!r}"
        )
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("ref_logps is required when beta > 0")
    if epsilon_low < 0 or epsilon_high < 0:
        raise ValueError(f"epsilon_low and epsilon_high must be >= 0, got {epsilon_low}, {epsilon_high}")
    check_chunking(temperature, chunk_tokens)
    if loss_type == "dr_grpo" and (max_completion_length is None or max_completion_length <= 0):
        raise ValueError("loss_type 'dr_grpo' needs max_completion_length (a positive int)")


def check_chunking(temperature: float, chunk_tokens: int | None) -> None:
    """Check the options every chunked call takes: temperature > 0, chunk_tokens a positive int or None."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_tokens is not None and (not isinstance(chunk_tokens, int) or chunk_tokens <= 0):
        raise ValueError(f"chunk_tokens must be a positive int or None, got {chunk_tokens!r}")
