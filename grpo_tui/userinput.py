"""What a user typed: a path, with `~` and `~user` expanded where they can be, and a value echoed in an error line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Echoed user values in error lines are cut to this many characters (one input was 100,182).
ECHO_LIMIT = 80


def user_path(text: str | os.PathLike[str]) -> Path:
    """`Path(text).expanduser()`, or the path as typed where `~user` names no user or no home is known
    (pathlib raises there): the caller then finds it missing and says so in one line, as for any path."""
    path = Path(text)
    try:
        return path.expanduser()
    except RuntimeError:
        return path


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` on one printable line, cut to about `limit` characters: a user value or path in an error line."""
    if not text.isprintable():
        # Newlines would split the line; lone surrogates (from undecodable argv bytes) cannot be printed.
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def shorten(value: Any, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)` cut to about `limit` characters: how every error line echoes a user's value."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's int-to-str digit limit
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    except RecursionError:
        return "a value nested too deeply"
    return clip(text, limit)
