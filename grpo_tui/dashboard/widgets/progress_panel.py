"""Step / max_steps with a bar, elapsed, ETA, speed, and the rollout backend with its tokens/s when the run logs it."""

from __future__ import annotations

import time

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from grpo_tui.dashboard.attempts import Attempt
from grpo_tui.dashboard.feed import ProgressInfo
from grpo_tui.dashboard.widgets.bars import bar
from grpo_tui.runs.status import RunStatus, status_style


def duration(seconds: float | None) -> str:
    """Seconds as h:mm:ss (or m:ss); n/a when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "n/a"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def attempt_line(number: int, attempt: Attempt) -> Text:
    """`attempt 2  10:04:31–10:09:02  steps 4–120  stopped` (no end while it goes on)."""

    def clock(when: float | None) -> str:
        return time.strftime("%H:%M:%S", time.localtime(when)) if when is not None else "?"

    ended = clock(attempt.ended) if attempt.ended is not None else ""
    steps = f"{attempt.first_step}–{attempt.last_step}" if attempt.first_step is not None else "none"
    return Text.assemble(
        (f"attempt {number}  ", "dim"),
        f"{clock(attempt.started)}–{ended}  ",
        ("steps ", "dim"),
        f"{steps}  ",
        (str(attempt.status), status_style(attempt.status)),
    )


class ProgressPanel(Static):
    DEFAULT_CSS = """
    ProgressPanel { height: auto; }
    """

    _info: ProgressInfo | None = None

    def on_resize(self) -> None:
        # The bar fills the width it was drawn for: drawn again for the new one (a finished run gets no more
        # updates, and the first draw may come before the layout has settled)
        if self._info is not None:
            self.show(self._info)

    def show(self, info: ProgressInfo) -> None:
        self._info = info
        total = info.max_steps or 0
        frac = info.step / total if total else 0.0
        head = Text.assemble(
            (f"● {info.state}", status_style(info.state, badge=True)),
            "  step ",
            (f"{info.step}", "bold"),
            f"/{total or '?'}  ",
        )
        width = max(8, self.size.width - head.cell_len - 6)  # one line: head, bar, " 100%"
        line1 = Text.assemble(head, bar(frac, width, "dodger_blue1"), f" {frac:4.0%}")
        speed = f"{info.steps_per_s:.2f}" if info.steps_per_s else "n/a"
        line2 = Text.assemble(
            ("elapsed ", "dim"),
            duration(info.elapsed_s),
            ("   ETA ", "dim"),
            (duration(info.eta_s) if info.state == RunStatus.RUNNING else "—", "bold"),
            ("   steps/s ", "dim"),
            speed,
        )
        lines = [line1, line2]
        if info.generation:  # the rollout backend and its completion tokens/s: a line of its own, line 2 is full
            lines.append(Text.assemble(("generation ", "dim"), info.generation))
        if len(info.attempts) > 1:  # a resumed run: when each attempt ran, its steps and how it ended
            lines.extend(attempt_line(i, attempt) for i, attempt in enumerate(info.attempts, 1))
        # A fixed number of lines: no relayout of the screen unless the width or that number changed.
        shape = (self.size.width, len(lines))
        self.update(Group(*lines), layout=shape != getattr(self, "_shape", None))
        self._shape = shape
