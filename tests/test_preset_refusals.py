"""Presets the fuzz found accepted though they cannot train: each is one line from `presets validate`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w

from grpo_tui.cli import main
from grpo_tui.config.store import BUILTIN_DIR
from grpo_tui.userinput import clip

TINY = tomllib.loads((BUILTIN_DIR / "tiny-cpu.toml").read_text(encoding="utf-8"))

CASES = {
    "template without a column": (
        ("data", "prompt_template", "Add the numbers."),
        "data.prompt_template: names no column of the data, so every prompt is the same",
    ),
    "huge beta": (("grpo", "beta", 1e18), "grpo.beta: got 1e+18; Input should be less than or equal to 100"),
    "huge alpha": (
        ("peft", "alpha", 2**70),
        "peft.alpha: got 1180591620717411303424; Input should be less than or equal to 65536",
    ),
    "blank model": (("model", "name_or_path", "   "), "model.name_or_path: got '   '; a hub id (owner/name)"),
    "bool fsdp_version": (("distributed", "fsdp_version", True), "distributed.fsdp_version: got True; a number"),
    "a reward twice": (
        ("rewards", "functions", [{"name": "addition_partial"}, {"name": "addition_partial", "weight": 2.0}]),
        "rewards.functions: got [",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_is_refused_in_one_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (section, key, value), expected = CASES[case]
    data = {**TINY, "name": "bad", section: {**TINY.get(section, {}), key: value}}
    path = tmp_path / "bad.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    assert main(["presets", "validate", str(path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": warning" not in line]
    assert len(errors) == 1 and errors[0].startswith(f"{clip(str(path))}: {expected}"), errors
    if case == "a reward twice":
        assert "'addition_partial' is listed twice; list it once (its weight scales it)" in errors[0]


def test_the_bounds_keep_usual_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {**TINY, "name": "ok", "grpo": {**TINY["grpo"], "beta": 0.04}, "peft": {"enabled": False, "alpha": 64.0}}
    data["distributed"] = {**TINY["distributed"], "fsdp_version": 1}
    path = tmp_path / "ok.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    assert main(["presets", "validate", str(path)]) == 0
