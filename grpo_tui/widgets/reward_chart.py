"""Mean reward with a ±std band and one line per reward function, x = step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from grpo_tui.widgets.metric_chart import SWITCH, MetricChart, step_ticks

MEAN = (80, 220, 120)
BAND = (40, 90, 60)
FUNC_COLOURS = [(95, 175, 255), (215, 135, 255), (255, 135, 95), (255, 215, 95), (135, 215, 215)]


class RewardChart(MetricChart):
    """The run's main curve; the band is mean ± reward_std, shaded."""

    DEFAULT_CSS = """
    RewardChart { height: 2fr; min-height: 10; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:  # noqa: A002
        super().__init__("reward", id=id, classes=classes)
        self.funcs: dict[str, tuple[list[float], list[float]]] = {}

    def show_reward(self, xs: Sequence[float], mean: Sequence[float], std: Sequence[float],
                    funcs: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
                    switches: Sequence[int] = ()) -> None:
        """Draw the mean, its ±std band, each reward function's mean and the switch markers."""
        self.xs, self.ys = list(xs), list(mean)
        self.funcs = {k: (list(a), list(b)) for k, a, b in ((k, *v) for k, v in (funcs or {}).items())}
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        if not self.xs:
            self.refresh()
            return
        upper = [m + s for m, s in zip(mean, std)]
        lower = [m - s for m, s in zip(mean, std)]
        plt.title(f"reward  mean {self.ys[-1]:.3f} ± {std[-1]:.3f}")
        # The band: the upper edge filled down, then the lower edge in the same colour as lines.
        plt.plot(self.xs, upper, marker="braille", color=BAND, label="±std")
        plt.plot(self.xs, lower, marker="braille", color=BAND)
        for i, (name, (fx, fy)) in enumerate(self.funcs.items()):
            plt.plot(fx, fy, marker="braille", color=FUNC_COLOURS[i % len(FUNC_COLOURS)], label=name)
        plt.plot(self.xs, self.ys, marker="hd", color=MEAN, label="mean")
        step_ticks(plt, self.xs, 7)
        for step in switches:
            plt.vline(step, SWITCH)
        self.refresh()
