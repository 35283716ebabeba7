"""Scoring and the loss without padding: rows grouped by completion length, each group cut to its own longest.

TRL pads every completion of a rollout to the longest one, and the backbone computes the padding like real
tokens. At real completion lengths (a third of the cap on average, a tail at the cap) that is most of the
scoring and loss work. Here the rows are sorted by completion length and split into groups; each group's
forward drops the columns after its longest completion. Causal attention makes every kept position's output
independent of the dropped columns, so the log-probs are the padded path's. Prompts stay as they are: they are
left-padded, and cutting their shared padding would move the rotary positions of every token after it.

The number of groups depends on the row count only, never on the lengths, so under FSDP every rank runs the
same number of forwards (each one gathers the parameters: a collective).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

# Fewest groups per scoring batch and loss micro-batch. Sorted rows in four groups, each cut at its own longest completion, leave about
# 1.1-1.25x the real tokens at real length distributions (benchmarks' realistic workload: 10% of rows at the
# cap), against 2.2-2.6x for the padded micro-batch; more groups gain little and make each forward smaller.
MIN_GROUPS = 4


class RowGroup(NamedTuple):
    """Rows of a batch computed together, and the completion columns they keep (the rest is padding)."""

    rows: list[int]
    width: int


def completion_lengths(completion_mask: torch.Tensor) -> list[int]:
    """Per row: one past the last completion column that is not padding (0 for an empty completion)."""
    mask = completion_mask.bool()
    columns = torch.arange(1, mask.size(1) + 1, device=mask.device)
    return (mask * columns).amax(dim=1).tolist() if mask.size(1) else [0] * mask.size(0)


def _width(length: int) -> int:
    # At least one column: logits_to_keep = 0 means "every position" to transformers and TRL.
    return max(1, length)


def chunk_groups(lengths: Sequence[int], rows: int) -> list[RowGroup]:
    """The rows longest first, in ceil(n / rows) groups of `rows` (the last one smaller), each at its own width.

    Used where the group size is a memory bound on each forward (scoring), so the forward count stays what it
    was with padding."""
    order = sorted(range(len(lengths)), key=lambda r: (-lengths[r], r))
    size = max(1, rows)
    return [
        RowGroup(chunk, _width(lengths[chunk[0]]))
        for chunk in (order[i : i + size] for i in range(0, len(order), size))
    ]


def balanced_groups(lengths: Sequence[int], groups: int, max_rows: int | None = None) -> list[RowGroup]:
    """The rows longest first, split into exactly min(groups, n) groups (more where `max_rows` needs them)
    with the least computed positions: the sum over groups of rows x width, each group at its longest row.

    Dynamic programming over the sorted rows, one vector operation per (group, row): O(groups x n) of them."""
    n = len(lengths)
    if n == 0:
        return []
    limit = n if max_rows is None else max(1, min(max_rows, n))
    count = min(n, max(groups, math.ceil(n / limit)))
    order = sorted(range(n), key=lambda r: (-lengths[r], r))
    widths = torch.tensor([_width(lengths[r]) for r in order], dtype=torch.float64)
    starts = torch.arange(n + 1, dtype=torch.float64)
    # cost[k][i]: least positions for the first i sorted rows in k groups; cut[k][i]: where the last group starts.
    # Sorted longest first, a group starting at row j has width widths[j].
    cost = torch.full((count + 1, n + 1), math.inf, dtype=torch.float64)
    cut = torch.zeros((count + 1, n + 1), dtype=torch.long)
    cost[0, 0] = 0.0
    for k in range(1, count + 1):
        for i in range(k, n + 1):
            lo = max(k - 1, i - limit)
            values = cost[k - 1, lo:i] + (i - starts[lo:i]) * widths[lo:i]
            best = int(torch.argmin(values))
            cost[k, i], cut[k, i] = values[best], lo + best
    bounds, i = [], n
    for k in range(count, 0, -1):
        j = int(cut[k, i])
        bounds.append((j, i))
        i = j
    return [RowGroup(order[a:b], int(widths[a])) for a, b in reversed(bounds)]


def length_groups(lengths: Sequence[int], max_rows: int | None = None) -> list[RowGroup]:
    """The groups a forward pass over these rows runs: MIN_GROUPS least-work groups, or, where `max_rows` already
    needs as many, groups of `max_rows` sorted rows (the split the memory bound asks for; the search would be slow)."""
    if max_rows is not None and math.ceil(len(lengths) / max(1, max_rows)) >= MIN_GROUPS:
        return chunk_groups(lengths, max_rows)
    return balanced_groups(lengths, MIN_GROUPS, max_rows)


def computed_positions(prompt_width: int, groups: Sequence[RowGroup]) -> int:
    """Token positions the forwards over `groups` compute (prompt columns included)."""
    return sum(len(g.rows) * (prompt_width + g.width) for g in groups)


class TokenCounts:
    """One process's real and computed token positions per phase since the last `take` (the step record's
    `tokens/valid_share/<phase>`)."""

    def __init__(self) -> None:
        self._counts: dict[str, list[int]] = {}

    def add(self, phase: str, valid: int, computed: int) -> None:
        counts = self._counts.setdefault(phase, [0, 0])
        counts[0] += int(valid)
        counts[1] += int(computed)

    def add_groups(
        self, phase: str, prompt_mask: torch.Tensor, completion_mask: torch.Tensor, groups: Sequence[RowGroup]
    ) -> None:
        """A forward over `groups` of a batch whose real tokens `prompt_mask` and `completion_mask` mark."""
        valid = torch.stack([prompt_mask.sum(), completion_mask.sum()]).sum().item()
        self.add(phase, valid, computed_positions(prompt_mask.size(1), groups))

    def take(self) -> dict[str, tuple[int, int]]:
        counts, self._counts = self._counts, {}
        return {phase: (valid, computed) for phase, (valid, computed) in counts.items()}


def share_fields(per_rank: Sequence[dict[str, tuple[int, int]]]) -> dict[str, float]:
    """The step record's valid-token share per phase, over every rank's counts (phases that computed nothing
    are left out)."""
    from grpo_tui.runs.metrics import TOKEN_PHASES, valid_share_key

    fields = {}
    for phase in TOKEN_PHASES:
        valid = sum(counts[phase][0] for counts in per_rank if phase in counts)
        computed = sum(counts[phase][1] for counts in per_rank if phase in counts)
        if computed > 0:
            fields[valid_share_key(phase)] = round(min(1.0, valid / computed), 4)
    return fields
