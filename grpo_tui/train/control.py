"""The trainer's control plane at step boundaries: control.json requests and its supervisor's liveness.

control.json is written atomically by `RunDir.request`; each write bumps `request_id`, so a request is
acted on once. Fields: `stop: true`, `loss_impl: "chunked" | "naive" | "trl"`; `kill: true` (beside
`stop`, from `control --stop --force`) is read by the runner only, to tell a kill from a failure.
The file may hold anything (a hand edit, a stray copy): whatever it holds becomes at most one error per
change of the file, never an exception, and the run goes on. It is read only when its stat changed,
and only up to MAX_CONTROL_BYTES, so a huge file costs nothing per step.

`SupervisorWatch` tells the trainer that the supervisor which started it is gone (killed, crashed): the
trainer then stops itself, so no run trains on with nobody recording its outcome or able to stop it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from grpo_tui.config.schema import LOSS_IMPLS
from grpo_tui.runs.status import SUPERVISOR_PID_ENV, SUPERVISOR_STARTED_ENV, pid_alive

# Largest control.json read: a real one is ~100 bytes; anything larger is reported and ignored.
MAX_CONTROL_BYTES = 64 * 1024


@dataclass(frozen=True)
class ControlDecision:
    """What the trainer must do at this step boundary (all empty when nothing new was asked)."""

    stop: bool = False
    loss_impl: str | None = None
    request_id: int | None = None
    error: str | None = None

    @property
    def empty(self) -> bool:
        return not self.stop and self.loss_impl is None and self.error is None


class ControlReader:
    """Polls one control.json; returns each new request once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._seen_id: int | None = None
        self._stamp: tuple[int, ...] | None = None  # the stat of the content read last

    def poll(self) -> ControlDecision:
        name = self.path.name
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._stamp = None
            return ControlDecision()
        except OSError as exc:
            changed = self._changed((-1, exc.errno or 0))  # reported once, until the file changes
            return ControlDecision(error=f"cannot read {name}: {exc}") if changed else ControlDecision()
        # An atomic rewrite changes the inode; an in-place edit the times or the size.
        stamp = (info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size)
        if not self._changed(stamp):
            return ControlDecision()
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block or never end
            return ControlDecision(error=f"{name} is not a regular file; ignored")
        if info.st_size > MAX_CONTROL_BYTES:
            return ControlDecision(error=f"{name} is {info.st_size} bytes, over {MAX_CONTROL_BYTES}; ignored")
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(MAX_CONTROL_BYTES + 1)
            data = json.loads(raw.decode("utf-8"))
        except OSError as exc:
            return ControlDecision(error=f"cannot read {name}: {exc}")
        except UnicodeDecodeError:
            return ControlDecision(error=f"{name} is not UTF-8 text; ignored")
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply to parse
            return ControlDecision(error=f"{name} is not valid JSON ({_short(exc)}); ignored")
        return self._decide(data)

    def _changed(self, stamp: tuple[int, ...]) -> bool:
        changed, self._stamp = stamp != self._stamp, stamp
        return changed

    def _decide(self, data: object) -> ControlDecision:
        name = self.path.name
        if not isinstance(data, dict):
            return ControlDecision(error=f"{name} must hold a JSON object, got {type(data).__name__}; ignored")
        request_id = data.get("request_id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            return ControlDecision(error=f"{name}: request_id must be an integer, got {_short(request_id)}; ignored")
        if request_id == self._seen_id:
            return ControlDecision()
        self._seen_id = request_id
        impl = data.get("loss_impl")
        if impl is not None and impl not in LOSS_IMPLS:
            return ControlDecision(error=f"{name}: loss_impl {_short(impl)} unknown; allowed: {', '.join(LOSS_IMPLS)}")
        stop = data.get("stop", False)
        if not isinstance(stop, bool):
            return ControlDecision(error=f"{name}: stop must be true or false, got {_short(stop)}")
        return ControlDecision(stop=stop, loss_impl=impl, request_id=request_id)


def _short(value: object, limit: int = 60) -> str:
    """repr of a value from the file, cut: the error goes into a one-line event."""
    text = str(value) if isinstance(value, Exception) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SupervisorWatch:
    """Whether the supervisor that started this trainer still runs.

    The supervisor passes its pid and create time in the environment (SUPERVISOR_PID_ENV and
    SUPERVISOR_STARTED_ENV); a trainer started by hand has neither and is never told to stop.
    """

    def __init__(self, environ: Mapping[str, str] = os.environ) -> None:
        try:
            self.pid: int | None = int(environ[SUPERVISOR_PID_ENV])
            self.started: float | None = float(environ[SUPERVISOR_STARTED_ENV])
        except (KeyError, ValueError):
            self.pid = self.started = None

    def lost(self) -> str | None:
        """None while the supervisor runs (or none was recorded); else the one line saying it is gone."""
        if self.pid is None or pid_alive(self.pid, self.started):
            return None
        return f"the supervisor (pid {self.pid}) is gone; the trainer stopped itself at a step boundary"
