"""Command-line arguments shared by every command that takes a preset (argparse only: loads nothing heavy)."""

from __future__ import annotations

import argparse

from grpo_tui.tasks.workload import parse_lengths


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


def lengths_arg(text: str) -> str:
    """--lengths: `cap` or `realistic[:SEED]` (`tasks.workload.parse_lengths`), kept as given for the trials."""
    try:
        parse_lengths(text, "--lengths")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--lengths: ")) from None
    return text


def add_lengths_option(parser: argparse.ArgumentParser) -> None:
    """`--lengths cap|realistic[:SEED]` of the tools whose trials are training runs (`tasks.workload`)."""
    parser.add_argument(
        "--lengths",
        type=lengths_arg,
        default="cap",
        metavar="cap|realistic[:SEED]",
        help="completion lengths of each trial: cap (each runs to its EOS or max_completion_length; an untrained "
        "model's run to the cap) or realistic (they end at seeded lengths averaging ~35%% of the cap; default cap)",
    )
