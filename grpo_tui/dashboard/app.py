"""grpo-tui, the Textual app: presets → start a run → live dashboard; runs list; compare.

Small on purpose: screens live in `screens/`, widgets in `widgets/`, styles in `app.tcss`, data in
plain models (`state`, `series`, `monitor`, `alerts`, `compare`; the run folder's files through `grpo_tui.runs`).
Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual import work
from textual.app import App
from textual.binding import Binding

from grpo_tui.config.schema import Preset
from grpo_tui.dashboard.messages import (
    CompareRequested,
    OpenRunRequested,
    RunLivenessSeen,
    RunRequested,
    RunStarted,
    RunStartFailed,
    ShowRunsRequested,
    StopRequested,
)
from grpo_tui.dashboard.runs_location import RunsLocation
from grpo_tui.dashboard.workers import call_from_worker

# Starts a preset: returns the run folder and the supervisor's pid (tests inject a fake).
Launcher = Callable[[Preset, Path | None], tuple[Path, int | None]]


def default_launcher(preset: Preset, runs_dir: Path | None) -> tuple[Path, int | None]:
    """prepare_run + spawn_detached: the run lives on in its own session when the app closes."""
    from grpo_tui.launch import supervisor

    run = supervisor.prepare_run(preset, [], runs_dir)
    return run.path, supervisor.spawn_detached(run.path)


class GrpoTuiApp(App[int]):
    """The app. Every dependency with a side effect (monitor, clock, launcher) can be injected."""

    CSS_PATH = "app.tcss"
    # Screens get -narrow below 120 columns and -short below 36 rows; app.tcss stacks panels, shrinks
    # boxes and the memory panel draws one line per GPU there, so 80x24 stays usable.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]
    TITLE = "grpo-tui"
    SUB_TITLE = "GRPO fine-tuning"
    BINDINGS = [
        Binding("q", "quit_app", "Quit", id="app.quit"),
        Binding("question_mark", "help", "Keys", key_display="?", id="app.help"),
        Binding("ctrl+c", "quit_app", "Quit", show=False, priority=True, id="app.ctrl_c"),
    ]

    def __init__(
        self,
        runs_dir: Path | None = None,
        *,
        monitor: Any = None,
        clock: Callable[[], float] = time.time,
        launcher: Launcher | None = None,
        poll_interval: float = 0.4,
        auto_attach: bool = True,
        select_preset: str | None = None,
        open_run: Path | None = None,
    ) -> None:
        super().__init__()
        # Screens read it through runs_location(app); a started run may move it (on_run_started).
        self.runs = RunsLocation(Path(runs_dir) if runs_dir is not None else Path("runs"), runs_dir is not None)
        self._monitor = monitor
        self.clock = clock
        self.launcher = launcher or default_launcher
        self.poll_interval = poll_interval
        self.auto_attach = auto_attach
        self.select_preset = select_preset
        self.open_run_at_start = open_run
        self.live_runs: set[Path] = set()

    @property
    def monitor(self) -> Any:
        if self._monitor is None:
            from grpo_tui.dashboard.monitor import Monitor

            self._monitor = Monitor()
        return self._monitor

    def on_mount(self) -> None:
        from grpo_tui.dashboard.screens.presets import PresetScreen

        self.push_screen(PresetScreen(self.select_preset))
        if self.open_run_at_start is not None:
            self.open_run(self.open_run_at_start)
        elif self.auto_attach:
            self._find_running()

    @work(thread=True, group="attach")
    def _find_running(self) -> None:
        from grpo_tui.runs.listing import scan_live_runs

        running = [r for r in scan_live_runs(self.runs.path) if r.status == "running"]
        if running:
            call_from_worker(self, self._attach, running[0].path, len(running))

    def _attach(self, path: Path, count: int) -> None:
        more = f" ({count - 1} more in the runs list: r)" if count > 1 else ""
        self.notify(f"Re-attached to running run {path.name}{more}", title="Run in progress")
        self.open_run(path)

    # ---- runs ---------------------------------------------------------------------------------
    def on_run_requested(self, message: RunRequested) -> None:
        self.start_preset(message.preset)

    def start_preset(self, preset: Preset) -> None:
        """Prepare and spawn a run off the UI thread; RunStarted opens its dashboard."""
        self.notify(f"Starting {preset.name}…", title="Run")
        self._start(preset)

    @work(thread=True, group="start")
    def _start(self, preset: Preset) -> None:
        from grpo_tui.config.schema import PresetError

        try:
            path, pid = self.launcher(preset, self.runs.path if self.runs.given else None)
        except PresetError as exc:
            self.post_message(RunStartFailed(preset.name, "; ".join(exc.lines)))
            return
        except OSError as exc:
            self.post_message(RunStartFailed(preset.name, f"cannot start: {exc}"))
            return
        self.post_message(RunStarted(Path(path), pid))

    def on_run_started(self, message: RunStarted) -> None:
        self.live_runs.add(message.run_path)
        if not self.runs.given:  # the preset's logging.runs_dir: list the runs where they are
            self.runs.path = message.run_path.parent
        self.open_run(message.run_path)

    def on_run_start_failed(self, message: RunStartFailed) -> None:
        self.notify(message.reason, title=f"{message.preset_name} not started", severity="error", timeout=10)

    def open_run(self, path: Path) -> None:
        from grpo_tui.dashboard.screens.dashboard import DashboardScreen

        self.push_screen(DashboardScreen(Path(path), self.monitor, self.clock, self.poll_interval))

    def on_open_run_requested(self, message: OpenRunRequested) -> None:
        self.open_run(message.run_path)

    def on_run_liveness_seen(self, message: RunLivenessSeen) -> None:
        if message.live:
            self.live_runs.add(message.run_path)
        else:
            self.live_runs.discard(message.run_path)

    def on_stop_requested(self, message: StopRequested) -> None:
        self._stop(message.run_path, message.force)

    @work(thread=True, group="stop")
    def _stop(self, path: Path, force: bool) -> None:
        from grpo_tui.launch import supervisor

        message = supervisor.stop_run(path, force=force)
        call_from_worker(self, self.notify, message, title="Kill" if force else "Stop")

    # ---- navigation ---------------------------------------------------------------------------
    def on_show_runs_requested(self, _message: ShowRunsRequested) -> None:
        self.action_show_runs()

    def on_compare_requested(self, message: CompareRequested) -> None:
        self.action_compare(message.a, message.b)

    def action_show_runs(self) -> None:
        from grpo_tui.dashboard.screens.runs import RunsScreen

        self.push_screen(RunsScreen())

    def action_compare(self, a: Path | None = None, b: Path | None = None) -> None:
        from grpo_tui.dashboard.screens.compare import CompareScreen

        self.push_screen(CompareScreen(a, b))

    def action_help(self) -> None:
        from grpo_tui.dashboard.screens.help import HelpScreen

        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(binding_owners()))

    def action_quit_app(self) -> None:
        from grpo_tui.dashboard.screens.confirm import QuitScreen

        if isinstance(self.screen, QuitScreen):
            return
        self._check_live_then_quit()

    @work(thread=True, exclusive=True, group="quit")
    def _check_live_then_quit(self) -> None:
        # Runs seen live this session may have ended since (their dashboards closed): ask run.json.
        from grpo_tui.runs.listing import live_among

        live = sorted(live_among(self.live_runs))
        self.live_runs = set(live)
        call_from_worker(self, self._ask_or_exit, live)

    def _ask_or_exit(self, live: list[Path]) -> None:
        from grpo_tui.dashboard.screens.confirm import QuitScreen

        if not live:
            self.exit(0)
        elif not isinstance(self.screen, QuitScreen):
            self.push_screen(QuitScreen(live), self._quit_answer)

    def _quit_answer(self, choice: str | None) -> None:
        if choice == "stop":
            from grpo_tui.launch import supervisor

            for path in self.live_runs:
                supervisor.stop_run(path)
            self.exit(0)
        elif choice in ("leave", "ended"):  # "ended": the runs finished while the dialog was up
            self.exit(0)


def binding_owners() -> list[tuple[str, type]]:
    """(where, class) of every screen's bindings, for the help screen."""
    from grpo_tui.dashboard.screens.compare import CompareScreen
    from grpo_tui.dashboard.screens.confirm import ConfirmScreen, QuitScreen
    from grpo_tui.dashboard.screens.dashboard import DashboardScreen
    from grpo_tui.dashboard.screens.export import ExportScreen
    from grpo_tui.dashboard.screens.help import HelpScreen
    from grpo_tui.dashboard.screens.preset_editor import PresetEditorScreen
    from grpo_tui.dashboard.screens.presets import PresetScreen
    from grpo_tui.dashboard.screens.rename import RenamePresetScreen
    from grpo_tui.dashboard.screens.runs import RunsScreen
    from grpo_tui.dashboard.screens.tune import TuneScreen

    return [
        ("everywhere", GrpoTuiApp),
        ("presets", PresetScreen),
        ("rename", RenamePresetScreen),
        ("editor", PresetEditorScreen),
        ("dashboard", DashboardScreen),
        ("export", ExportScreen),
        ("runs", RunsScreen),
        ("tune", TuneScreen),
        ("compare", CompareScreen),
        ("confirm", ConfirmScreen),
        ("quit", QuitScreen),
        ("help", HelpScreen),
    ]


def create_app(**kwargs: Any) -> GrpoTuiApp:
    """App factory (tests and screenshots pass a runs folder, a fixed clock and a fake monitor)."""
    return GrpoTuiApp(**kwargs)


def main(argv: list[str] | None = None, run_dir: Path | None = None) -> int:
    """`grpo-tui` with no arguments (or `python -m grpo_tui.dashboard.app`); `run_dir` opens that run's dashboard."""
    if argv is None and run_dir is not None:
        argv = []  # called by `grpo-tui run PRESET`: sys.argv holds the run command, not ours
    parser = argparse.ArgumentParser(prog="grpo-tui", description="Terminal dashboard and runner for GRPO")
    parser.add_argument("--runs-dir", type=Path, default=None, help="runs folder (default ./runs)")
    parser.add_argument("--preset", default=None, help="preset selected on open (default tiny-cpu)")
    parser.add_argument("--open", type=Path, default=None, help="open this run folder's dashboard")
    args = parser.parse_args(argv)
    opened = run_dir or args.open
    runs_dir = args.runs_dir or (Path(opened).resolve().parent if opened else None)
    app = create_app(runs_dir=runs_dir, select_preset=args.preset, open_run=opened)
    result = app.run()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
