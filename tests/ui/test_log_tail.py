"""The log tab: long lines wrap at the view's width (nothing is cut), and wrap again on a resize."""

from __future__ import annotations

from test_dashboard import open_dashboard
from textual.app import App, ComposeResult
from textual.widgets import TabbedContent
from ui_support import wait_for

from grpo_tui.dashboard.widgets.log_tail import LogTail, wrap_lines

LONG = "Traceback: " + " ".join(f"/very/long/path/segment{i}/file.py:{i}" for i in range(12)) + " <end>"


def test_wrap_lines_cuts_at_cells_and_keeps_every_character() -> None:
    assert list(wrap_lines(["abcdefghij", "", "ab\r"], 4)) == ["abcd", "efgh", "ij", "", "ab"]
    assert list(wrap_lines(["日本語x"], 4)) == ["日本", "語x"]  # wide characters count two cells
    assert list(wrap_lines(["a\tb"], 20)) == ["a       b"]
    assert list(wrap_lines([LONG], 0)) == [LONG]  # width not known yet (a hidden tab): drawn again on resize


class _LogApp(App[None]):
    def compose(self) -> ComposeResult:
        yield LogTail(id="log")


async def test_a_long_line_wraps_at_the_width_and_again_after_a_resize() -> None:
    app = _LogApp()
    async with app.run_test(size=(40, 10)) as pilot:
        log = app.query_one(LogTail)
        log.show(("first", LONG, "last"))
        await pilot.pause()
        width = log.scrollable_content_region.width
        assert 0 < width < 40
        assert all(len(row) <= width for row in log.lines)
        assert log.lines[0] == "first" and log.lines[-1] == "last"
        assert "".join(log.lines[1:-1]) == LONG
        narrow_rows = len(log.lines)
        await pilot.resize_terminal(120, 10)
        await wait_for(pilot, lambda: log.scrollable_content_region.width > width and len(log.lines) < narrow_rows)
        assert all(len(row) <= log.scrollable_content_region.width for row in log.lines)
        assert "".join(log.lines[1:-1]) == LONG
        assert log.virtual_size.width <= log.scrollable_content_region.width  # nothing to scroll sideways to


async def test_the_log_tab_shows_a_long_line_whole_at_80_columns(app_factory, recorded_run) -> None:
    with open(recorded_run / "stdout.log", "a", encoding="utf-8") as handle:
        handle.write(LONG + "\n")
    app = app_factory()
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_dashboard(app, pilot, recorded_run)
        await pilot.press("4")
        assert screen.query_one(TabbedContent).active == "tab-log"
        log = screen.query_one("#log-full", LogTail)
        await wait_for(pilot, lambda: log.scrollable_content_region.width > 0 and LONG in "".join(log.lines))
        assert all(len(row) <= log.scrollable_content_region.width < 80 for row in log.lines)
