"""Prompt datasets: the built-in addition task, local JSONL/Parquet files, template errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_tui.config.schema import DataSection
from grpo_tui.tasks.data import DataError, addition_rows, build_prompt_dataset, load_rows

GSM8K_TEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


def test_addition_rows_are_correct_and_reproducible() -> None:
    rows = addition_rows(200, seed=7)
    assert rows == addition_rows(200, seed=7)
    assert rows != addition_rows(200, seed=8)
    for row in rows:
        a, b = row["question"].removesuffix("=").split("+")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert int(row["answer"]) == int(a) + int(b)


def test_builtin_addition_prompts() -> None:
    dataset = build_prompt_dataset(DataSection(source="builtin:addition", max_samples=50))
    assert len(dataset) == 50
    assert dataset[0]["prompt"] == dataset[0]["question"]
    assert dataset[0]["prompt"].endswith("=")


def test_local_jsonl_with_template_and_system_prompt(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) for i in range(5)))
    section = DataSection(source=str(path), prompt_template="Q: {question}\nA:", system_prompt="Be brief.")
    dataset = build_prompt_dataset(section)
    assert dataset[3]["prompt"] == "Be brief.\nQ: q3\nA:"
    assert dataset[3]["answer"] == "#### 3"


def test_local_parquet(tmp_path: Path) -> None:
    import datasets

    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list([{"question": "1+1=", "answer": "2"}]).to_parquet(str(path))
    assert build_prompt_dataset(DataSection(source=str(path)))[0]["prompt"] == "1+1="


def test_gsm8k_local_copy_has_the_hub_columns() -> None:
    if not GSM8K_TEST.is_file():
        pytest.skip(f"GSM8K test set not found at {GSM8K_TEST.resolve()}")
    dataset = build_prompt_dataset(DataSection(source=str(GSM8K_TEST), max_samples=3))
    assert len(dataset) == 3 and "####" in dataset[0]["answer"]


def test_bad_sources_and_templates(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data.source: file not found"):
        load_rows(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="unknown built-in"):
        load_rows("builtin:nope")
    with pytest.raises(DataError, match=r"data.prompt_template: refers to 'nope'"):
        build_prompt_dataset(DataSection(source="builtin:addition", prompt_template="{nope}"))


def test_long_prompts_keep_their_last_tokens(tmp_path: Path) -> None:
    from grpo_tui.tasks.tiny import build_tokenizer

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"question": "a long preamble then 12+34=", "answer": "46"}))
    dataset = build_prompt_dataset(DataSection(source=str(path)), build_tokenizer(), max_prompt_length=6)
    assert dataset[0]["prompt"] == "12+34="
    whole = build_prompt_dataset(DataSection(source=str(path)), build_tokenizer(), max_prompt_length=100)
    assert whole[0]["prompt"] == "a long preamble then 12+34="
