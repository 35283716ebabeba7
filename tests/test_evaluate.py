"""Held-out evaluation: tiny-cpu scores higher after training than before, on prompts it never trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_trainer import make_run

from grpo_tui import cli
from grpo_tui.config.store import load_preset
from grpo_tui.runs.metrics import read_records
from grpo_tui.tasks.data import build_prompt_dataset
from grpo_tui.tasks.heldout import eval_rows, training_rows
from grpo_tui.train import entry


@pytest.fixture(scope="module")
def trained(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    run = make_run(tmp_path_factory.mktemp("eval"), "run", grpo={"max_steps": 200})
    assert entry.main(["--run-dir", str(run.path)]) == 0
    return run


def test_a_tiny_cpu_run_ends_scored_before_and_after(trained) -> None:
    (finish,) = [r for r in read_records(trained.metrics) if r.get("event") == "finish"]
    on_file = json.loads(trained.eval.read_text())
    assert finish["eval"]["reward"] == on_file["reward"]
    assert on_file["prompts"] == 128 and on_file["mode"] == "sampled"


def test_grpo_tui_eval_shows_a_higher_after_than_before(trained, capsys) -> None:
    trained.eval.unlink()
    assert cli.main(["eval", str(trained.path)]) == 0
    out = capsys.readouterr().out
    assert "addition_partial" in out and "→" in out and f"wrote {trained.eval}" in out
    result = json.loads(trained.eval.read_text())
    scores = result["rewards"]["addition_partial"]
    assert scores["after"] > scores["before"] + 0.05, scores
    assert result["reward"] == scores  # one reward of weight 1: the weighted total is that reward


def test_the_held_out_prompts_are_never_trained_on(tiny_model_path: Path) -> None:
    preset, _ = load_preset("tiny-cpu")
    all_rows = build_prompt_dataset(preset.data)
    train = training_rows(all_rows, preset.eval)
    held = eval_rows(preset)
    assert len(held) == preset.eval.prompts
    assert not set(held["prompt"]) & set(train["prompt"])
    assert len(train) >= len(all_rows) - preset.eval.prompts * 3  # only the held-out problems (and repeats) go
    other, _ = load_preset("tiny-cpu", ["eval.seed=1"])
    assert set(eval_rows(other)["prompt"]) != set(held["prompt"])  # the seed draws them


def test_eval_refusals_are_one_line(tmp_path: Path, trained, capsys) -> None:
    cases = [
        ([str(tmp_path)], "not a run folder"),
        ([str(trained.path), "--prompts", "0"], "prompts"),
        ([str(trained.path), "--mode", "beam"], "invalid choice"),
    ]
    for argv, message in cases:
        try:
            code = cli.main(["eval", *argv])
        except SystemExit as exc:
            code = exc.code
        assert code == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("eval.source='missing.jsonl'", "eval.source: got 'missing.jsonl'; no such file"),
        ("eval.source='builtin:nope'", "eval.source: got 'builtin:nope'; allowed"),
        ("eval.rewards=['nope']", "eval.rewards.0: got 'nope'; registered rewards"),
    ],
)
def test_eval_section_is_checked_before_a_run_starts(override: str, message: str) -> None:
    from grpo_tui.config.checks import check_preset

    preset, _ = load_preset("tiny-cpu", [override])
    errors = check_preset(preset, environment=False).errors
    assert len(errors) == 1 and errors[0].startswith(message), errors


GSM8K_TEST = Path("/work/shared/data/gsm8k/test.jsonl")


@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason="needs a local copy of GSM8K's test split")
def test_gsm8k_presets_score_test_questions_drawn_by_the_seed(tiny_model_path: Path) -> None:
    from grpo_tui.train.evaluate import score

    overrides = [f"eval.source='{GSM8K_TEST}'", "eval.prompts=6", "model.name_or_path='builtin:tiny-qwen3'"]
    preset, _ = load_preset("qwen3-0.6b-gsm8k", overrides)
    assert preset.eval.split == "test" and not preset.eval.at_end
    rows = eval_rows(preset)
    assert len(rows) == 6 and list(eval_rows(preset)["question"]) == list(rows["question"])  # the same every time
    other, _ = load_preset("qwen3-0.6b-gsm8k", [*overrides, "eval.seed=7"])
    assert set(eval_rows(other)["question"]) != set(rows["question"])
    assert rows["prompt"][0].startswith(preset.data.system_prompt)  # rendered as training renders prompts
    # Accuracy is the gsm8k_correct reward's mean: the gold solutions score 1, a wrong number 0
    assert score(preset, rows, list(rows["answer"]))["gsm8k_correct"] == 1.0
    assert score(preset, rows, ["#### -1"] * 6)["gsm8k_correct"] == 0.0
