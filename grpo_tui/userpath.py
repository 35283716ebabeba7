"""A path as a user typed it, with `~` and `~user` expanded where they can be."""

from __future__ import annotations

import os
from pathlib import Path


def user_path(text: str | os.PathLike[str]) -> Path:
    """`Path(text).expanduser()`, or the path as typed where `~user` names no user or no home is known
    (pathlib raises there): the caller then finds it missing and says so in one line, as for any path."""
    path = Path(text)
    try:
        return path.expanduser()
    except RuntimeError:
        return path
