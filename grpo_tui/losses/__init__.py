"""The loss implementations (`loss.impl`): one class per implementation, one registry.

Adding one takes a new module here with a `LossImplementation` subclass and one line in `IMPLEMENTATIONS`
(docs/architecture.md shows it). The schema's `loss.impl` values, the refusals `presets validate` and the trainer
apply, and the trainer's scoring and loss all read this registry.
"""

from __future__ import annotations

from grpo_tui.losses.base import LossImplementation, LossImplError, LossSettings, LossSpec, Refusal
from grpo_tui.losses.chunked import ChunkedLoss
from grpo_tui.losses.naive import NaiveLoss
from grpo_tui.losses.trl import TrlLoss

IMPLEMENTATIONS: dict[str, LossImplementation] = {impl.name: impl for impl in (ChunkedLoss(), NaiveLoss(), TrlLoss())}


def refusals(impl: str, settings: LossSettings) -> list[Refusal]:
    """The rows of the one refusal table that stop `impl` under `settings` (empty: it can run)."""
    return IMPLEMENTATIONS[impl].refused(settings)


__all__ = ["IMPLEMENTATIONS", "LossImplError", "LossImplementation", "LossSettings", "LossSpec", "Refusal", "refusals"]
