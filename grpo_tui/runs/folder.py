"""The run folder: the one place a run's state lives, shared by runner, trainer and dashboard.

runs/<YYYYmmdd-HHMMSS>-<preset>/
    config.toml            the fully resolved preset (what the trainer reads)
    accelerate.yaml        the generated accelerate config
    command.json           the exact argv that was launched
    stdout.log             the trainer's stdout and stderr
    metrics.jsonl          the metrics stream (see metrics.py)
    completions.jsonl      sampled completions with rewards and advantages, bounded per step
    control.json           requests to the trainer (loss_impl switch, stop), written atomically
    run.json               pids, process group, state, exit code (written by the runner; status.judge reads it)

Data flows one way (runner -> trainer -> files -> dashboard); the only way back is control.json.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_tui.config.schema import Preset


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write a temp file beside `path`, then `os.replace`: readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sanitize_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")
    return cleaned[:64] or "run"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @classmethod
    def create(cls, runs_dir: Path, preset_name: str, now: float | None = None) -> RunDir:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
        base = Path(runs_dir).resolve() / f"{stamp}-{sanitize_name(preset_name)}"
        candidate, n = base, 1
        while candidate.exists():
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
        candidate.mkdir(parents=True)
        return cls(candidate)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def config(self) -> Path:
        return self.path / "config.toml"

    def load_preset(self) -> Preset:
        """config.toml: the preset as resolved and checked when the run was prepared (what every rank reads)."""
        with open(self.config, "rb") as handle:
            return Preset.model_validate(tomllib.load(handle))

    @property
    def accelerate_config(self) -> Path:
        return self.path / "accelerate.yaml"

    @property
    def command(self) -> Path:
        return self.path / "command.json"

    @property
    def stdout(self) -> Path:
        return self.path / "stdout.log"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def completions(self) -> Path:
        return self.path / "completions.jsonl"

    @property
    def control(self) -> Path:
        return self.path / "control.json"

    @property
    def status(self) -> Path:
        return self.path / "run.json"

    @property
    def is_run(self) -> bool:
        """A run folder: one with a run.json (runner) or a metrics.jsonl (a trainer started by hand)."""
        return self.path.is_dir() and (self.status.exists() or self.metrics.exists())

    def read_status(self) -> dict[str, Any]:
        return read_json(self.status) or {}

    def update_status(self, **fields: Any) -> dict[str, Any]:
        status = {**self.read_status(), **fields}
        write_json_atomic(self.status, status)
        return status

    def request(self, **fields: Any) -> dict[str, Any]:
        """Merge fields into control.json (e.g. loss_impl="naive", stop=True); a request id lets the
        trainer tell a new request from one it already acted on."""
        control = read_json(self.control) or {}
        control.update(fields)
        control["request_id"] = int(control.get("request_id", 0)) + 1
        control["time"] = time.time()
        write_json_atomic(self.control, control)
        return control


def list_runs(runs_dir: Path) -> list[RunDir]:
    """Run folders (those with a run.json or metrics.jsonl), newest first."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    found = [run for run in map(RunDir, root.iterdir()) if run.is_run]
    return sorted(found, key=lambda r: r.name, reverse=True)
