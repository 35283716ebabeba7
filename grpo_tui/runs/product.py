"""What a run produced, as the app shows it: RUN/model/ (path, size, kind) and eval.json's reward before → after."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from grpo_tui.runs.folder import RunDir, file_stamp, read_json
from grpo_tui.runs.model_dir import KIND_LORA, folder_bytes, human_bytes, read_info


@dataclass(frozen=True)
class RunProduct:
    """A run's model folder (None before it is saved) and its held-out scores (empty before `eval`)."""

    model: Path | None = None
    model_bytes: int = 0
    lora: bool = False
    # Reward name -> (before, after) on the held-out prompts; "reward" is the preset's weighted total.
    scores: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def model_line(self) -> str | None:
        if self.model is None:
            return None
        kind = ", LoRA adapter" if self.lora else ""
        return f"model {self.model} ({human_bytes(self.model_bytes)}{kind})"

    @property
    def eval_line(self) -> str | None:
        """`held-out reward 0.288 → 0.648` (every reward function when there are several)."""
        if not self.scores:
            return None
        parts = [f"{name} {before:.3f} → {after:.3f}" for name, (before, after) in self.scores.items()]
        return "held-out " + " · ".join(parts)


def read_product(run_path: Path) -> RunProduct:
    """The model folder and eval.json of a run folder; missing or malformed files leave their part empty."""
    run = RunDir(Path(run_path))
    model = run.model if run.model.is_dir() else None
    scores: dict[str, tuple[float, float]] = {}
    result = read_json(run.eval) or {}
    rewards = result.get("rewards")
    if isinstance(rewards, dict):
        for name, pair in list(rewards.items())[:16]:
            score = _pair(pair)
            if score is not None:
                scores[str(name)[:40]] = score
    total = _pair(result.get("reward"))
    if total is not None and len(scores) > 1:
        scores["reward"] = total
    return RunProduct(
        model=model,
        model_bytes=folder_bytes(model) if model is not None else 0,
        lora=model is not None and read_info(model).get("kind") == KIND_LORA,
        scores=scores,
    )


def product_stamp(run_path: Path) -> tuple[object, ...]:
    """Changes when the model folder or eval.json does: a reader re-reads the product only then."""
    run = RunDir(Path(run_path))
    return file_stamp(run.model), file_stamp(run.eval)


def _pair(value: object) -> tuple[float, float] | None:
    if not isinstance(value, dict):
        return None
    before, after = value.get("before"), value.get("after")
    numbers = [v for v in (before, after) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) != 2 or not all(math.isfinite(v) for v in numbers):
        return None
    return float(before), float(after)
