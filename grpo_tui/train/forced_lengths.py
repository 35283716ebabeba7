"""Completions that end at given lengths on TRL's generate path (`generate` and `static` backends), for
$GRPO_TUI_COMPLETION_LENGTHS (`tasks.workload`). The graph decoder takes the lengths itself (`StaticDecoder`'s
`lengths`); transformers' `generate` takes them as a logits processor. TRL calls `generate` with no
processor of ours, so the model's `generate` is wrapped for the one call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList


class EndAtLengths(LogitsProcessor):
    """Row i chooses EOS as its lengths[i]-th completion token (if it has not ended before): every other token's
    score is -inf there, so greedy search and sampling (any warper after this one) both take EOS."""

    def __init__(self, lengths: list[int], eos_id: int) -> None:
        self.eos_id = eos_id
        self.rows_due: dict[int, list[int]] = {}  # completion token number -> the rows that end with it
        for row, length in enumerate(lengths):
            self.rows_due.setdefault(length, []).append(row)
        self.prompt_width: int | None = None  # the first call sees the (padded) prompts alone

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_width is None:
            self.prompt_width = input_ids.size(1)
        rows = self.rows_due.get(input_ids.size(1) - self.prompt_width + 1)  # decided on the host: no wait
        if rows is None:
            return scores
        index = torch.tensor(rows, device=scores.device)
        scores = scores.index_fill(0, index, float("-inf"))
        scores[index, self.eos_id] = 0.0
        return scores


@contextmanager
def ending_at(model: Any, lengths: list[int], eos_id: int) -> Iterator[None]:
    """Within the block, `model.generate` ends row i at lengths[i] tokens at the latest."""
    plain, own = model.generate, model.__dict__.get("generate")

    def generate(*args: Any, **kwargs: Any) -> Any:
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(EndAtLengths(lengths, eos_id))
        return plain(*args, logits_processor=processors, **kwargs)

    model.generate = generate  # an instance attribute: the class's method is untouched
    try:
        yield
    finally:
        if own is None:
            del model.generate
        else:
            model.generate = own
