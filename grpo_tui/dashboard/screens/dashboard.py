"""The live run dashboard: charts, per-GPU memory, phase peaks, progress, log, completions, alerts,
the chunked-vs-baseline toggle and stop. All reading happens in a thread worker (`DashboardFeed`);
this screen only draws the views it is sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Static, TabbedContent, TabPane
from textual.worker import get_current_worker

from grpo_tui.dashboard.alert_toasts import AlertToasts
from grpo_tui.dashboard.feed import METRIC_CHARTS, DashboardFeed, DashboardView
from grpo_tui.dashboard.messages import LossImplRequested, RunLivenessSeen, StopRequested
from grpo_tui.dashboard.widgets.alerts_panel import AlertBanner, AlertsPanel
from grpo_tui.dashboard.widgets.completions_browser import CompletionsBrowser
from grpo_tui.dashboard.widgets.gpu_memory_panel import GpuMemoryPanel
from grpo_tui.dashboard.widgets.log_tail import LogTail
from grpo_tui.dashboard.widgets.loss_impl_toggle import LossImplToggle
from grpo_tui.dashboard.widgets.metric_chart import MetricChart
from grpo_tui.dashboard.widgets.phase_peaks import PhasePeaks
from grpo_tui.dashboard.widgets.progress_panel import ProgressPanel
from grpo_tui.dashboard.widgets.reward_chart import RewardChart
from grpo_tui.dashboard.workers import call_from_worker, while_mounted
from grpo_tui.runs.status import LIVE_STATES, status_style

# Seconds between polls of a run that has ended (its files no longer change; the monitor still samples).
ENDED_POLL_S = 2.0


class DashboardScreen(Screen[None]):
    """One run, live. Leaving the screen (Escape) leaves the run going."""

    BINDINGS = [
        Binding("t", "toggle_impl", "Chunked ⇄ baseline", id="dashboard.toggle"),
        Binding("x", "stop", "Stop run", id="dashboard.stop"),
        # Off the footer (it is full); the help screen and a stall alert name it.
        Binding("d", "dump_stacks", "Dump every rank's stacks into the log", show=False, id="dashboard.stacks"),
        Binding("1", "tab('tab-charts')", "Charts", id="dashboard.tab.charts"),
        Binding("2", "tab('tab-completions')", "Completions", id="dashboard.tab.completions"),
        Binding("3", "tab('tab-alerts')", "Alerts", id="dashboard.tab.alerts"),
        Binding("4", "tab('tab-log')", "Log", id="dashboard.tab.log"),
        Binding("left_square_bracket", "step(-1)", "◂ step", key_display="[", id="dashboard.step.prev"),
        Binding("right_square_bracket", "step(1)", "step ▸", key_display="]", id="dashboard.step.next"),
        Binding("home", "step(-1000000000)", "First step", show=False, id="dashboard.step.first"),
        Binding("end", "step(1000000000)", "Newest step", show=False, id="dashboard.step.last"),
        Binding("R", "resume", "Resume run", show=False, id="dashboard.resume"),
        Binding("e", "export", "Export model", show=False, id="dashboard.export"),
        Binding("escape", "leave", "Back", id="dashboard.back"),
    ]

    @dataclass
    class FeedUpdated(Message):
        """A new view from the feed worker; a newer one replaces a queued older one."""

        view: DashboardView

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, DashboardScreen.FeedUpdated)

    @dataclass
    class FeedFailed(Message):
        """The feed could not read the run (one line for the user)."""

        reason: str

    def __init__(self, run_path: Path, monitor: Any, clock: Callable[[], float], poll_interval: float = 0.4) -> None:
        super().__init__()
        self.run_path = Path(run_path)
        self.monitor = monitor
        self.clock = clock
        self.poll_interval = poll_interval
        self.view: DashboardView | None = None
        self.feed: DashboardFeed | None = None
        self.updates = 0  # views drawn (tests and the benchmark wait on it)
        self._drawn_generation = -1
        self._stop_requests = 0
        self._stop_event = threading.Event()
        self._alerts_seen = 0
        self._toasts: AlertToasts | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="run-title")
        yield Static(id="run-product")
        with Horizontal(id="dash-main"):
            with Vertical(id="dash-left"):
                yield AlertBanner(id="alert-banner")
                with TabbedContent(id="dash-tabs", initial="tab-charts"):
                    with TabPane("Charts", id="tab-charts"):
                        yield RewardChart(id="reward-chart")
                        with Grid(id="metric-grid"):
                            for title, _ in METRIC_CHARTS:
                                yield MetricChart(title, classes="metric-chart")
                    with TabPane("Completions", id="tab-completions"):
                        yield CompletionsBrowser(id="completions")
                    with TabPane("Alerts", id="tab-alerts"):
                        yield AlertsPanel(id="alerts-list")
                    with TabPane("Log", id="tab-log"):
                        yield LogTail(id="log-full")
            with Vertical(id="dash-right"):
                with Vertical(id="progress-box", classes="box") as box:
                    box.border_title = "Progress"
                    yield ProgressPanel(id="progress")
                    yield LossImplToggle(id="impl-toggle")
                with Vertical(id="gpu-box", classes="box") as box:
                    box.border_title = "Memory"
                    yield GpuMemoryPanel(id="gpu-panel")
                with Vertical(id="phases-box", classes="box") as box:
                    box.border_title = "Peak memory by phase"
                    yield PhasePeaks(id="phase-peaks")
                with Vertical(id="log-box", classes="box") as box:
                    box.border_title = "stdout.log"
                    yield LogTail(max_lines=200, id="log-tail")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.run_path.name
        self.query_one("#run-title", Static).update(Text(f" {self.run_path.name}  loading…", "bold"))
        self._feed_worker()

    # ---- data ---------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="dashboard-feed", exit_on_error=False)
    def _feed_worker(self) -> None:
        worker = get_current_worker()
        feed = DashboardFeed(self.run_path, self.monitor, self.clock)
        self.feed = feed
        stop = self._stop_event
        while not worker.is_cancelled:
            try:
                view = feed.poll()
            except Exception as exc:  # the UI shows why rather than dying
                self.post_message(self.FeedFailed(f"{type(exc).__name__}: {exc}"))
                return
            self.post_message(self.FeedUpdated(view))
            # The next poll starts only after this one finished (no pile-up on a slow disk); an
            # ended run changes no more, so it is looked at less often.
            interval = self.poll_interval if view.status in LIVE_STATES else max(self.poll_interval, ENDED_POLL_S)
            if stop.wait(interval):
                return

    def on_dashboard_screen_feed_failed(self, message: FeedFailed) -> None:
        self.notify(message.reason, title="Cannot read this run", severity="error")

    def on_dashboard_screen_feed_updated(self, message: FeedUpdated) -> None:
        with self.app.batch_update():  # one frame for the whole view
            self._draw(message.view)
        self.updates += 1

    def _draw(self, view: DashboardView) -> None:
        self.view = view
        self._draw_title(view)
        self.query_one(ProgressPanel).show(view.progress)
        toggle = self.query_one(LossImplToggle)
        toggle.baseline = view.baseline
        toggle.set_current(view.loss_impl, view.pending_impl)
        self.query_one(GpuMemoryPanel).show(
            view.snapshot, view.history, view.run_peaks, view.rank_pids, view.step_peaks
        )
        self.query_one(PhasePeaks).show(view.phases, view.switch_label)
        phases_box = self.query_one("#phases-box")
        if phases_box.border_subtitle != (view.switch_label or ""):
            phases_box.border_subtitle = view.switch_label or ""
        self.query_one(AlertBanner).show(view.active_alerts)
        self.query_one(AlertsPanel).show(view.alerts)
        if self._toasts is None:  # the run just opened: what it had is history, not news
            self._toasts = AlertToasts(opened_at_step=view.progress.step)
        for toast in self._toasts.take(view.alerts[self._alerts_seen :], time.monotonic()):
            self.notify(toast.message, title=toast.title, severity=toast.severity, timeout=8)
        self._alerts_seen = len(view.alerts)
        self._draw_logs(view.log_lines)
        if view.generation != self._drawn_generation:
            self._drawn_generation = view.generation
            self._draw_charts(view)
        self.query_one(CompletionsBrowser).set_steps(view.completion_steps)
        self.post_message(RunLivenessSeen(self.run_path, view.status in LIVE_STATES))

    def _draw_title(self, view: DashboardView) -> None:
        alerts = len({a.kind for a in view.active_alerts})  # one per kind: the banner shows each kind once
        title = Text.assemble(
            (f" {view.run_name} ", "bold"),
            ("preset ", "dim"),
            (view.preset or "?", "bold cyan"),
            "  ",
            (f"● {view.status}", status_style(view.status, badge=True)),
            ("   stop requested" if view.stop_requested and view.status in LIVE_STATES else "", "yellow"),
            (
                f"   ⚠ {alerts} alert{'s' if alerts > 1 else ''}" if alerts else "   ✓ no alerts",
                "yellow" if alerts else "green",
            ),
            ("   loading the full history…" if view.partial else "", "dim"),
        )
        self.query_one("#run-title", Static).update(title, layout=False)  # one line, fixed height
        product = self.query_one("#run-product", Static)
        lines = [line for line in (view.product.model_line, view.product.eval_line) if line]
        product.display = bool(lines)  # the run's product, once it has one: where the model is, did it help
        if lines:
            text = Text.assemble((" ", ""), *[(part, style) for part, style in _product_parts(lines)])
            product.update(text, layout=False)

    def _draw_charts(self, view: DashboardView) -> None:
        charts = view.charts
        xs, mean, std = charts.reward
        self.query_one(RewardChart).show_reward(xs, mean, std, charts.funcs, charts.switches)
        for chart in self.query(".metric-chart").results(MetricChart):
            cx, cy = charts.metrics.get(chart.title, ([], []))
            chart.empty_hint = "not logged by this run" if xs else "no data yet"
            chart.show(cx, cy, charts.switches)

    def _draw_logs(self, lines: tuple[str, ...]) -> None:
        for log in self.query(LogTail):
            log.show(lines)

    # ---- actions ------------------------------------------------------------------------------
    def action_toggle_impl(self) -> None:
        self.request_impl(self.query_one(LossImplToggle).target_of_toggle())

    @on(LossImplToggle.Toggled)
    def _toggled(self, event: LossImplToggle.Toggled) -> None:
        self.request_impl(event.loss_impl)

    def request_impl(self, loss_impl: str) -> None:
        """Write control.json (atomically) so the trainer switches at its next step boundary."""
        if self.view is not None and self.view.status not in LIVE_STATES:
            self.notify(f"The run is {self.view.status}; nothing to switch.", severity="warning")
            return
        self._write_request(loss_impl)

    @work(thread=True, group="control")
    def _write_request(self, loss_impl: str) -> None:
        from grpo_tui.runs.folder import RunDir

        try:
            RunDir(self.run_path).request(loss_impl=loss_impl)
        except OSError as exc:  # e.g. a full disk: say so, keep the dashboard
            call_from_worker(self, self.notify, f"Cannot write control.json: {exc}", severity="error")
            return
        self.post_message(LossImplRequested(self.run_path, loss_impl))

    def on_loss_impl_requested(self, message: LossImplRequested) -> None:
        toggle = self.query_one(LossImplToggle)
        toggle.set_current(None, message.loss_impl)
        self.notify(f"Asked the trainer to switch to {message.loss_impl} at the next step.", title="loss.impl")

    def action_stop(self) -> None:
        from grpo_tui.dashboard.screens.confirm import ConfirmScreen

        if self.view is not None and self.view.status not in LIVE_STATES:
            self.notify(f"The run is already {self.view.status}.", severity="information")
            return
        force = self._stop_requests > 0
        question = "Kill the run's processes now?" if force else "Stop this run?"
        detail = (
            "A stop was already requested: this kills the process group (SIGTERM, then SIGKILL)."
            if force
            else "The trainer stops at its next step boundary; metrics are kept. x kills its processes now."
        )
        self.app.push_screen(
            ConfirmScreen(question, detail, yes="Kill" if force else "Stop", also=None if force else ("x", "Kill now")),
            lambda answer: self._stop(force or answer == ConfirmScreen.ALSO) if answer else None,
        )

    def _stop(self, force: bool) -> None:
        self._stop_requests += 1
        self.post_message(StopRequested(self.run_path, force))  # the app does it (it outlives this screen)

    @work(thread=True, group="control")
    def action_resume(self) -> None:
        """R: continue a stopped or failed run from its last checkpoint (as `grpo-tui resume RUN --detach`)."""
        from grpo_tui.config.schema import PresetError
        from grpo_tui.launch.resume import start_resume

        try:
            run, _ = start_resume(self.run_path)
        except PresetError as exc:
            call_from_worker(self, self.notify, exc.lines[0], title="Not resumed", severity="warning")
            return
        except OSError as exc:  # e.g. a full disk opening stdout.log: say so, keep the app
            call_from_worker(self, self.notify, f"cannot start: {exc}", title="Not resumed", severity="error")
            return
        message = f"{run.name} continues from its last checkpoint"
        call_from_worker(self, self.notify, message, title="Resumed")

    def action_export(self) -> None:
        """e: the export dialog, then `grpo-tui export` in a child process."""
        from grpo_tui.dashboard.screens.export import ExportScreen

        product = self.view.product if self.view is not None else None
        if product is None or product.model is None:
            self.notify("No model yet: it is saved when the run finishes or stops.", severity="warning")
            return
        self.app.push_screen(ExportScreen(self.run_path, product.lora), self._export_chosen)

    def _export_chosen(self, options: Any) -> None:
        if options is not None:
            self.notify(f"Exporting to {options.to}…", title="Export")
            self._export(options)

    @work(thread=True, group="export")
    def _export(self, options: Any) -> None:
        from grpo_tui.launch.export import run_export

        outcome = run_export(self.run_path, options)
        severity = "information" if outcome.ok else "error"
        call_from_worker(
            self, self.notify, outcome.line, title="Exported" if outcome.ok else "Not exported", severity=severity
        )

    @work(thread=True, group="control")
    def action_dump_stacks(self) -> None:
        """SIGUSR1 to every rank (launch/stacks.py): each prints its threads' stacks into stdout.log."""
        from grpo_tui.launch.stacks import dump_stacks

        asked = dump_stacks(self.run_path)
        severity = "information" if asked.pids else "warning"
        hint = " — see the Log tab (4)" if asked.pids else ""
        call_from_worker(self, self.notify, asked.message + hint, title="Stacks", severity=severity)

    @on(CompletionsBrowser.StepChosen)
    def _step_chosen(self, event: CompletionsBrowser.StepChosen) -> None:
        self._load_groups(event.step)

    @work(thread=True, exclusive=True, group="completions")
    def _load_groups(self, step: int) -> None:
        # groups() reads completions.jsonl: off the UI thread like every other read.
        if self.feed is None:
            return
        groups = self.feed.completion_groups(step)
        call_from_worker(self, self._show_groups, step, groups)

    @while_mounted
    def _show_groups(self, step: int, groups: Any) -> None:
        self.query_one(CompletionsBrowser).show_groups(step, groups)

    @on(TabbedContent.TabActivated, "#dash-tabs")
    def _tab_changed(self, event: TabbedContent.TabActivated) -> None:
        browser = self.query_one(CompletionsBrowser)
        if event.pane.id == "tab-completions":
            browser.shown()
        else:
            browser.hidden()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_step(self, delta: int) -> None:
        self.query_one(TabbedContent).active = "tab-completions"
        browser = self.query_one(CompletionsBrowser)
        browser.visible_now = True  # TabActivated arrives after this key
        browser.move(delta)

    def action_leave(self) -> None:
        self.dismiss(None)

    def on_unmount(self) -> None:
        self._stop_event.set()
        self.workers.cancel_group(self, "dashboard-feed")


def _product_parts(lines: list[str]) -> list[tuple[str, str]]:
    parts: list[tuple[str, str]] = []
    for i, line in enumerate(lines):
        parts += [("   " if i else "", ""), (line, "bold green" if line.startswith("held-out") else "cyan")]
    return parts + [("   e export", "dim")]
