"""Chart titles never print inf or nan: a dash, and how many points were not finite."""

from __future__ import annotations

import math

from grpo_tui.dashboard.widgets.metric_chart import MetricChart
from grpo_tui.dashboard.widgets.reward_chart import RewardChart


def test_reward_title_with_non_finite_values() -> None:
    chart = RewardChart()
    chart.show_reward([1, 2, 3], [0.5, math.inf, math.inf], [0.1, 0.0, math.nan])
    title = chart.chart_title().plain
    assert "mean — ± —" in title and "(2 non-finite)" in title
    assert "inf" not in title and "nan" not in title


def test_metric_title_with_a_nan_last_value() -> None:
    chart = MetricChart("loss")
    chart.xs, chart.ys = [1, 2], [0.25, math.nan]
    assert chart.chart_title().plain == "loss — (1 non-finite)"
    chart.ys = [0.25, 0.5]
    assert chart.chart_title().plain == "loss 0.5"
