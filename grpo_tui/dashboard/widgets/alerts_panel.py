"""GRPO-aware alerts: a one-line banner in place (above the charts) and the full list (a tab)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

SEVERITY_STYLES = {"critical": "bold white on red", "error": "bold red", "warning": "bold yellow", "info": "cyan"}
SEVERITY_ICONS = {"critical": "✖", "error": "✖", "warning": "⚠", "info": "ℹ"}


def alert_text(alert: Any) -> Text:
    """`⚠ step 120 · kind: message`, coloured by severity."""
    style = SEVERITY_STYLES.get(alert.severity, "bold")
    step = f"step {alert.step} · " if alert.step is not None else ""
    return Text.assemble(
        (f"{SEVERITY_ICONS.get(alert.severity, '•')} ", style), (step, "dim"), (f"{alert.kind}: ", style), alert.message
    )


class AlertBanner(Static):
    """The newest alert of each kind, in place above the charts; hidden when all is well."""

    DEFAULT_CSS = """
    AlertBanner { height: auto; max-height: 4; display: none; }
    AlertBanner.-active { display: block; }
    """

    def show(self, alerts: Sequence[Any]) -> None:
        if tuple(alerts) == getattr(self, "_shown", None):
            return
        self._shown = tuple(alerts)
        latest: dict[str, Any] = {}
        for alert in alerts:
            latest[alert.kind] = alert
        self.set_class(bool(latest), "-active")
        if latest:
            self.update(Text("\n").join(alert_text(a) for a in list(latest.values())[-4:]))


class AlertsPanel(Vertical):
    """Every alert raised so far, newest first; says so when there is none yet."""

    DEFAULT_CSS = """
    AlertsPanel { height: 1fr; }
    AlertsPanel > #alerts-empty { height: auto; padding: 1 2; color: $text-muted; }
    AlertsPanel > #alerts-table { height: 1fr; display: none; }
    AlertsPanel.-some > #alerts-empty { display: none; }
    AlertsPanel.-some > #alerts-table { display: block; }
    """

    def compose(self) -> ComposeResult:
        yield Static("no alerts yet (reward collapse, memory creep, stalls and failures show here)", id="alerts-empty")
        yield DataTable(id="alerts-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("severity", "step", "kind", "message")
        self._shown: tuple[Any, ...] = ()

    def show(self, alerts: Sequence[Any]) -> None:
        alerts = tuple(alerts)
        if alerts == self._shown:
            return
        self._shown = alerts
        self.set_class(bool(alerts), "-some")
        table = self.query_one(DataTable)
        table.clear()
        for alert in reversed(alerts):
            style = SEVERITY_STYLES.get(alert.severity, "")
            table.add_row(
                Text(alert.severity, style),
                "" if alert.step is None else str(alert.step),
                Text(alert.kind, style),
                alert.message,
            )
