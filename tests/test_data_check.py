"""A preset's local data file is read through before launch: no run folder for data the trainer would refuse."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import tomli_w

from grpo_tui.cli import main
from grpo_tui.config.store import BUILTIN_DIR
from grpo_tui.userinput import clip

ROWS = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(300)]


def preset_beside(folder: Path, data: str, template: str = "{question}") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mine.toml"
    preset = tomllib.loads((BUILTIN_DIR / "tiny-cpu.toml").read_text(encoding="utf-8"))
    preset.update(name="mine")
    preset["data"].update(source=data, prompt_template=template)
    path.write_text(tomli_w.dumps(preset), encoding="utf-8")
    return path


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


CASES = {
    "empty": ([], "data.source: {file} has no rows"),
    "bad line": (
        [json.dumps(r) for r in ROWS[:200]] + ['{"question": "1+1=", answer}'],
        "data.source: {file} line 201: not valid JSON (Expecting property name enclosed in double quotes)",
    ),
    "missing column": (
        [json.dumps(r) for r in ROWS[:10]] + [json.dumps({"q": "1+1=", "answer": "2"})],
        "data.prompt_template: names column 'question', missing from {file} line 11 (its columns: answer, q)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_data_is_refused_by_validate_and_run(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, expected = CASES[case]
    data = tmp_path / "presets" / "train.jsonl"
    write_lines(data, lines)
    preset = preset_beside(tmp_path / "presets", "train.jsonl")
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the data path is the preset file's, not the current folder's
    line = expected.format(file=clip(str(data)))

    assert main(["presets", "validate", str(preset)]) == 2
    assert f"{clip(str(preset))}: {line}" in capsys.readouterr().err.splitlines()
    assert main(["run", str(preset), "--headless"]) == 2
    assert capsys.readouterr().err.splitlines() == [line]
    assert not (elsewhere / "runs").exists()


def test_data_beside_the_preset_is_found_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "presets" / "data" / "train.jsonl"
    write_lines(data, [json.dumps(r) for r in ROWS])
    preset = preset_beside(tmp_path / "presets", "data/train.jsonl")
    monkeypatch.chdir(tmp_path)
    assert main(["presets", "validate", str(preset)]) == 0
    capsys.readouterr()
    assert main(["presets", "show", str(preset)]) == 0
    out = capsys.readouterr().out
    assert f'source = "{data}"' in out
    assert f"read from the file's folder ({preset.parent})" in out


def test_a_json_array_file_is_checked_row_by_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "train.json"
    data.write_text(json.dumps([ROWS[0], ["not", "an", "object"]]), encoding="utf-8")
    preset = preset_beside(tmp_path, "train.json")
    assert main(["presets", "validate", str(preset)]) == 2
    assert (
        f"{clip(str(preset))}: data.source: {clip(str(data))} row 2: not a JSON object (got list)"
        in capsys.readouterr().err
    )
