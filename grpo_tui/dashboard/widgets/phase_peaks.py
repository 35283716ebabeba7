"""Peak memory of each training phase (generation / scoring / loss / optimizer), before and after
the loss-impl switch, with the phase that holds the peak highlighted."""

from __future__ import annotations

from collections.abc import Mapping

from textual.widgets import Static

from grpo_tui.dashboard.widgets.gpu_memory_panel import phase_table


class PhasePeaks(Static):
    """`show({phase: {last, peak, before, after}}, switch_label)`."""

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
