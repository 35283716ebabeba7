"""The examples run as their READMEs say: a few real tiny-cpu steps each, from the folder named there."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_tui.cli import main
from grpo_tui.runs.folder import list_runs
from grpo_tui.runs.metrics import read_records, step_records

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
STEPS = 3


def run_example(preset: Path, runs_dir: Path) -> list[dict]:
    sets = ["--set", f"grpo.max_steps={STEPS}", "--runs-dir", str(runs_dir)]
    assert main(["run", str(preset), "--headless", *sets]) == 0
    (run,) = list_runs(runs_dir)
    return step_records(read_records(run.metrics))


@pytest.mark.slow
def test_custom_data_trains_on_the_file_beside_it(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # anywhere: the data path is the preset file's
    steps = run_example(EXAMPLES / "custom-data" / "preset.toml", tmp_path / "runs")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    (run,) = list_runs(tmp_path / "runs")
    assert run.load_preset().data.source == str(EXAMPLES / "custom-data" / "train.jsonl")
    assert len((EXAMPLES / "custom-data" / "train.jsonl").read_text().splitlines()) == 20


@pytest.mark.slow
def test_custom_reward_scores_with_its_module(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(EXAMPLES / "custom-reward")  # as its README says: the module is imported from here
    steps = run_example(Path("preset.toml"), tmp_path / "runs")
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    assert all("rewards/digits_in_place/mean" in s for s in steps)
