"""The embedded tiny model: tokenizer round trip, cache key, a cached build that learned something."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_tui.tasks import tiny


def test_character_tokenizer_round_trip() -> None:
    tokenizer = tiny.build_tokenizer()
    text = "12+34=46 and Tom's $1,234.5?\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character, spaces and newlines included
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == 1 and tokenizer.pad_token_id == 0


def test_cache_key_follows_config_and_recipe() -> None:
    base = tiny.cache_key()
    assert base == tiny.cache_key(dict(tiny.TINY_CONFIG))
    assert base != tiny.cache_key({**tiny.TINY_CONFIG, "hidden_size": 32})
    assert base != tiny.cache_key(recipe=tiny.WarmStart(steps=1))


def test_cache_root_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tiny.CACHE_ENV, str(tmp_path))
    assert tiny.cache_root() == tmp_path.resolve()


def test_warm_start_lowers_the_loss(tmp_path: Path) -> None:
    recipe = tiny.WarmStart(steps=40, batch_size=32)
    path = tiny.ensure_tiny_model(recipe=recipe, root=tmp_path)
    import json

    info = json.loads((path / "warm_start.json").read_text())
    assert info["last_loss"][0] < info["first_loss"][0] - 0.5
    # Built once: a second call returns the same folder without rebuilding
    mtime = (path / "config.json").stat().st_mtime
    assert tiny.ensure_tiny_model(recipe=recipe, root=tmp_path) == path
    assert (path / "config.json").stat().st_mtime == mtime


def test_default_model_answers_some_sums(tiny_model_path: Path) -> None:
    """After the default warm start, greedy answers are often right: GRPO starts from a model with signal."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_tui.tasks.data import addition_rows
    from grpo_tui.tasks.rewards import addition_partial

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    rows = addition_rows(64, seed=99)
    batch = tokenizer([r["question"] for r in rows], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=0)
    completions = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    scores = addition_partial(completions, answer=[r["answer"] for r in rows])
    assert sum(scores) / len(scores) > 0.3
