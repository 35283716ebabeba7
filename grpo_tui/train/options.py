"""What grpo-tui adds to TRL's GRPOConfig, as one typed object the trainer takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_tui.losses import LossSpec


@dataclass(frozen=True)
class TrainerOptions:
    """The preset's settings that TRL's GRPOConfig has no field for (`build_trainer` reads them off a preset)."""

    loss: LossSpec = field(default_factory=lambda: LossSpec(impl="trl"))
    generation_sub_batch: int | None = None
    generation_backend: str = "auto"
    decode_copy: str = "keep"
    finished_rows: str = "compact"
    scoring_sub_batch: int | None = None
    loss_sub_batch: int | None = None
    activation_offload: bool = False
    padding_free: bool = False
    length_groups: int | None = None  # grpo.length_groups (None: `length_groups.forward_count` picks)
    sdpa_kernels: tuple[str, ...] = ()  # model.sdpa_kernels: held for the whole step (`training_attention`)
    compile_layers: bool = False  # model.compile_layers (`layer_compile`)
    profile_dir: str | None = None  # $GRPO_TUI_PROFILE_STEP profiles one step into it; None: no profiling

    @classmethod
    def from_preset(cls, preset: Any, profile_dir: str | None = None) -> TrainerOptions:
        g = preset.grpo
        return cls(
            loss=LossSpec.from_preset(preset),
            generation_sub_batch=g.generation_sub_batch,
            generation_backend=g.generation_backend,
            decode_copy=g.decode_copy,
            finished_rows=g.finished_rows,
            scoring_sub_batch=g.scoring_sub_batch,
            loss_sub_batch=g.loss_sub_batch,
            activation_offload=g.activation_offload,
            padding_free=g.padding_free,
            length_groups=g.length_groups,
            sdpa_kernels=tuple(preset.model.sdpa_kernels),
            compile_layers=preset.model.compile_layers,
            profile_dir=profile_dir,
        )
