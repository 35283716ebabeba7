"""Reward functions: GSM8K answer extraction on the real test set, the synthetic task's rewards."""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from grpo_tui.tasks.rewards import (
    REWARDS,
    RewardError,
    addition_exact,
    addition_partial,
    extract_final_answer,
    gsm8k_correct,
    gsm8k_format,
    gsm8k_gold,
    length_penalty,
    resolve_reward,
)

GSM8K_TEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


def _gsm8k_rows() -> list[dict]:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test set not found at {GSM8K_TEST.resolve()}")
    return [json.loads(line) for line in GSM8K_TEST.read_text().splitlines() if line.strip()]


def test_rewards_module_does_not_import_torch() -> None:
    code = "import sys, grpo_tui.tasks.rewards; print('torch' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_gsm8k_correct_on_every_gold_answer() -> None:
    rows = _gsm8k_rows()
    answers = [row["answer"] for row in rows]
    scores = gsm8k_correct(answers, answer=answers)
    assert len(scores) == len(rows) > 1000
    assert all(score == 1.0 for score in scores)


@pytest.mark.parametrize("delta", [1, -1, 10])
def test_gsm8k_correct_rejects_perturbed_answers(delta: int) -> None:
    rows = _gsm8k_rows()
    perturbed, golds = [], []
    for row in rows:
        head, _, tail = row["answer"].rpartition("####")
        gold = gsm8k_gold(row["answer"])
        perturbed.append(f"{head}#### {gold + delta}")
        golds.append(row["answer"])
    assert all(score == 0.0 for score in gsm8k_correct(perturbed, answer=golds))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so #### 42", "42"),
        ("The answer is 42.", "42"),
        ("We get \\boxed{42} in the end", "42"),
        ("It costs $1,234 in total", "1234"),
        ("that is 42.0", "42"),
        ("A: 42", "42"),
        ("The answer is 42 apples, I think", "42"),
        ("#### -7", "-7"),
        ("#### 3.5", "3.5"),
        ("first 3 then 5 then 1,000,000", "1000000"),
        ("The answer: 0.25", "0.25"),
    ],
)
def test_extract_final_answer(text: str, expected: str) -> None:
    assert extract_final_answer(text) == Decimal(expected)


def test_extract_final_answer_without_a_number() -> None:
    assert extract_final_answer("no idea") is None
    assert gsm8k_correct(["no idea"], answer=["x #### 3"]) == [0.0]


def test_gsm8k_correct_on_chat_completions() -> None:
    completion = [{"role": "assistant", "content": "Total is 18.\n#### 18"}]
    assert gsm8k_correct([completion], answer=["... #### 18"]) == [1.0]


def test_gsm8k_format() -> None:
    assert gsm8k_format(["steps\n#### 12", "steps, answer 12", "#### 1,200"]) == [1.0, 0.0, 1.0]


def test_length_penalty() -> None:
    assert length_penalty(["a" * 10, "a" * 1500, "a" * 5000]) == [0.0, -0.5, -1.0]


def test_addition_rewards() -> None:
    completions = ["46", "45", "146", "4", "", "46x"]
    answers = ["46"] * len(completions)
    assert addition_exact(completions, answer=answers) == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    partial = addition_partial(completions, answer=answers)
    assert partial[0] == 1.0
    assert partial[1] == 0.5  # one of two digits right
    assert partial[2] == 0.0  # misaligned: "1" vs "4", "4" vs "6"
    assert partial[3] == 0.5
    assert partial[4] == 0.0
    assert partial[5] == pytest.approx(2 / 3)  # the extra character costs credit
    assert all(0.0 <= score <= 1.0 for score in partial)


def test_registry_and_user_functions() -> None:
    assert {"gsm8k_correct", "gsm8k_format", "length_penalty", "addition_partial", "addition_exact"} <= set(REWARDS)
    assert resolve_reward("addition_exact") is addition_exact
    assert resolve_reward("grpo_tui.tasks.rewards:gsm8k_format") is gsm8k_format
    with pytest.raises(RewardError, match="unknown reward 'nope'"):
        resolve_reward("nope")
    with pytest.raises(RewardError, match="cannot import module"):
        resolve_reward("no_such_module_xyz:f")
    with pytest.raises(RewardError, match="has no function"):
        resolve_reward("grpo_tui.tasks.rewards:missing")
