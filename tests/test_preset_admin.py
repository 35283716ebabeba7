"""User presets from the command line: a built-in's name is not taken silently; delete asks; rename."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grpo_tui.cli import main


@pytest.fixture(autouse=True)
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "user-presets"
    monkeypatch.setenv("GRPO_TUI_PRESETS_DIR", str(folder))
    return folder


def test_save_over_a_builtin_name_is_refused_unless_asked(user_dir: Path, capsys) -> None:
    assert main(["presets", "save", "tiny-cpu", "--set", "grpo.max_steps=5"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "name: tiny-cpu is a built-in preset; choose another name, or pass --shadow to use yours in its place"
        " (delete yours to get the built-in back)"
    ]
    assert not (user_dir / "tiny-cpu.toml").exists()
    assert main(["presets", "save", "tiny-cpu", "--shadow", "--set", "grpo.max_steps=5"]) == 0
    capsys.readouterr()
    assert main(["presets", "list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("tiny-cpu "))
    assert "user (shadows the built-in)" in row


def test_delete_asks_and_needs_yes_without_a_terminal(user_dir: Path, capsys) -> None:
    assert main(["presets", "save", "mine"]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "grpo_tui.cli", "presets", "delete", "mine"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 2 and "needs --yes when there is no terminal to ask" in done.stderr
    assert (user_dir / "mine.toml").exists()
    assert main(["presets", "delete", "mine", "--yes"]) == 0
    assert not (user_dir / "mine.toml").exists()
    capsys.readouterr()
    assert main(["presets", "delete", "tiny-cpu", "--yes"]) == 2
    assert "tiny-cpu: is built-in (read-only)" in capsys.readouterr().err


def test_delete_in_a_terminal_asks_first(user_dir: Path, monkeypatch, capsys) -> None:
    assert main(["presets", "save", "mine"]) == 0
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert main(["presets", "delete", "mine"]) == 1 and (user_dir / "mine.toml").exists()
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert main(["presets", "delete", "mine"]) == 0 and not (user_dir / "mine.toml").exists()


def test_rename(user_dir: Path, capsys) -> None:
    assert main(["presets", "save", "mine", "--set", "grpo.max_steps=7"]) == 0
    assert main(["presets", "rename", "mine", "yours"]) == 0
    assert not (user_dir / "mine.toml").exists()
    capsys.readouterr()
    assert main(["presets", "show", "yours"]) == 0
    out = capsys.readouterr().out
    assert 'name = "yours"' in out and "max_steps = 7" in out
    assert main(["presets", "rename", "yours", "tiny-cpu"]) == 2
    assert "tiny-cpu is a built-in preset" in capsys.readouterr().err
    assert main(["presets", "rename", "tiny-cpu", "x"]) == 2
    assert "tiny-cpu: is built-in (read-only)" in capsys.readouterr().err
