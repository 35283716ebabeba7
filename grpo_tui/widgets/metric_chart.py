"""One metric against the step, drawn with plotext; the loss-impl switch steps are vertical lines."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import RenderResult
from textual_plotext import PlotextPlot

# Colours as RGB so they read the same on every terminal theme.
LINE = (95, 175, 255)
SWITCH = (255, 175, 0)
EMPTY_HINT = "no data yet"


class MetricChart(PlotextPlot):
    """A line chart of one series; `show` replaces what is drawn (it never appends)."""

    DEFAULT_CSS = """
    MetricChart { height: 1fr; min-height: 6; }
    """

    def __init__(self, title: str, *, id: str | None = None, classes: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id, classes=classes)
        self.title = title
        self.xs: list[float] = []
        self.ys: list[float] = []

    def on_mount(self) -> None:
        super().on_mount()
        self._draw([], [], ())

    def render(self) -> RenderResult:
        if not self.xs:  # plotext would draw empty axes; say plainly that nothing is logged yet
            return Text.assemble((self.title, "bold"), "\n\n", (EMPTY_HINT, "dim"), justify="center")
        return super().render()

    def show(self, xs: Sequence[float], ys: Sequence[float], switches: Sequence[int] = ()) -> None:
        """Draw `ys` over `xs` (already downsampled by the caller) with a marker at each switch."""
        self.xs, self.ys = list(xs), list(ys)
        self._draw(self.xs, self.ys, switches)
        self.refresh()

    def _draw(self, xs: list[float], ys: list[float], switches: Sequence[int]) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        last = f" {ys[-1]:.4g}" if ys else ""
        plt.title(self.title + last)
        if not xs:
            return
        plt.plot(xs, ys, marker="braille", color=LINE)
        step_ticks(plt, xs, 4 if self.size.width < 50 else 6)
        _mark_switches(plt, switches)


def step_ticks(plt: object, xs: Sequence[float], count: int = 5) -> None:
    """Whole-number step ticks (plotext would label 75.8)."""
    lo, hi = int(xs[0]), int(xs[-1])
    if hi <= lo:
        return
    ticks = sorted({round(lo + (hi - lo) * i / (count - 1)) for i in range(count)})
    plt.xticks(ticks, [str(t) for t in ticks])  # type: ignore[attr-defined]


def _mark_switches(plt: object, switches: Sequence[int]) -> None:
    for step in switches:
        plt.vline(step, SWITCH)  # type: ignore[attr-defined]
