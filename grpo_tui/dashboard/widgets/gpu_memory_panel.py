"""Per-GPU memory, nvitop style: one row per GPU with a used/total bar, a history sparkline,
utilisation, temperature, power, this run's processes and the run's peak. Without NVML: host RAM
and CPU, saying so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from grpo_tui.dashboard.widgets.bars import bar, mib, sparkline


def _na(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


class GpuMemoryPanel(Static):
    """Draws a monitor snapshot; the owner keeps the history (ring buffers) and the run's peaks."""

    DEFAULT_CSS = """
    GpuMemoryPanel { height: auto; }
    """

    def show(
        self,
        snapshot: Any,
        history: Mapping[int, Sequence[float]] | None = None,
        run_peaks: Mapping[int, float] | None = None,
        rank_pids: Mapping[int, int] | None = None,
        step_peaks: Sequence[float] = (),
    ) -> None:
        """Draw `snapshot` (a monitor.MonitorSnapshot).

        Args:
            snapshot: The latest sample (None before the first one).
            history: Used MiB per GPU index (oldest first), or host RAM under key -1.
            run_peaks: This run's peak MiB per GPU index from the metrics stream (-1: host RSS).
            rank_pids: pid -> rank, to label this run's processes.
            step_peaks: The run's peak MiB of each recent step (from the metrics stream).
        """
        self._shown = (snapshot, history, run_peaks, rank_pids, step_peaks)
        compact = self.screen.has_class("-narrow", "-short")  # a small terminal: one line per GPU
        if compact:
            panel: Group | Text = render_compact(snapshot, run_peaks or {}, self.size.width)
        else:
            panel = render_panel(snapshot, history or {}, run_peaks or {}, rank_pids or {}, self.size.width)
        if step_peaks and isinstance(panel, Group) and not compact:
            width = max(10, self.size.width - 30)
            recent = step_peaks[-width:]
            lo, hi = min(recent), max(recent)
            # Scaled over the recent range (a creep of a few percent must show), floored at 0 when flat.
            bottom = lo if hi - lo > 0.01 * hi else 0.0
            panel.renderables.append(
                Text.assemble(
                    ("peak/step ", "dim"), sparkline(recent, width, hi, bottom), (f" {lo:.0f}–{hi:.0f} MiB", "dim")
                )
            )
        # Relayout the screen only when the panel's shape can have changed (GPU count, note, width).
        shape = (len(getattr(panel, "renderables", ())), getattr(snapshot, "note", None), self.size.width)
        self.update(panel, layout=shape != getattr(self, "_shape", None))
        self._shape = shape

    def on_resize(self) -> None:
        # The layout (full or compact) and bar widths follow the size: draw the last sample again.
        shown = getattr(self, "_shown", None)
        if shown is not None:
            self.show(*shown)


def render_panel(
    snapshot: Any,
    history: Mapping[int, Sequence[float]],
    run_peaks: Mapping[int, float],
    rank_pids: Mapping[int, int],
    width: int,
) -> Group | Text:
    """The panel as a Rich renderable (a function so tests and the compare view can reuse it)."""
    if snapshot is None:
        return Text("sampling…", "dim")
    width = max(width, 40)
    spark_w = max(10, width - 48)
    bar_w = max(10, width - 40)
    if not snapshot.gpus:
        peak = max(run_peaks.values()) if run_peaks else None
        return _host_panel(snapshot, history.get(-1, ()), peak, bar_w, spark_w)
    rows = []
    for gpu in snapshot.gpus:
        used, total = gpu.memory_used_mib, gpu.memory_total_mib
        frac = (used or 0) / total if total else 0.0
        head = Text.assemble((f"GPU{gpu.index} ", "bold"), ((gpu.name or "unknown GPU")[: width - 8], "dim"))
        line1 = Text.assemble(bar(frac, bar_w), " ", (f"{mib(used)}/{mib(total)}", "bold"), f" {frac:4.0%}")
        util = Text.assemble(
            ("util ", "dim"),
            _na(gpu.utilization_pct, "{:3.0f}%"),
            ("  temp ", "dim"),
            _na(gpu.temperature_c, "{:.0f}°C"),
            ("  power ", "dim"),
            _na(gpu.power_w, "{:.0f} W"),
        )
        line2 = Text.assemble(sparkline(history.get(gpu.index, ()), spark_w, total), "  ", util)
        procs = [p for p in gpu.processes if p.pid in rank_pids] or list(gpu.processes)[:3]
        parts = []
        for proc in procs:
            rank = rank_pids.get(proc.pid)
            label = f"rank{rank} " if rank is not None else ""
            parts.append(Text.assemble((f"{label}pid {proc.pid}", "magenta"), " → ", mib(proc.used_mib)))
        peak = run_peaks.get(gpu.index)
        line3 = Text.assemble(
            ("run: ", "dim"),
            Text(", ").join(parts) if parts else ("no process of this run", "dim"),
            ("   peak ", "dim"),
            (mib(peak), "bold yellow"),
        )
        rows.extend([head, line1, line2, line3])
    return Group(*rows)


def render_compact(snapshot: Any, run_peaks: Mapping[int, float], width: int) -> Group | Text:
    """One line per GPU (or one for the host): bar, used/total, utilisation and the run's peak."""
    if snapshot is None:
        return Text("sampling…", "dim")
    bar_w = max(6, width - 50)  # what the GPU line's words take, "GPU0 … 80.0 GiB/140.4 GiB  util …"
    if not snapshot.gpus:
        host = snapshot.host
        frac = (host.ram_used_mib or 0) / host.ram_total_mib if host.ram_total_mib else 0.0
        peak = max(run_peaks.values()) if run_peaks else None
        return Group(
            Text.assemble(
                ("No GPU · RAM ", "bold yellow"),
                bar(frac, max(6, bar_w - 8)),
                " ",
                (f"{mib(host.ram_used_mib)}/{mib(host.ram_total_mib)}", "bold"),
                ("  CPU ", "dim"),
                _na(host.cpu_pct, "{:.0f}%"),
                ("  peak ", "dim"),
                (mib(peak), "bold yellow"),
            )
        )
    rows = []
    for gpu in snapshot.gpus:
        used, total = gpu.memory_used_mib, gpu.memory_total_mib
        frac = (used or 0) / total if total else 0.0
        rows.append(
            Text.assemble(
                (f"GPU{gpu.index} ", "bold"),
                bar(frac, bar_w),
                " ",
                (f"{mib(used)}/{mib(total)}", "bold"),
                ("  util ", "dim"),
                _na(gpu.utilization_pct, "{:.0f}%"),
                ("  peak ", "dim"),
                (mib(run_peaks.get(gpu.index)), "bold yellow"),
            )
        )
    return Group(*rows)


def _host_panel(snapshot: Any, history: Sequence[float], rss_peak: float | None, bar_w: int, spark_w: int) -> Group:
    host = snapshot.host
    note = snapshot.note or "NVML not available"
    if "host" not in note:
        note += " — showing host RAM and CPU"
    frac = (host.ram_used_mib or 0) / host.ram_total_mib if host.ram_total_mib else 0.0
    return Group(
        Text.assemble(("No GPU · ", "bold yellow"), (note, "yellow")),
        Text.assemble(
            ("RAM  ", "bold"), bar(frac, bar_w), " ", (f"{mib(host.ram_used_mib)}/{mib(host.ram_total_mib)}", "bold")
        ),
        Text.assemble(
            ("     ", ""),
            sparkline(history, spark_w, host.ram_total_mib),
            ("  CPU ", "dim"),
            _na(host.cpu_pct, "{:3.0f}%"),
        ),
        Text.assemble(
            ("run: ", "dim"),
            ("RSS ", "dim"),
            mib(sum(host.process_rss_mib.values()) or None),
            ("   peak ", "dim"),
            (mib(rss_peak), "bold yellow"),
        ),
    )


# Cells of the phase table's panel (the dashboard's right column, 60 wide, less border and padding).
PHASE_TABLE_WIDTH = 56
# Header of a phase's valid / padding token shares in percent, e.g. "38/62".
VALID_HEADER = "valid/pad %"


def phase_table(
    peaks: Mapping[str, Mapping[str, float | None]], switch: str | None, width: int = PHASE_TABLE_WIDTH
) -> Table:
    """Per-phase peak MiB (last step, run peak, before/after the loss-impl switch when there is one) and,
    when the run logs them, mean seconds per step and share of the step time over the recent steps, and
    the latest step's valid / padding token shares: a column where it fits `width`, else a line below."""
    header = ["phase", "last", "peak"]
    if switch:
        header += ["before", "after"]
    timed = any(v.get("time_s") is not None for v in peaks.values())
    if timed:
        header.append("time/step")  # mean seconds and share of the step
    top = max((v.get("peak") or 0 for v in peaks.values()), default=0)
    slowest = max((v.get("time_s") or 0 for v in peaks.values()), default=0)
    rows: list[list[str | Text]] = []
    for phase, v in peaks.items():
        if v.get("part"):  # a share of the phase above it (the decode copy): its last MiB only
            rows.append([phase, mib(v.get("last")), *[""] * (len(header) - 2)])
            continue
        style = "bold yellow" if top and v.get("peak") == top else ""
        row: list[str | Text] = [phase, mib(v.get("last")), Text(mib(v.get("peak")), style)]
        if switch:
            row += [mib(v.get("before")), mib(v.get("after"))]
        if timed:
            seconds, share = v.get("time_s"), v.get("share")
            style = "bold cyan" if slowest and seconds == slowest else ""
            cell = "n/a" if seconds is None else f"{seconds:.2f}s {_na(share, '{:>3.0%}')}"
            row.append(Text(cell, style))
        rows.append(row)
    shares = [_shares(v) for v in peaks.values()]
    counted = [(phase, cell) for phase, cell in zip(peaks, shares) if cell]
    caption = None
    if counted and _fits([[*header, VALID_HEADER], *([*r, c] for r, c in zip(rows, shares))], width):
        header.append(VALID_HEADER)
        rows = [[*r, c] for r, c in zip(rows, shares)]
    elif counted:  # no room for a column (the switch's columns fill the panel): a line of their own
        caption = Text.assemble((VALID_HEADER, "bold"), *(f"  {phase} {cell}" for phase, cell in counted))
    # Collapsed padding: one space between columns, so switch and time columns fit the panel's ~56 cells.
    table = Table(box=None, expand=True, pad_edge=False, collapse_padding=True, header_style="bold", caption=caption)
    table.caption_justify = "left"
    for name in header:
        table.add_column(name, justify="left" if name == "phase" else "right")
    for row in rows:
        table.add_row(*row)
    return table


def _shares(v: Mapping[str, float | None]) -> str:
    """`38/62` (valid / padding percent) for a phase that counts tokens, `—` when its share is unknown, else ``."""
    if "valid" not in v:
        return ""
    valid = v["valid"]
    if valid is None:
        return "—"
    pct = round(100 * valid)
    return f"{pct}/{100 - pct}"


def _fits(rows: list[list[str | Text]], width: int) -> bool:
    # One space between columns (collapsed padding), each column as wide as its widest cell.
    widths = [max(cell_len(str(cell)) for cell in column) for column in zip(*rows)]
    return sum(widths) + len(widths) - 1 <= width
