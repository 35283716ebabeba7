"""loss.impl = trl: TRL 1.16's own path, untouched (its fused LM head computes the log-probs)."""

from __future__ import annotations

from grpo_tui.losses.base import LossImplementation


class TrlLoss(LossImplementation):
    name = "trl"
    summary = "TRL's fused head"
    needs = "the model as TRL builds it (TRL's fused-head forward)"
    # scoring and the loss: the base's None, so TRL's own methods run
