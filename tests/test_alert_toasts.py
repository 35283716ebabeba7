"""Alert toasts: a repeating alert is one toast with a count, and an opened run's history flashes nothing."""

from __future__ import annotations

from grpo_tui.dashboard.alert_toasts import TOAST_EVERY_S, AlertToasts
from grpo_tui.dashboard.alerts import Alert


def collapse(step: int) -> Alert:
    return Alert("entropy_collapse", "warning", step, f"entropy fell at step {step}")


def test_repeats_are_one_toast_with_a_count() -> None:
    toasts = AlertToasts(opened_at_step=0)
    first = toasts.take([collapse(10)], now=100.0)
    assert [t.title for t in first] == ["⚠ entropy_collapse at step 10"]
    assert toasts.take([collapse(s) for s in range(20, 100, 10)], now=110.0) == []  # 8 repeats, no pile
    later = toasts.take([collapse(100)], now=100.0 + TOAST_EVERY_S)
    assert len(later) == 1 and later[0].message.endswith("(and 8 more since the last notice; see the Alerts tab)")
    other = toasts.take([Alert("stall", "error", 101, "no step")], now=100.0 + TOAST_EVERY_S)
    assert [(t.title, t.severity) for t in other] == [("⚠ stall at step 101", "error")]


def test_an_opened_runs_alerts_are_history() -> None:
    toasts = AlertToasts(opened_at_step=500)
    assert toasts.take([collapse(s) for s in range(10, 510, 10)], now=0.0) == []
    assert len(toasts.take([collapse(510)], now=1.0)) == 1
