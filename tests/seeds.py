"""Seeds for tests that draw random inputs: fixed per test and call, so CI sees the same inputs every run;
GRPO_TEST_RANDOM_SEEDS=1 draws fresh ones to explore (a failure then names its seed, to pin it as a case)."""

from __future__ import annotations

import os
import zlib

import torch

_CALLS: dict[str, int] = {}


def next_seed() -> int:
    """The seed for this test's next draw (its id and how many it drew before)."""
    if os.environ.get("GRPO_TEST_RANDOM_SEEDS"):
        return torch.seed() % 2**31
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    _CALLS[test] = _CALLS.get(test, -1) + 1
    return zlib.crc32(f"{test}#{_CALLS[test]}".encode()) % 2**31
