"""A `module:function` reward is called once on a sample before launch: a wrong answer is one line, no run."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_tui.cli import main

REWARDS = """
def scalar(completions, **kwargs):
    return 1.0

def too_short(completions, **kwargs):
    return [1.0]

def words(completions, **kwargs):
    return ["good" for _ in completions]

def raises(completions, answer, **kwargs):
    return [float(a["value"]) for a in answer]

def fine(completions, answer, **kwargs):
    return [float(c == a) for c, a in zip(completions, answer)]
"""

CASES = {
    "scalar": "returned 1.0 (float); a reward returns a list of 2 numbers for 2 completions (None: no reward)",
    "too_short": "returned a list of 1 for 2 completions; a reward returns a list of 2 numbers for 2 completions",
    "words": "returned 'good' (str) in its list; a reward returns a list of 2 numbers for 2 completions",
    "raises": "raised TypeError on a sample of 2 completions: string indices must be integers",
}


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "trial_rewards.py").write_text(REWARDS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # rewards are imported from the working folder, as the trainer does
    yield tmp_path
    import sys

    sys.modules.pop("trial_rewards", None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_wrong_reward_answer_is_refused_before_launch(
    reward_module: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sets = ["--set", f"rewards.functions=[{{name='trial_rewards:{name}'}}]"]
    assert main(["run", "tiny-cpu", "--headless", *sets]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"rewards.functions.0.name: got 'trial_rewards:{name}'; {CASES[name]}"), lines
    assert not (reward_module / "runs").exists()


def test_a_reward_that_answers_per_completion_passes(reward_module: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = ["--set", "rewards.functions=[{name='trial_rewards:fine'}]"]
    assert main(["presets", "show", "tiny-cpu", *sets]) == 0
    assert "# error" not in capsys.readouterr().out
