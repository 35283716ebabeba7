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
