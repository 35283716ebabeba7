"""The protocol every loss implementation follows, and the settings that decide what it refuses.

A loss implementation (`loss.impl`) says what it is (`name`, `summary`), what it needs from the model
(`needs`, `prepare_model`), what it refuses and why (`refusals`: rows of the one table that `presets validate`
and the trainer both read), which preset fields tune its memory (`memory_options`), how it scores log-probs
(`score`) and how it computes the training loss (`loss`). Torch and the kernels load inside the methods, so
the config stage (and the CLI's start-up) can read the declarations without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple


class LossImplError(ValueError):
    """A loss implementation that cannot run with this configuration (one user-facing line)."""


@dataclass(frozen=True)
class LossSettings:
    """What decides whether an implementation can run: from a preset before launch, from the trainer's GRPOConfig
    and model once built (which also holds settings a preset cannot make, such as an entropy bonus)."""

    loss_type: str
    beta: float = 0.0
    lm_head_adapted: bool = False  # a LoRA adapter on the output projection
    use_vllm: bool = False
    top_entropy_quantile: float = 1.0
    off_policy_mask_threshold: float | None = None
    entropy_bonus: bool = False
    delta: float | None = None
    bias_correction_kl: bool = False
    aux_loss: bool = False  # a router's auxiliary loss (mixture-of-experts models)

    @classmethod
    def from_preset(cls, preset: Any) -> LossSettings:
        """The settings a preset states (the rest keep TRL's defaults, as the config map leaves them)."""
        return cls(
            loss_type=preset.grpo.loss_type,
            beta=preset.grpo.beta,
            lm_head_adapted=preset.peft.enabled and "lm_head" in preset.peft.target_modules,
            use_vllm=preset.grpo.generation_backend == "vllm",
        )


class Refusal(NamedTuple):
    """One row of the refusal table: `impl` cannot run when `applies(settings)`; the line says why."""

    impl: str
    setting: str  # the dotted preset field, or the GRPOConfig name a preset cannot set
    applies: Callable[[LossSettings], bool]
    reason: str  # after "<setting>: ", one line: what is wrong and what to do

    def line(self) -> str:
        return f"{self.setting}: {self.reason}"


@dataclass(frozen=True)
class LossSpec:
    """The preset's `[loss]` section as the trainer uses it."""

    impl: str
    chunk_tokens: int | None = None
    lean: bool = False

    @classmethod
    def from_preset(cls, preset: Any) -> LossSpec:
        return cls(impl=preset.loss.impl, chunk_tokens=preset.loss.chunk_tokens, lean=preset.loss.lean)


class LossImplementation:
    """Base of the loss implementations: one subclass per `loss.impl`, registered in `grpo_tui.losses`."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line: how it computes the log-probs
    needs: ClassVar[str]  # what it takes from the model
    memory_options: ClassVar[tuple[str, ...]] = ()  # preset fields that tune its memory
    refusals: ClassVar[tuple[Refusal, ...]] = ()

    def refused(self, settings: LossSettings) -> list[Refusal]:
        """The rows of the table that stop this implementation under `settings`."""
        return [row for row in self.refusals if row.applies(settings)]

    def prepare_model(self, model: Any) -> None:
        """Fit a model for this implementation before training (every registered one runs: impls switch live)."""

    def score(self, trainer: Any, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
              targets: Any, compute_entropy: bool) -> tuple[Any, Any] | None:  # fmt: skip
        """(log-probs [B, T], entropies or None) of `targets` for one batch; None: TRL's own scoring runs."""
        return None

    def loss(self, trainer: Any, model: Any, inputs: dict[str, Any]) -> Any | None:
        """The training loss of one micro-batch, as TRL's `_compute_loss` returns it; None: TRL's own runs."""
        return None


def peft_base(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper (the model itself without one)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def loss_mask(inputs: dict[str, Any]) -> Any:
    """The mask TRL's loss normalises by: completion tokens, minus tool output where there is any."""
    mask = inputs["completion_mask"]
    return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]
