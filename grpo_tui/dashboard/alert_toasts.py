"""Which alerts flash as toasts: new ones only, and one toast per kind in a while.

An alert that repeats (entropy_collapse every ~10 steps on tiny-cpu) would stack toasts over the panels
and dialogs. A kind is toasted at most once per TOAST_EVERY_S; repeats meanwhile are counted into its
next toast. Alerts of the steps a run already had when it was opened are its history: listed in the
alerts tab, never flashed (a long run's history arrives after its first view, when it is read whole).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from grpo_tui.dashboard.alerts import Alert

# Seconds between two toasts of one alert kind.
TOAST_EVERY_S = 30.0


class Toast(NamedTuple):
    title: str
    message: str
    severity: str  # "warning" | "error"


class AlertToasts:
    """Turns the alerts a view adds into toasts; `opened_at_step` alerts and older are history."""

    def __init__(self, opened_at_step: int) -> None:
        self.opened_at_step = opened_at_step
        self._last: dict[str, float] = {}  # kind -> time of its last toast
        self._held: dict[str, int] = {}  # kind -> alerts of it since then, not toasted

    def take(self, alerts: Iterable[Alert], now: float) -> list[Toast]:
        toasts = []
        for alert in alerts:
            if alert.step <= self.opened_at_step:
                continue
            if now - self._last.get(alert.kind, -math.inf) < TOAST_EVERY_S:
                self._held[alert.kind] = self._held.get(alert.kind, 0) + 1
                continue
            held = self._held.pop(alert.kind, 0)
            again = f" (and {held} more since the last notice; see the Alerts tab)" if held else ""
            toasts.append(
                Toast(
                    f"⚠ {alert.kind} at step {alert.step}",
                    alert.message + again,
                    "error" if alert.severity == "error" else "warning",
                )
            )
            self._last[alert.kind] = now
        return toasts
