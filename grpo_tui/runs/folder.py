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
    run.lock               the claim of the one supervisor driving the run (runs/claim.py)
    checkpoints/           checkpoint-<step>/ from the trainer (logging.save_steps, every stop); `resume` reads them
    model/                 the trained model in Hugging Face format, written when training ends (model_dir.py)
    eval.json              held-out scores of the base and the trained model (`grpo-tui eval`)
    heartbeat*.json        each rank's phase in progress, rewritten every few seconds (see heartbeat.py)

Data flows one way (runner -> trainer -> files -> dashboard); the only way back is control.json.
The folder is created 0700 and every file in it 0600 (prompts and completions are the user's data);
a umask can only narrow that further.
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
from typing import IO, Any

from grpo_tui.config.schema import LOSS_IMPLS, Preset

# Modes a run's folder and files are created with (os.mkdir / os.open apply the umask on top).
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Largest JSON file read_json parses: run.json, command.json and control.json are a few hundred bytes;
# anything far larger was not written by us and is not worth parsing (a 50 MB control.json once was).
MAX_JSON_BYTES = 64 * 1024
_OPEN_FLAGS = {"a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC}


def open_private(path: Path, mode: str = "a", encoding: str | None = "utf-8") -> IO[Any]:
    """`open(path, mode)` ("a", "ab", "w", "wb"), but a file it creates is private (PRIVATE_FILE_MODE)."""
    fd = os.open(path, _OPEN_FLAGS[mode[0]], PRIVATE_FILE_MODE)
    return os.fdopen(fd, mode, encoding=None if "b" in mode else encoding)


def write_private_text(path: Path, text: str) -> None:
    """`path.write_text(text)`, creating the file private (PRIVATE_FILE_MODE)."""
    with open_private(path, "w") as handle:
        handle.write(text)


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
    """The JSON object in `path`, or None when missing, unreadable, over MAX_JSON_BYTES or not an object.

    Never raises for the content: these files may be edited by hand (binary, deeply nested, huge).
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_JSON_BYTES + 1)
        if len(raw) > MAX_JSON_BYTES:
            return None
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # ValueError covers bad JSON and bad UTF-8
        return None
    return data if isinstance(data, dict) else None


def file_stamp(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of `path`, None when it is missing: a reader re-parses a file only when this changed."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


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
        candidate.parent.mkdir(parents=True, exist_ok=True)
        candidate.mkdir(mode=PRIVATE_DIR_MODE)
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
    def lock(self) -> Path:
        return self.path / "run.lock"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def model(self) -> Path:
        return self.path / "model"

    @property
    def eval(self) -> Path:
        return self.path / "eval.json"

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint-<step>/ (one with the trainer state, written last), or None."""
        found = []
        try:
            entries = list(self.checkpoints.iterdir())
        except OSError:
            return None
        for entry in entries:
            match = re.fullmatch(r"checkpoint-(\d+)", entry.name)
            if match and (entry / "trainer_state.json").is_file():
                found.append((int(match.group(1)), entry))
        return max(found)[1] if found else None

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
        """Merge fields into control.json (e.g. loss_impl="naive", stop=True) and rewrite it atomically.

        A request id lets the trainer tell a new request from one it already acted on. Whatever the
        file held (a hand edit: garbage, wrong types), only the valid requests in it are kept, so the
        new one is never rejected for an old mistake.
        """
        old = read_json(self.control) or {}
        control = _valid_requests(old)
        control.update(fields)
        previous = old.get("request_id")
        if isinstance(previous, int) and not isinstance(previous, bool) and 0 <= previous < 2**53:
            control["request_id"] = previous + 1
        elif not self.control.exists():
            control["request_id"] = 1
        else:
            # The last id is unknown: one from the clock (ms) differs from any the trainer has seen.
            control["request_id"] = time.time_ns() // 1_000_000
        control["time"] = time.time()
        write_json_atomic(self.control, control)
        return control


def _valid_requests(control: dict[str, Any]) -> dict[str, Any]:
    """The requests of an old control.json that the trainer accepts (see train/control.py)."""
    kept: dict[str, Any] = {k: control[k] for k in ("stop", "kill") if isinstance(control.get(k), bool)}
    if control.get("loss_impl") in LOSS_IMPLS:
        kept["loss_impl"] = control["loss_impl"]
    return kept


def list_runs(runs_dir: Path) -> list[RunDir]:
    """Run folders (those with a run.json or metrics.jsonl), newest first."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    found = [run for run in map(RunDir, root.iterdir()) if run.is_run]
    return sorted(found, key=lambda r: r.name, reverse=True)
