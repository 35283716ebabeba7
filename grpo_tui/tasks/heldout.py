"""Held-out prompts for `[eval]`: which rows are scored, and which of the training rows training never sees.

With `eval.source` set, the held-out prompts are `eval.prompts` rows of that source and split (for GSM8K
presets, the test split: questions the train split does not hold), drawn by `eval.seed`. Without it, the
held-out prompts are rows of `data.source` itself: a permutation by `eval.seed` picks `eval.prompts` of
them (at most half the rows), and `training_rows` drops every row with one of those prompts from the
training data, so a run never trains on a prompt it is scored on.
"""

from __future__ import annotations

import random
from typing import Any


def heldout_indices(total: int, count: int, seed: int, limit_half: bool = True) -> list[int]:
    """The row indices held out of `total` rows: `count` of them (at most half with `limit_half`), by `seed`."""
    keep = min(count, total // 2 if limit_half else total)
    return sorted(random.Random(seed).sample(range(total), keep))


def training_rows(dataset: Any, eval_section: Any) -> Any:
    """`dataset` (the prompt dataset of data.source) without the rows held out for evaluation."""
    if eval_section.source:
        return dataset  # evaluation reads another source: nothing to hold out
    prompts = dataset["prompt"]
    # By content, not only by index: a source may hold the same problem twice (random addition pairs repeat)
    held = {repr(prompts[i]) for i in heldout_indices(len(dataset), eval_section.prompts, eval_section.seed)}
    return dataset.select([i for i, prompt in enumerate(prompts) if repr(prompt) not in held])


def eval_rows(preset: Any, tokenizer: Any = None) -> Any:
    """The held-out prompt rows (a `datasets.Dataset` with a `prompt` column and the data's own columns)."""
    from grpo_tui.tasks.data import build_prompt_dataset

    section = preset.eval
    if section.source:
        data = preset.data.model_copy(update={"source": section.source, "split": section.split, "max_samples": None})
        rows = build_prompt_dataset(data, tokenizer, preset.grpo.max_prompt_length)
        return rows.select(heldout_indices(len(rows), section.prompts, section.seed, limit_half=False))
    rows = build_prompt_dataset(preset.data, tokenizer, preset.grpo.max_prompt_length)
    return rows.select(heldout_indices(len(rows), section.prompts, section.seed))
