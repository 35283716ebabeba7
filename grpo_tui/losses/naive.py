"""loss.impl = naive: the full logits materialised, model(...).logits -> log_softmax -> gather (the baseline)."""

from __future__ import annotations

from typing import Any

from grpo_tui.losses.base import LossImplementation


def naive_logps_and_entropies(
    logits: Any, ids: Any, temperature: float, entropy: bool = True, entropy_grad: bool = False
) -> tuple[Any, Any | None]:
    """Log-probs of `ids` and (if `entropy`) entropies from materialised logits [B, T, V], in fp32.

    The entropy is a logged metric unless an entropy bonus trains on it (`entropy_grad`): outside
    autograd its [B, T, V] intermediates are freed at once instead of being kept for a backward that
    never comes, as TRL computes it.
    """
    import torch

    logps_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    logps = logps_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return logps, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(logps_all.exp() * logps_all).sum(-1)
    return logps, entropies


class NaiveLoss(LossImplementation):
    name = "naive"
    summary = "full logits"
    needs = "the model's own logits (its default forward)"

    def score(self, trainer, model, input_ids, attention_mask, logits_to_keep, targets, compute_entropy):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1).logits
        return naive_logps_and_entropies(
            logits[:, :-1], targets, trainer.temperature, compute_entropy, trainer._entropy_bonus_enabled
        )

    # the loss: TRL's `_compute_loss` over these log-probs (the base's None)
