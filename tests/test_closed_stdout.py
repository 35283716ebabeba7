"""A listing whose reader has gone (`grpo-tui runs | head -1`) ends quietly with exit 0, as Unix tools do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_tui.tools.demo import make_run


@pytest.mark.parametrize("command", [["presets", "list"], ["runs", "--runs-dir", "RUNS"]])
def test_a_closed_stdout_is_not_an_error(command: list[str], tmp_path: Path) -> None:
    make_run(tmp_path / "runs" / "one", steps=3)
    argv = [sys.executable, "-m", "grpo_tui.cli", *(str(tmp_path / "runs") if a == "RUNS" else a for a in command)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == ""
