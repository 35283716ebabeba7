"""Float columns for run metrics: extraction from records at C speed, and shape-keeping downsampling.

Plain functions over `array('d')` and lists (no Textual, no torch). NaN marks a missing value; +-inf
(a value the trainer logged as Infinity, or a number beyond a double) is kept as such and drawn as a gap.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from grpo_tui.runs.metrics import PHASES, as_float

NAN = float("nan")


def downsample_indices(ys: Sequence[float], max_points: int) -> list[int]:
    """Indices of at most `max_points` non-NaN points of `ys` that keep its shape.

    The points between the first and last are cut into buckets and each bucket keeps its minimum and
    maximum (in order), so spikes survive; the first and last non-NaN points are always kept, so the
    newest value never vanishes. Slicing, min and max run in C: ~1 ms for 100,000 points.
    """
    n = len(ys)
    if n <= max_points or max_points < 4:
        return [i for i in range(n) if not math.isnan(ys[i])]
    first = next((i for i in range(n) if not math.isnan(ys[i])), None)
    if first is None:
        return []
    last = next(i for i in range(n - 1, -1, -1) if not math.isnan(ys[i]))
    buckets = (max_points - 2) // 2
    size = (last - first - 1) / buckets
    out = [first]
    for b in range(buckets):
        lo, hi = first + 1 + int(b * size), first + 1 + int((b + 1) * size)
        out.extend(bucket_pair(ys, lo, hi))
    if last != first:
        out.append(last)
    return out


def bucket_pair(ys: Sequence[float], lo: int, hi: int) -> list[int]:
    """Indices of the min and max of ys[lo:hi] in order (one if they coincide; none if all NaN)."""
    if hi <= lo:
        return []
    seg = ys[lo:hi]
    if math.isnan(sum(seg)):  # NaN (or +inf and -inf) in the bucket: judge its numbers only
        pts = [(v, i) for i, v in enumerate(seg) if not math.isnan(v)]
        if not pts:
            return []
        i_min, i_max = lo + min(pts)[1], lo + max(pts)[1]
    else:  # C speed
        i_min, i_max = lo + seg.index(min(seg)), lo + seg.index(max(seg))
    return sorted({i_min, i_max})


def downsample(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list[float], list[float]]:
    """(xs, ys) reduced to at most `max_points` points keeping the shape (see `downsample_indices`)."""
    idx = downsample_indices(ys, max_points)
    return [xs[i] for i in idx], [ys[i] for i in idx]


# ---- column extraction (the hot path of opening a long run) ---------------------------------------
def nans(n: int) -> array:
    """n NaNs (missing values)."""
    return array("d", [NAN]) * n


def floats(values: Sequence[Any]) -> array:
    """Values as doubles; anything that is not a number becomes NaN."""
    try:
        return array("d", values)  # C speed when every value is a number (the usual case)
    except (TypeError, OverflowError):  # OverflowError: an integer beyond a double
        return array("d", [num(v) for v in values])


def extract_columns(recs: list[dict[str, Any]], keys: list[str]) -> list[array]:
    """One array per key over the records (NaN where a record lacks the key or it is not a number)."""
    if len(keys) > 1:
        try:
            # records from one writer carry the same keys: one C-level getter per record, then transpose
            rows = list(map(itemgetter(*keys), recs))
        except KeyError:
            pass
        else:
            return [floats(col) for col in zip(*rows)]
    return [floats([r.get(key, NAN) for r in recs]) for key in keys]


_PEAK, _ALLOC, _RESERVED = itemgetter("peak_mib"), itemgetter("allocated_mib"), itemgetter("reserved_mib")
_PHASES = itemgetter(*PHASES)


def memory_columns(recs: list[dict[str, Any]]) -> list[array]:
    """[peak, allocated, reserved, rss, *phases] per record; peak is the max over GPUs (RSS on CPU)."""
    try:
        mems = [r["memory"] for r in recs]
        gpus = [m["gpus"] for m in mems]
        rss = array("d", [m["rss_mib"] for m in mems])
        phases = [array("d", col) for col in zip(*map(_PHASES, [m["phases"] for m in mems]))]
        if len(phases) != len(PHASES):
            raise KeyError("phases")
        peak = array("d", [max(map(_PEAK, g)) if g else r for g, r in zip(gpus, rss)])
        alloc = array("d", [max(map(_ALLOC, g)) if g else NAN for g in gpus])
        reserved = array("d", [max(map(_RESERVED, g)) if g else NAN for g in gpus])
        return [peak, alloc, reserved, rss, *phases]
    except (KeyError, TypeError, IndexError, ValueError, OverflowError):  # OverflowError: an integer beyond a double
        return _memory_columns_slow(recs)


def _memory_columns_slow(recs: list[dict[str, Any]]) -> list[array]:
    out = [array("d") for _ in range(4 + len(PHASES))]
    for r in recs:
        mem = r.get("memory") if isinstance(r.get("memory"), dict) else {}
        gpus = [g for g in mem.get("gpus") or () if isinstance(g, dict)]
        rss = num(mem.get("rss_mib"))
        phases = mem.get("phases") if isinstance(mem.get("phases"), dict) else {}
        values = [
            nanmax([num(g.get("peak_mib")) for g in gpus]) if gpus else rss,
            nanmax([num(g.get("allocated_mib")) for g in gpus]),
            nanmax([num(g.get("reserved_mib")) for g in gpus]),
            rss,
            *(num(phases.get(p)) for p in PHASES),
        ]
        for col, value in zip(out, values):
            col.append(NAN if value is None else value)
    return out


def nanmax(values: Sequence[float]) -> float | None:
    """The largest non-NaN value, or None."""
    try:
        top = max(values)  # C speed; NaN-free input is the usual case
    except ValueError:
        return None
    if math.isnan(top) or any(map(math.isnan, values)):
        return max((v for v in values if not math.isnan(v)), default=None)
    return top


# ---- small conversions ---------------------------------------------------------------------------
def num(value: Any) -> float:
    """A number as a float (bools count as 0/1; an integer beyond a double is +-inf); anything else is NaN."""
    if not isinstance(value, (int, float)):
        return NAN
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def fraction(value: Any) -> float | None:
    """A share in [0, 1] as a float; None for anything else (absent, a bool, NaN, +-inf, out of range, not a number)."""
    number = as_float(value)
    return number if number is not None and 0.0 <= number <= 1.0 else None


def nan_to(value: float, default: float) -> float:
    return default if math.isnan(value) else value
