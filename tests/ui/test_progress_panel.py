"""The progress panel: the rollout backend and its tokens/s get a line of their own when the run logs them."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.geometry import Region

from grpo_tui.dashboard.feed import ProgressInfo
from grpo_tui.dashboard.widgets.progress_panel import ProgressPanel


class PanelApp(App):
    def compose(self) -> ComposeResult:
        yield ProgressPanel()


def info(generation: str | None) -> ProgressInfo:
    return ProgressInfo(841, 1200, 22.0, 7.0, 48.97, "running", "chunked", generation)


async def test_generation_line_appears_only_when_logged_and_is_not_cut() -> None:
    app = PanelApp()
    async with app.run_test(size=(60, 10)) as pilot:
        panel = app.query_one(ProgressPanel)
        panel.show(info(None))
        await pilot.pause()
        assert panel.size.height == 2
        panel.show(info("graph · 10,648 tok/s"))
        await pilot.pause()
        assert panel.size.height == 3
        lines = [strip.text for strip in panel.render_lines(Region(0, 0, panel.size.width, panel.size.height))]
        assert lines[2].strip() == "generation graph · 10,648 tok/s"


async def test_the_bar_follows_the_width_after_a_resize() -> None:
    # Drawn once (a finished run gets no more updates), then the terminal changes size: the bar must fill the
    # new width, not keep the old one
    app = PanelApp()
    async with app.run_test(size=(60, 10)) as pilot:
        panel = app.query_one(ProgressPanel)
        done = ProgressInfo(1200, 1200, 100.0, 0.0, 12.0, "finished", "chunked", None)
        panel.show(done)
        await pilot.pause()

        def first_line() -> str:
            return panel.render_lines(Region(0, 0, panel.size.width, 1))[0].text.rstrip()

        narrow = first_line()
        assert narrow.endswith("100%") and 50 < len(narrow) <= 60
        await pilot.resize_terminal(100, 10)
        await pilot.pause()
        wide = first_line()
        assert wide.endswith("100%") and len(wide) == len(narrow) + 40  # the bar took the 40 new columns
