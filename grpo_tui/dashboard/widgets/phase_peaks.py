"""Peak memory and time of each training phase (generation / scoring / loss / optimizer): peaks before
and after the loss-impl switch, mean seconds per step and share of the step, the phase that holds the
peak and the slowest phase highlighted, and the latest step's valid / padding token shares."""

from __future__ import annotations

from collections.abc import Mapping

from textual.widgets import Static

from grpo_tui.dashboard.widgets.gpu_memory_panel import PHASE_TABLE_WIDTH, phase_table


class PhasePeaks(Static):
    """`show({phase: {last, peak, before, after, time_s, share, valid}}, switch_label)`."""

    DEFAULT_CSS = """
    PhasePeaks { height: auto; }
    """

    def show(self, peaks: Mapping[str, Mapping[str, float | None]], switch: str | None = None) -> None:
        self._shown = (peaks, switch)
        if not peaks:
            self.update("no per-phase memory in the stream yet")
            return
        table = phase_table(peaks, switch, self.size.width or PHASE_TABLE_WIDTH)
        shape = (tuple(peaks), switch is None, self.size.width, table.caption is None)
        self.update(table, layout=shape != getattr(self, "_shape", None))
        self._shape = shape

    def on_resize(self) -> None:
        # Whether the token shares fit as a column follows the width: draw the last rows again.
        shown = getattr(self, "_shown", None)
        if shown is not None:
            self.show(*shown)
