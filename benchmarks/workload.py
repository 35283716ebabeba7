"""Benchmarks' realistic completion lengths: on reasoning tasks GRPO completions average about a third of
`max_completion_length`, with a tail that reaches it. Random weights almost never emit EOS, so benchmarks force it
at lengths drawn here: the same seeded draw for every implementation compared."""

from __future__ import annotations

import random

MEAN_SHARE = 0.35  # mean completion length / cap
AT_CAP = 0.10  # share of rows that run to the cap
SHAPE = 2.0  # the Beta distribution's first parameter for the rows below the cap (its mode sits near a fifth)


def realistic_lengths(rows: int, cap: int, seed: int = 0) -> list[int]:
    """`rows` completion lengths in 1..cap: round(AT_CAP x rows) of them at the cap, the others from a Beta
    distribution scaled to the cap whose mean makes the whole draw's expected mean MEAN_SHARE x cap."""
    if rows < 1 or cap < 1:
        raise ValueError(f"realistic_lengths: got rows={rows}, cap={cap}; allowed: both at least 1")
    rng = random.Random(seed)
    at_cap = round(AT_CAP * rows)
    below = (MEAN_SHARE - AT_CAP) / (1 - AT_CAP)  # the mean share of the other rows
    beta = SHAPE * (1 - below) / below
    lengths = [cap] * at_cap + [
        max(1, min(cap - 1, round(cap * rng.betavariate(SHAPE, beta)))) for _ in range(rows - at_cap)
    ]
    rng.shuffle(lengths)
    return lengths
