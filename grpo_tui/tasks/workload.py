"""Realistic completion lengths, for memory and speed trials of models that never stop on their own.

On reasoning tasks GRPO completions average about a third of `max_completion_length`, with a tail that reaches
it. Random or untrained weights almost never emit EOS, so every completion of a trial would run to the cap and
the trial would measure a step no real run takes. With $GRPO_TUI_COMPLETION_LENGTHS set (`grpo-tui tune` and
`grpo-tui max-batch --lengths realistic` set it on their trials; benchmarks draw from here too), each rollout's
rows end (EOS) at lengths drawn by `realistic_lengths`, or sooner where the model emits EOS itself.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass

from grpo_tui.userinput import shorten

MEAN_SHARE = 0.35  # mean completion length / cap
AT_CAP = 0.10  # share of rows that run to the cap
SHAPE = 2.0  # the Beta distribution's first parameter for the rows below the cap (its mode sits near a fifth)

# Read by each training process: unset, empty or `cap` leaves completions alone.
LENGTHS_ENV = "GRPO_TUI_COMPLETION_LENGTHS"
LENGTH_MODES = ("cap", "realistic")
LENGTHS_ALLOWED = "cap, realistic or realistic:SEED (SEED a whole number of up to 19 digits)"
_REALISTIC = re.compile(r"realistic(?::([0-9]{1,19}))?")  # ASCII digits only: int() would take other scripts'


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


@dataclass(frozen=True)
class ForcedLengths:
    """Realistic lengths drawn per rollout slice, seeded from `seed` and the slice's place in the run."""

    seed: int = 0

    def draw(self, rows: int, cap: int, step: int, rank: int, part: int) -> list[int]:
        """The lengths of one slice: optimizer step `step`, process `rank`, `part`-th slice drawn in that step.
        Two runs with the same seed draw the same lengths (a string's hash would differ per process)."""
        key = f"{self.seed}:{step}:{rank}:{part}".encode()
        return realistic_lengths(rows, cap, int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))

    @property
    def spec(self) -> str:
        return "realistic" if self.seed == 0 else f"realistic:{self.seed}"


def parse_lengths(raw: str, where: str = LENGTHS_ENV) -> ForcedLengths | None:
    """None for `cap` (each completion runs until its own EOS or the cap), the draw for `realistic[:SEED]`;
    anything else is a one-line ValueError naming `where`."""
    if raw == "cap":
        return None
    match = _REALISTIC.fullmatch(raw)
    if match is None:
        raise ValueError(f"{where}: got {shorten(raw)}; allowed: {LENGTHS_ALLOWED}")
    return ForcedLengths(int(match.group(1) or 0))


def forced_lengths_from_env(environ: Mapping[str, str] = os.environ) -> ForcedLengths | None:
    """The draw $GRPO_TUI_COMPLETION_LENGTHS asks for; None when it is unset or empty."""
    raw = environ.get(LENGTHS_ENV)
    return parse_lengths(raw) if raw else None
