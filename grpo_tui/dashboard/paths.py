"""Paths as a user reads them in titles: relative to the working folder, else under ~, else absolute."""

from __future__ import annotations

from pathlib import Path

from grpo_tui.userinput import user_path


def shown_path(path: Path) -> str:
    """`runs`, `~/.config/grpo-tui/presets/x.toml` or `/scratch/runs`: the shortest honest spelling."""
    path = user_path(path).absolute()
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        return prefix + str(rel) if str(rel) != "." else (prefix.rstrip("/") or ".")
    return str(path)
