"""Opening a run folder into a `RunState`: its config.toml, then its metrics stream through the
run-folder layer's reader (`runs.metrics`), all of it (`load_run`) or a quick first look (`load_recent`).

Each leaves `state.tail` after the records applied, so a worker thread can `state.tail.read_new()`
and hand the records to the thread that owns the model, which calls `state.apply(records)`.
"""

from __future__ import annotations

import os
from pathlib import Path

from grpo_tui.dashboard.state import RunState
from grpo_tui.runs.listing import read_config
from grpo_tui.runs.metrics import BLOCK_BYTES, MetricsTail, as_int, read_recent

# Bytes from the end of metrics.jsonl that load_recent parses (~1,000 steps of TRL metrics).
RECENT_BYTES = 1024 * 1024


def _new_state(root: Path) -> RunState:
    config = read_config(root)
    grpo, loss = config.get("grpo", {}), config.get("loss", {})
    state = RunState(
        max_steps=as_int(grpo.get("max_steps")), preset=str(config.get("name", "")), loss_impl=str(loss.get("impl", ""))
    )
    state.run_dir = root
    return state


def load_run(run_dir: str | os.PathLike[str], block_bytes: int = BLOCK_BYTES) -> RunState:
    """A RunState with the run's config and every complete record of its metrics.jsonl.

    The file is read and applied in blocks (so a long run never holds all its records as dicts at
    once). `state.tail` goes on from the end, ready for incremental reads of a live run (a partial
    last line is completed once its newline arrives).
    """
    root = Path(run_dir)
    state = _new_state(root)
    tail = MetricsTail(root / "metrics.jsonl")
    for records in tail.read_blocks(block_bytes):
        state.apply(records)
    state.tail = tail
    return state


def load_recent(run_dir: str | os.PathLike[str], recent_bytes: int = RECENT_BYTES) -> RunState:
    """A quick first look at a long run: every event, but only the steps in the last `recent_bytes`.

    For a dashboard to draw within a fraction of a second while `load_run` reads the whole history
    (100,000 steps take about a second). Every event is known (switches, the start record for
    pid -> GPU, failures); per-phase peaks and series cover the window only. `state.partial` is True
    when the window missed steps, and `state.tail` continues after the last complete line.
    """
    root = Path(run_dir)
    state = _new_state(root)
    recent = read_recent(root / "metrics.jsonl", recent_bytes)
    state.apply(recent.events)
    state.apply(recent.records)
    state.partial = recent.partial
    state.tail = recent.tail
    return state
