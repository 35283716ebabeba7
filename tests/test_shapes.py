"""Real-shape random models: the padded tokenizer decodes every id the model can sample."""

import pytest

from grpo_tui.tasks.shapes import QWEN3_SHAPES, build_padded_tokenizer, build_shaped_model


def test_padded_tokenizer_covers_the_whole_vocab_and_round_trips_text():
    corpus = [f"Tom has {a} apples and buys {b} more. How many now? {a + b}" for a in range(40) for b in range(9)]
    tok = build_padded_tokenizer(5003, corpus)
    assert len(tok) == 5003
    assert tok.eos_token_id == 5001 and tok.pad_token_id == 5002
    text = "Tom has 12 apples and buys 7 more."
    assert tok.decode(tok(text)["input_ids"]) == text
    # Filler ids (never produced by encoding) still decode: a random model samples them.
    decoded = tok.decode(list(range(4990, 5001)))
    assert isinstance(decoded, str) and decoded


def test_unknown_shape_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="allowed: qwen3-0.6b-shape, qwen3-1.7b-shape"):
        build_shaped_model("llama-9b-shape", cache_dir=tmp_path)


def test_shapes_are_the_published_qwen3_sizes():
    assert QWEN3_SHAPES["qwen3-0.6b-shape"]["hidden_size"] == 1024
    assert QWEN3_SHAPES["qwen3-1.7b-shape"]["hidden_size"] == 2048
