"""One metric against the step; the loss-impl switch steps are vertical rules."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from grpo_tui.dashboard.widgets.braille import Series, render_chart

LINE = "rgb(95,175,255)"


def figure(value: float, spec: str) -> str:
    """`value` formatted with `spec`, or "—" when it is not a finite number (inf / NaN say nothing readable)."""
    return format(value, spec) if math.isfinite(value) else "—"


def non_finite_note(values: Sequence[float]) -> tuple[str, str]:
    """A dim "(N non-finite)" for a title when some points are ±inf or NaN (they are not drawn), else ""."""
    count = sum(1 for v in values if not math.isfinite(v))
    return (f" ({count} non-finite)" if count else "", "dim")


class MetricChart(Widget):
    """A line chart of one series; `show` replaces what is drawn (it never appends)."""

    DEFAULT_CSS = """
    MetricChart { width: 1fr; height: 1fr; min-height: 6; }
    """

    def __init__(self, title: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self.xs: list[float] = []
        self.ys: list[float] = []
        self.switches: list[float] = []
        self.empty_hint = "no data yet"  # the dashboard says "not logged" once the run has steps

    def show(self, xs: Sequence[float], ys: Sequence[float], switches: Sequence[float] = ()) -> None:
        """Draw `ys` over `xs` (already downsampled by the caller) with a rule at each switch."""
        self.xs, self.ys, self.switches = list(xs), list(ys), list(switches)
        self.refresh()

    def chart_title(self) -> Text:
        last = f" {figure(self.ys[-1], '.4g')}" if self.ys else ""
        return Text.assemble((self.title, "bold"), (last, "bold rgb(95,175,255)"), non_finite_note(self.ys))

    def series(self) -> list[Series]:
        return [Series(self.xs, self.ys, LINE)]

    def refresh(self, *regions, **kwargs):  # type: ignore[no-untyped-def,override]
        self._strips = None  # new data or size: draw again on the next render_line
        return super().refresh(*regions, **kwargs)

    def render_line(self, y: int) -> Strip:
        # Line API: the chart becomes strips once per change, skipping Textual's Content conversion.
        width, height = self.size
        if getattr(self, "_strips", None) is None or getattr(self, "_strips_size", None) != (width, height):
            text = render_chart(
                self.series(), width, height, title=self.chart_title(), switches=self.switches, empty=self.empty_hint
            )
            console, base = self.app.console, self.rich_style  # base: the widget's colours from CSS
            self._strips = [
                Strip(list(line.render(console))).adjust_cell_length(width).apply_style(base)
                for line in text.split("\n", allow_blank=True)
            ]
            self._strips_size = (width, height)
        return self._strips[y] if y < len(self._strips) else Strip.blank(width, self.rich_style)
