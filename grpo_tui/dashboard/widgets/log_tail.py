"""The last lines of the run's stdout.log (the worker reads; this only draws)."""

from __future__ import annotations

from textual.widgets import Log


class LogTail(Log):
    """A bounded log view that follows the end unless the user scrolled up."""

    DEFAULT_CSS = """
    LogTail { height: 1fr; }
    """

    def __init__(self, max_lines: int = 2000, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id, classes=classes)
        self._shown: tuple[str, ...] | None = None

    def show(self, lines: tuple[str, ...]) -> None:
        """Show exactly `lines` (the feed's whole tail); nothing is redrawn when they are already shown."""
        if lines == self._shown:
            return
        self._shown = lines
        self.clear()
        self.write_lines(line.rstrip("\r") for line in lines)
