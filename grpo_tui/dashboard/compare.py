"""Comparing two runs (e.g. one preset with chunked and with naive): a table and aligned series."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from grpo_tui.dashboard.series import fraction
from grpo_tui.dashboard.state import PEAK_MIB, RunState
from grpo_tui.runs.metrics import PHASES, TOKEN_PHASES, valid_share_key
from grpo_tui.runs.product import read_product

# Steps averaged for a run's "final reward".
FINAL_REWARD_STEPS = 10


@dataclass(frozen=True)
class RunSummary:
    """One row of the comparison table."""

    label: str  # the run folder's name (or the preset)
    preset: str
    loss_impls: tuple[str, ...]  # implementations used, in order of first use
    steps: int
    phase_peaks_mib: dict[str, float | None]  # per phase (metrics.PHASES), None when not logged
    run_peak_mib: float | None
    median_step_time_s: float | None
    final_reward: float | None  # mean reward of the last FINAL_REWARD_STEPS steps
    # Held-out reward before -> after training per reward function (eval.json), empty before `grpo-tui eval`
    heldout: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Mean padding share of each token phase (metrics.TOKEN_PHASES) over the steps that logged one, else None
    padding: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True)
class ComparisonTable:
    rows: tuple[RunSummary, RunSummary]
    common_steps: int
    max_abs_reward_delta: float | None  # max |reward_a - reward_b| over common steps
    max_delta_step: int | None  # the step where it occurs
    overlays: dict[str, tuple[list[float], list[float], list[float]]] = field(default_factory=dict)


def summarize(state: RunState, label: str = "") -> RunSummary:
    """A run's row: per-phase peaks, step time and final reward."""
    impls = tuple(dict.fromkeys(i for i in state.step_impls if i)) or ((state.loss_impl,) if state.loss_impl else ())
    _, rewards = state.series("reward")
    tail = rewards[-FINAL_REWARD_STEPS:]
    return RunSummary(
        label=label or (state.run_dir.name if state.run_dir is not None else state.preset),
        preset=state.preset,
        loss_impls=impls,
        steps=state.last_step,
        phase_peaks_mib={p: state.phase_peaks.get(p) for p in PHASES},
        run_peak_mib=state.run_peak_mib,
        median_step_time_s=state.median_step_time(),
        final_reward=sum(tail) / len(tail) if tail else None,
        heldout=read_product(state.run_dir).scores if state.run_dir is not None else {},
        padding={p: mean_padding_share(state, p) for p in TOKEN_PHASES},
    )


def mean_padding_share(state: RunState, phase: str) -> float | None:
    """1 - the mean valid-token share of `phase` over the steps that logged a share (None: none did)."""
    shares = [share for share in map(fraction, state.column(valid_share_key(phase))) if share is not None]
    return 1.0 - sum(shares) / len(shares) if shares else None


def aligned(a: RunState, b: RunState, name: str) -> tuple[list[float], list[float], list[float]]:
    """(steps, a's values, b's values) at the steps where both runs logged `name`."""
    xa, ya = a.series(name)
    lookup = dict(zip(xa, ya))
    xb, yb = b.series(name)
    rows = [(x, lookup[x], y) for x, y in zip(xb, yb) if x in lookup]
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def compare_runs(
    a: RunState, b: RunState, overlay: tuple[str, ...] = ("reward", PEAK_MIB), labels: tuple[str, str] = ("", "")
) -> ComparisonTable:
    """The table of both runs plus `overlay` metrics aligned on their common steps.

    To overlay runs of different lengths in full, draw `a.series(name)` and `b.series(name)` instead.
    """
    steps, ra, rb = aligned(a, b, "reward")
    deltas = [abs(x - y) for x, y in zip(ra, rb) if not (math.isnan(x) or math.isnan(y))]
    if deltas:
        i = max(range(len(deltas)), key=deltas.__getitem__)
        max_delta, at = deltas[i], int(steps[i])
    else:
        max_delta, at = None, None
    overlays = {}
    for name in overlay:
        xs, ya, yb = aligned(a, b, name)
        overlays[name] = (xs, ya, yb)
    return ComparisonTable(
        rows=(summarize(a, labels[0]), summarize(b, labels[1])),
        common_steps=len(steps),
        max_abs_reward_delta=max_delta,
        max_delta_step=at,
        overlays=overlays,
    )
