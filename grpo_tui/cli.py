"""grpo-tui command line (placeholder until the spine's CLI lands)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("grpo-tui: under construction", file=sys.stderr)
    return 1
