"""App-wide messages: small past-tense events that cross screens.

Widget-specific messages live nested in their widget (e.g. `LossImplToggle.Toggled`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message


@dataclass
class RunStarted(Message):
    """A run was prepared and its supervisor spawned (detached)."""

    run_path: Path
    pid: int | None


@dataclass
class RunStartFailed(Message):
    """Preparing or spawning a run failed; `reason` is one line for the user."""

    preset_name: str
    reason: str


@dataclass
class LossImplRequested(Message):
    """The user asked a run to switch its loss implementation (control.json written)."""

    run_path: Path
    loss_impl: str


@dataclass
class StopRequested(Message):
    """The user asked a run to stop; `force` kills its process group."""

    run_path: Path
    force: bool
