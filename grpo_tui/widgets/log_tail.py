"""The last lines of the run's stdout.log (the worker reads; this only appends)."""

from __future__ import annotations

from collections.abc import Iterable

from textual.widgets import Log


class LogTail(Log):
    """A bounded log view that follows the end unless the user scrolled up."""

    DEFAULT_CSS = """
    LogTail { height: 1fr; }
    """

    def __init__(self, max_lines: int = 2000, *, id: str | None = None, classes: str | None = None) -> None:  # noqa: A002
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id, classes=classes)

    def add(self, lines: Iterable[str]) -> None:
        self.write_lines(line.rstrip("\r") for line in lines)
