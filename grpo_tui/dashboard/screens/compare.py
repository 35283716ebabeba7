"""Two runs side by side: reward and peak memory overlaid by step, and a table of per-phase peak
memory, step time and final reward (e.g. one preset with chunked and with naive)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from grpo_tui.dashboard.compare import ComparisonTable, compare_runs
from grpo_tui.dashboard.loading import load_run
from grpo_tui.dashboard.series import downsample
from grpo_tui.dashboard.state import PEAK_MIB
from grpo_tui.dashboard.widgets.bars import mib
from grpo_tui.dashboard.widgets.braille import Series
from grpo_tui.dashboard.widgets.metric_chart import MetricChart
from grpo_tui.dashboard.widgets.runs_table import RunsTable
from grpo_tui.runs.metrics import PHASES, TOKEN_PHASES

COLOURS = ("rgb(95,175,255)", "rgb(255,135,95)")
MAX_POINTS = 400


@dataclass(frozen=True)
class CompareData:
    """Both runs' curves (downsampled, full length) and the comparison table."""

    names: tuple[str, str]
    reward: tuple[tuple[list[float], list[float]], tuple[list[float], list[float]]]
    memory: tuple[tuple[list[float], list[float]], tuple[list[float], list[float]]]
    table: ComparisonTable


def load_compare(a: Path, b: Path) -> CompareData:
    """Read both runs fully (call from a worker)."""
    sa, sb = load_run(a), load_run(b)
    names = (Path(a).name, Path(b).name)

    def curves(name: str) -> tuple[tuple[list[float], list[float]], tuple[list[float], list[float]]]:
        return downsample(*sa.series(name), MAX_POINTS), downsample(*sb.series(name), MAX_POINTS)

    return CompareData(names, curves("reward"), curves(PEAK_MIB), compare_runs(sa, sb, overlay=(), labels=names))


def comparison_table(data: CompareData) -> Table:
    """Rows: per-phase peak, run peak, median step time, final reward, mean padding share per token phase,
    held-out reward before → after, steps, loss impls."""
    a, b = data.table.rows
    table = Table(expand=True, box=None, header_style="bold", pad_edge=False)
    table.add_column("")
    table.add_column(Text(f"A  {data.names[0]}", style=f"bold {COLOURS[0]}"), justify="right")
    table.add_column(Text(f"B  {data.names[1]}", style=f"bold {COLOURS[1]}"), justify="right")
    table.add_column("B − A", justify="right")

    def row(label: str, va: float | None, vb: float | None, fmt, lower_is_better: bool = True) -> None:  # type: ignore[no-untyped-def]
        delta = Text("—", "dim")
        if va is not None and vb is not None and abs(vb - va) <= 0.005 * max(abs(va), abs(vb)):
            delta = Text("≈ same", "dim")  # under half a percent: noise, not a difference
        elif va is not None and vb is not None:
            diff = vb - va
            good = (diff < 0) == lower_is_better
            pct = f" ({diff / va:+.0%})" if va else ""
            delta = Text(
                f"{'+' if diff >= 0 else '−'}{fmt(abs(diff))}{pct}",
                "green" if good and diff else "red" if diff else "dim",
            )
        table.add_row(label, fmt(va) if va is not None else "n/a", fmt(vb) if vb is not None else "n/a", delta)

    for phase in PHASES:
        row(f"peak · {phase}", a.phase_peaks_mib.get(phase), b.phase_peaks_mib.get(phase), mib)
    row("peak · run", a.run_peak_mib, b.run_peak_mib, mib)
    row("step time (median)", a.median_step_time_s, b.median_step_time_s, lambda v: f"{v:.3f} s")
    row("final reward", a.final_reward, b.final_reward, lambda v: f"{v:.3f}", lower_is_better=False)
    if any(v is not None for v in [*a.padding.values(), *b.padding.values()]):
        table.add_row(f"padding % · {'/'.join(TOKEN_PHASES)}", *padding_cells(a.padding, b.padding))
    for name in dict.fromkeys([*a.heldout, *b.heldout]):  # eval.json's held-out scores, when there are some
        pa, pb = a.heldout.get(name), b.heldout.get(name)
        cells = [f"{p[0]:.3f} → {p[1]:.3f}" if p is not None else "n/a" for p in (pa, pb)]
        delta = f"{pb[1] - pa[1]:+.3f}" if pa is not None and pb is not None else ""
        table.add_row(f"held-out {name}", *cells, delta)
    table.add_row("steps", str(a.steps), str(b.steps), "")
    table.add_row("loss impl", " → ".join(a.loss_impls) or "?", " → ".join(b.loss_impls) or "?", "")
    return table


def padding_cells(a: dict[str, float | None], b: dict[str, float | None]) -> tuple[str, str, Text]:
    """Each run's mean padding percent per token phase, `38/9/7`, and B − A in points (`−30/−1/0`)."""

    def cells(shares: dict[str, float | None]) -> str:
        return "/".join("—" if shares.get(p) is None else f"{100 * shares[p]:.0f}" for p in TOKEN_PHASES)

    diffs: list[int | None] = []
    for phase in TOKEN_PHASES:
        va, vb = a.get(phase), b.get(phase)
        diffs.append(None if va is None or vb is None else round(100 * (vb - va)))
    if all(d == 0 for d in diffs):
        return cells(a), cells(b), Text("≈ same", "dim")
    points = ["—" if d is None else f"{d:+d}".replace("-", "−") if d else "0" for d in diffs]
    return cells(a), cells(b), Text("/".join(points) + " pts", "dim")


class OverlayChart(MetricChart):
    """Two runs' series on one chart (A blue, B orange)."""

    pair: tuple[tuple[list[float], list[float]], ...] = ()  # (xs, ys) of A, then B; empty until loaded

    def show_pair(self, series: tuple[tuple[list[float], list[float]], ...]) -> None:
        self.pair = series
        self.xs = [x for xs, _ in series for x in xs]
        self.refresh()

    def chart_title(self) -> Text:
        return Text.assemble(
            (self.title, "bold"), "   ", ("━ A", f"bold {COLOURS[0]}"), "  ", ("━ B", f"bold {COLOURS[1]}")
        )

    def series(self) -> list[Series]:
        return [Series(xs, ys, colour) for colour, (xs, ys) in zip(COLOURS, self.pair)]


class CompareScreen(Screen[None]):
    """Mark two runs (space) and press Enter, or arrive with two already chosen."""

    BINDINGS = [
        Binding("space", "mark", "Mark run", id="compare.mark"),
        Binding("enter", "compare", "Compare marked", priority=True, id="compare.go"),
        Binding("escape", "back", "Back", id="compare.back"),
    ]

    @dataclass
    class Loaded(Message):
        """Both runs were read."""

        data: CompareData

    def __init__(self, a: Path | None = None, b: Path | None = None) -> None:
        super().__init__()
        self.pair = (a, b) if a is not None and b is not None else None
        self.data: CompareData | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="compare-pick", classes="box") as box:
            box.border_title = "Runs · space marks two · Enter compares"
            yield RunsTable(action="compares", id="compare-runs")
        with Horizontal(id="compare-charts"):
            yield OverlayChart("reward", id="compare-reward")
            yield OverlayChart("peak memory MiB per step", id="compare-memory")
        with Vertical(id="compare-table-box", classes="box") as box:
            box.border_title = "Per-phase peak memory, step time, final reward"
            yield Static(Text("mark two runs above (space), then Enter", "dim"), id="compare-table")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "Compare"
        self.query_one(RunsTable).focus()
        if self.pair is not None:
            self._load(*self.pair)

    def on_screen_resume(self) -> None:
        self.query_one(RunsTable).refresh_runs()

    def on_data_table_row_selected(self) -> None:
        self.action_mark()  # a click on a row marks it, like space

    def action_mark(self) -> None:
        self.query_one(RunsTable).toggle_mark()

    def action_compare(self) -> None:
        marked = self.query_one(RunsTable).marked
        if len(marked) != 2:
            self.notify("Mark exactly two runs with space.", severity="warning")
            return
        self._load(marked[0], marked[1])

    @work(thread=True, exclusive=True, group="compare")
    def _load(self, a: Path, b: Path) -> None:
        self.post_message(self.Loaded(load_compare(a, b)))

    def on_compare_screen_loaded(self, message: Loaded) -> None:
        data = self.data = message.data
        self.query_one("#compare-reward", OverlayChart).show_pair(data.reward)
        self.query_one("#compare-memory", OverlayChart).show_pair(data.memory)
        self.query_one("#compare-table", Static).update(comparison_table(data))
        self.query_one("#compare-table-box").border_subtitle = f"A {data.names[0]}  ·  B {data.names[1]}"

    def action_back(self) -> None:
        self.dismiss(None)
