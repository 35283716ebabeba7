"""Mean reward with a ±std band and one line per reward function, x = step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text

from grpo_tui.dashboard.widgets.braille import SWITCH_STYLE, Series
from grpo_tui.dashboard.widgets.metric_chart import MetricChart, figure, non_finite_note

MEAN = "rgb(50,140,80)"
SMOOTH = "bold rgb(120,255,150)"
# Weight of the past in the smoothed mean (TensorBoard-style EMA): the trend through noisy steps.
SMOOTHING = 0.9
BAND = "rgb(45,100,65)"
FUNC_STYLES = ["rgb(95,175,255)", "rgb(215,135,255)", "rgb(255,135,95)", "rgb(255,215,95)", "rgb(135,215,215)"]


class RewardChart(MetricChart):
    """The run's main curve; the band is mean ± reward_std (drawn first, so lines stay on top)."""

    DEFAULT_CSS = """
    RewardChart { height: 2fr; min-height: 10; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("reward", id=id, classes=classes)
        self.std: list[float] = []
        self.funcs: dict[str, tuple[list[float], list[float]]] = {}

    def show_reward(
        self,
        xs: Sequence[float],
        mean: Sequence[float],
        std: Sequence[float],
        funcs: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
        switches: Sequence[float] = (),
    ) -> None:
        """Draw the mean, its ±std band, each reward function's mean and the switch rules."""
        self.xs, self.ys, self.std = list(xs), list(mean), list(std)
        self.funcs = {name: (list(fx), list(fy)) for name, (fx, fy) in (funcs or {}).items()}
        self.switches = list(switches)
        self.refresh()

    def chart_title(self) -> Text:
        title = Text("reward", style="bold")
        if not self.ys:
            return title
        mean, std = figure(self.ys[-1], ".3f"), figure(self.std[-1], ".3f") if self.std else "—"
        note, dim = non_finite_note(self.ys)
        if note:
            title.append(f"  mean {mean} ± {std}", style="bold rgb(80,220,120)")
            title.append(note, dim)
            title.append("   ", style="bold rgb(80,220,120)")
        else:
            title.append(f"  mean {mean} ± {std}   ", style="bold rgb(80,220,120)")
        title.append("━ smooth ", SMOOTH)
        title.append("━ mean ", MEAN)
        title.append("━ ±std ", BAND)
        for i, name in enumerate(self.funcs):
            title.append(f"━ {name} ", FUNC_STYLES[i % len(FUNC_STYLES)])
        if self.switches:
            title.append("│ impl switch", SWITCH_STYLE)
        return title

    def series(self) -> list[Series]:
        upper = [m + s for m, s in zip(self.ys, self.std)]
        lower = [m - s for m, s in zip(self.ys, self.std)]
        lines = [Series(self.xs, upper, BAND), Series(self.xs, lower, BAND)]
        lines += [Series(fx, fy, FUNC_STYLES[i % len(FUNC_STYLES)]) for i, (fx, fy) in enumerate(self.funcs.values())]
        return lines + [Series(self.xs, self.ys, MEAN), Series(self.xs, ema(self.ys, SMOOTHING), SMOOTH)]


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average, debiased at the start (so it does not rise from zero)."""
    out, avg, norm = [], 0.0, 0.0
    for value in values:
        avg = weight * avg + (1 - weight) * value
        norm = weight * norm + (1 - weight)
        out.append(avg / norm)
    return out
