"""The last lines of the run's stdout.log (the worker reads; this only draws)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rich.cells import chop_cells
from textual.widgets import Log


def wrap_lines(lines: Iterable[str], width: int) -> Iterator[str]:
    """Each of `lines` cut into rows of at most `width` cells (none cut when the width is not known yet).

    Hard wraps, not at spaces: log lines are paths, tracebacks and shapes, where every character counts.
    """
    for line in lines:
        line = line.rstrip("\r").expandtabs()
        if width <= 0:
            yield line
        else:
            yield from chop_cells(line, width) or [""]


class LogTail(Log):
    """A bounded log view that follows the end unless the user scrolled up; long lines wrap at its
    width (a scroll sideways would be lost at each redraw of a live log), and wrap again on a resize."""

    DEFAULT_CSS = """
    LogTail { height: 1fr; overflow-x: hidden; }
    """

    def __init__(self, max_lines: int = 2000, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=max_lines, auto_scroll=True, id=id, classes=classes)
        self._source: tuple[str, ...] = ()
        self._shown: tuple[tuple[str, ...], int] | None = None

    def show(self, lines: tuple[str, ...]) -> None:
        """Show exactly `lines` (the feed's whole tail); nothing is redrawn when they are already shown."""
        self._source = lines
        self._redraw()

    def on_resize(self) -> None:
        self._redraw()

    def _redraw(self) -> None:
        width = self.scrollable_content_region.width
        if (self._source, width) == self._shown:
            return
        self._shown = (self._source, width)
        self.clear()
        self.write_lines(wrap_lines(self._source, width))
