"""The app's export: `grpo-tui export` in a child process (the app never loads torch), its outcome as one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

# Seconds an export may take before the app gives up on it (a 7B merge on a slow disk is minutes).
EXPORT_TIMEOUT_S = 3600


class ExportOptions(NamedTuple):
    """The export dialog's fields, as `grpo-tui export` takes them."""

    to: Path
    merged: bool = False
    dtype: str | None = None  # bf16 | fp16 | fp32; None keeps the trained dtype
    force: bool = False


class ExportOutcome(NamedTuple):
    ok: bool
    line: str  # "wrote DIR (size)" or the one-line refusal


def export_argv(run: Path, options: ExportOptions) -> list[str]:
    argv = [sys.executable, "-m", "grpo_tui.cli", "export", str(run), "--to", str(options.to)]
    argv += ["--merged"] if options.merged else []
    argv += ["--dtype", options.dtype] if options.dtype else []
    argv += ["--force"] if options.force else []
    return argv


def run_export(run: Path, options: ExportOptions) -> ExportOutcome:
    """Export `run`'s model as the dialog asked; blocks (call it from a thread worker)."""
    try:
        proc = subprocess.run(
            export_argv(run, options),
            capture_output=True,
            text=True,
            timeout=EXPORT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ExportOutcome(False, f"export did not run: {exc}")
    if proc.returncode == 0:
        wrote = [line for line in proc.stdout.splitlines() if line.startswith("wrote ")]
        return ExportOutcome(True, wrote[-1] if wrote else f"wrote {options.to}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return ExportOutcome(False, lines[-1] if lines else f"export failed (exit code {proc.returncode})")
