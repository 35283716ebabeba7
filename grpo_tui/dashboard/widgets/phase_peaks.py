"""Peak memory and time of each training phase (generation / scoring / loss / optimizer): peaks before
and after the loss-impl switch, mean seconds per step and share of the step, the phase that holds the
peak and the slowest phase highlighted."""

from __future__ import annotations

from collections.abc import Mapping

from textual.widgets import Static

from grpo_tui.dashboard.widgets.gpu_memory_panel import phase_table


class PhasePeaks(Static):
    """`show({phase: {last, peak, before, after, time_s, share}}, switch_label)`."""

    DEFAULT_CSS = """
    PhasePeaks { height: auto; }
    """

    def show(self, peaks: Mapping[str, Mapping[str, float | None]], switch: str | None = None) -> None:
        if not peaks:
            self.update("no per-phase memory in the stream yet")
            return
        shape = (tuple(peaks), switch is None, self.size.width)
        self.update(phase_table(peaks, switch), layout=shape != getattr(self, "_shape", None))
        self._shape = shape
