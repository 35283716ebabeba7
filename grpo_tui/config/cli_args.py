"""Command-line arguments shared by every command that takes a preset (argparse only: loads nothing heavy)."""

from __future__ import annotations

import argparse


def add_set_option(parser: argparse.ArgumentParser, example: str = "grpo.max_steps=5", dest: str = "overrides") -> None:
    """`--set KEY=VALUE` (repeatable): a preset field override in TOML value syntax (see config/overrides.py)."""
    parser.add_argument(
        "--set",
        dest=dest,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a field, TOML value syntax (e.g. {example}); repeatable",
    )
