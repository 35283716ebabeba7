"""Text bars and sparklines shared by the panels (plain Rich text, cheap to redraw)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

SPARKS = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉█"


def bar(fraction: float, width: int, colour: str | None = None) -> Text:
    """A horizontal bar `width` cells wide, coloured green → yellow → red by how full it is (memory)
    unless `colour` is given (progress)."""
    fraction = min(1.0, max(0.0, fraction))
    colour = colour or ("green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red")
    cells = fraction * width
    full = int(cells)
    part = EIGHTHS[int((cells - full) * 8)] if full < width else ""
    filled = "█" * full + (part if part.strip() else "")
    return Text.assemble((filled, colour), ("·" * (width - len(filled)), "grey37"))


def sparkline(values: Sequence[float | None], width: int, top: float | None = None, bottom: float = 0.0) -> Text:
    """The last `width` values as block characters scaled from `bottom` to `top` (default: their max)."""
    tail = [v for v in values if v is not None][-width:]
    if not tail:
        return Text(" " * width)
    hi = top if top else max(tail) or 1.0
    span = (hi - bottom) or 1.0
    chars = "".join(SPARKS[min(7, max(0, int((v - bottom) / span * 7.999)))] for v in tail)
    return Text(chars.rjust(width), style="cyan")


def mib(value: float | None) -> str:
    """MiB as a short human size."""
    if value is None:
        return "n/a"
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"
