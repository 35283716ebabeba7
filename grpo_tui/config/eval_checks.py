"""Pre-launch checks of the `[eval]` section: a held-out source that cannot load, or a reward that does not
exist, would otherwise surface only when the run has finished training."""

from __future__ import annotations

import re

from grpo_tui.config.schema import Preset
from grpo_tui.tasks.data import BUILTIN_ADDITION, LOCAL_SUFFIXES
from grpo_tui.tasks.rewards import REWARDS
from grpo_tui.userinput import shorten, user_path

_ALLOWED = (
    "empty (rows of data.source), builtin:addition, a hub id (openai/gsm8k), or a local .jsonl/.json/.parquet file"
)


def eval_errors(preset: Preset, hub_id: re.Pattern[str]) -> list[str]:
    """One line per problem of `preset.eval` (dotted path, value, what is allowed); `hub_id` matches the
    hub ids data.source accepts."""
    errors = []
    source = preset.eval.source
    if source:
        path = user_path(source)
        if source.startswith("builtin:"):
            if source != BUILTIN_ADDITION:
                errors.append(f"eval.source: got {shorten(source)}; allowed: {_ALLOWED}")
        elif path.suffix in LOCAL_SUFFIXES:
            try:
                found = path.is_file()
            except OSError:
                found = False
            if not found:
                errors.append(f"eval.source: got {shorten(source)}; no such file")
        elif source.startswith(("/", "./", "../", "~")) or not hub_id.match(source):
            errors.append(f"eval.source: got {shorten(source)}; allowed: {_ALLOWED}")
    for index, name in enumerate(preset.eval.rewards):
        if ":" not in name and name not in REWARDS:
            known = ", ".join(sorted(REWARDS))
            errors.append(
                f"eval.rewards.{index}: got {shorten(name)}; registered rewards: {known} (or module:function)"
            )
    return errors
