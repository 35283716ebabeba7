"""Scoring and the loss without padding: rows grouped by completion length, each group cut to its own longest.

TRL pads every completion of a rollout to the longest one, and the backbone computes the padding like real
tokens. At real completion lengths (a third of the cap on average, a tail at the cap) that is most of the
scoring and loss work. Here the rows are sorted by completion length and split into groups; each group's
forward drops the columns after its longest completion. Causal attention makes every kept position's output
independent of the dropped columns, so the log-probs are the padded path's. Prompts stay as they are: they are
left-padded, and cutting their shared padding would move the rotary positions of every token after it.

The groups' row counts depend on the row count only, never on the lengths: under FSDP every rank runs the same
number of forwards (each one gathers the parameters: a collective), and the per-sequence metrics gathered over
ranks after each group's loss have the same shape on every rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from grpo_tui.runs.metrics import TOKEN_PHASES, valid_share_key

# Groups per scoring batch and loss micro-batch by default when the groups run padded (grpo.length_groups unset;
# more where a sub-batch bound asks). Sorted rows in four equal groups, each cut after its own longest completion,
# compute 1.2-1.3x the real tokens at the benchmarks' realistic lengths (mean 35% of the cap, 10% of rows at it;
# 150-token prompts), against 2.2-2.6x padded.
GROUPS = 4
# Packed, no group computes padding, so more groups only lower the activation peak, and each forward's fixed costs
# (host-side Python, kernel launches, FSDP's hooks) are paid again per group. Measured on an H100
# (Qwen3-1.7B shape, LoRA, 32 x 256): the loss phase took 2.6 s in four groups against 1.1 s in one, with or
# without FSDP2, for a peak 2.8 GiB higher (benchmarks/results/fsdp-rollouts-h100/).
PACKED_GROUPS = 1
# Completion caps below this are not split into more forwards than asked: each forward's fixed cost outweighs the
# padding a group saves (the tiny preset, cap 4, on the CPU: four groups made the loss phase 2.4x slower). The cap,
# not the lengths, decides, so that every rank runs as many forwards.
GROUPED_MIN_CAP = 64


class RowGroup(NamedTuple):
    """Rows of a batch computed together, and the completion columns they keep (the rest is padding)."""

    rows: list[int]
    width: int


def forward_count(setting: int | None, packed: bool) -> int:
    """Forwards per scoring batch and loss micro-batch: grpo.length_groups where set, else PACKED_GROUPS for packed
    forwards and GROUPS for padded ones."""
    if setting is not None:
        return setting
    return PACKED_GROUPS if packed else GROUPS


def completion_lengths(completion_mask: torch.Tensor) -> list[int]:
    """Per row: one past the last completion column that is not padding (0 for an empty completion)."""
    mask = completion_mask.bool()
    columns = torch.arange(1, mask.size(1) + 1, device=mask.device)
    return (mask * columns).amax(dim=1).tolist() if mask.size(1) else [0] * mask.size(0)


def _width(length: int) -> int:
    # At least one column: logits_to_keep = 0 means "every position" to transformers and TRL.
    return max(1, length)


def chunk_groups(lengths: Sequence[int], rows: int) -> list[RowGroup]:
    """The rows longest first, in ceil(n / rows) groups of `rows` (the last one smaller), each at its own width."""
    order = sorted(range(len(lengths)), key=lambda r: (-lengths[r], r))
    size = max(1, rows)
    return [
        RowGroup(chunk, _width(lengths[chunk[0]]))
        for chunk in (order[i : i + size] for i in range(0, len(order), size))
    ]


def length_groups(
    lengths: Sequence[int], max_rows: int | None = None, cap: int | None = None, groups: int = GROUPS
) -> list[RowGroup]:
    """The groups a forward pass over these rows runs: sorted rows in groups of ceil(n / `groups`), or of
    `max_rows` where that bound is smaller. Under a completion cap below GROUPED_MIN_CAP: groups of `max_rows` (one
    without), still each cut after its longest completion."""
    if cap is not None and cap < GROUPED_MIN_CAP:
        return chunk_groups(lengths, max_rows or len(lengths))
    size = max(1, math.ceil(len(lengths) / max(1, groups)))
    return chunk_groups(lengths, size if max_rows is None else min(size, max_rows))


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
        self,
        phase: str,
        prompt_mask: torch.Tensor,
        completion_mask: torch.Tensor,
        groups: Sequence[RowGroup],
        packed: bool = False,
    ) -> None:
        """A forward over `groups` of a batch whose real tokens `prompt_mask` and `completion_mask` mark (`packed`:
        each group's real tokens only)."""
        valid = torch.stack([prompt_mask.sum(), completion_mask.sum()]).sum().item()
        self.add(phase, valid, valid if packed else computed_positions(prompt_mask.size(1), groups))

    def take(self) -> dict[str, tuple[int, int]]:
        counts, self._counts = self._counts, {}
        return {phase: (valid, computed) for phase, (valid, computed) in counts.items()}


def share_fields(per_rank: Sequence[dict[str, tuple[int, int]]]) -> dict[str, float]:
    """The step record's valid-token share per phase, over every rank's counts (phases that computed nothing
    are left out)."""
    fields = {}
    for phase in TOKEN_PHASES:
        valid = sum(counts[phase][0] for counts in per_rank if phase in counts)
        computed = sum(counts[phase][1] for counts in per_rank if phase in counts)
        if computed > 0:
            fields[valid_share_key(phase)] = round(min(1.0, valid / computed), 4)
    return fields
