"""Reading control.json (the runner's and dashboard's requests) at step boundaries.

The file is written atomically by `RunDir.request`; each write bumps `request_id`, so a request is
acted on once. Fields: `stop: true`, `loss_impl: "chunked" | "naive" | "trl"`; `kill: true` (beside
`stop`, from `control --stop --force`) is read by the runner only, to tell a kill from a failure. A
malformed file is reported once (per distinct content) and otherwise ignored: the run goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grpo_tui.config.schema import LOSS_IMPLS


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
        self._reported: str | None = None

    def poll(self) -> ControlDecision:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ControlDecision()
        except OSError as exc:
            return self._error(f"cannot read {self.path.name}: {exc}", str(exc))
        try:
            data = json.loads(text)
        except ValueError as exc:
            return self._error(f"{self.path.name} is not valid JSON ({exc}); ignored", text)
        if not isinstance(data, dict):
            return self._error(f"{self.path.name} must hold a JSON object, got {type(data).__name__}; ignored", text)
        request_id = data.get("request_id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            return self._error(f"{self.path.name}: request_id must be an integer, got {request_id!r}; ignored", text)
        if request_id == self._seen_id:
            return ControlDecision()
        impl = data.get("loss_impl")
        if impl is not None and impl not in LOSS_IMPLS:
            self._seen_id = request_id
            return self._error(f"{self.path.name}: loss_impl {impl!r} unknown; allowed: {', '.join(LOSS_IMPLS)}", text)
        stop = data.get("stop", False)
        if not isinstance(stop, bool):
            self._seen_id = request_id
            return self._error(f"{self.path.name}: stop must be true or false, got {stop!r}", text)
        self._seen_id = request_id
        self._reported = None
        return ControlDecision(stop=stop, loss_impl=impl, request_id=request_id)

    def _error(self, message: str, content: str) -> ControlDecision:
        if content == self._reported:
            return ControlDecision()
        self._reported = content
        return ControlDecision(error=message)
