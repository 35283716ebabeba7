"""Real model shapes with random weights, built offline: `builtin:qwen3-0.6b-shape`, `builtin:qwen3-1.7b-shape`.

Memory and speed depend on a model's shape, not its weights, so benchmarks on machines that cannot
download weights use the exact Qwen3 configs below with random weights, and a byte-level BPE
tokenizer whose vocabulary is padded to the model's real size (151,936) so every sampled id decodes.
The built model is saved with `save_pretrained` (TRL reloads the reference model from a path when
beta > 0) and cached by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The published Qwen3 configs (config.json of Qwen/Qwen3-0.6B and Qwen/Qwen3-1.7B), architecture fields only.
QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b-shape": {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
    "qwen3-1.7b-shape": {
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
}
_COMMON = {
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
# Merges learned from the corpus; the rest of the vocabulary is filler that decodes but never encodes.
_BPE_MERGE_VOCAB = 4096
_SPECIALS = ["<|endoftext|>", "<|pad|>"]


def shape_names() -> list[str]:
    return sorted(QWEN3_SHAPES)


def build_padded_tokenizer(vocab_size: int, corpus: list[str]):
    """A byte-level BPE tokenizer trained on `corpus`, its vocabulary padded to exactly `vocab_size`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(_BPE_MERGE_VOCAB, vocab_size - len(_SPECIALS)),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    filler = 0
    while len(vocab) < vocab_size - len(_SPECIALS):
        # Byte-level alphabet characters only, so the decoder maps each filler token to real bytes.
        vocab[f"Ġfill{filler}"] = len(vocab)
        filler += 1
    for special in _SPECIALS:
        vocab[special] = len(vocab)
    spec["added_tokens"] = [
        {
            "id": vocab[s],
            "content": s,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for s in _SPECIALS
    ]
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))
    fast.eos_token, fast.pad_token = _SPECIALS
    fast.padding_side = "left"
    return fast


def _corpus() -> list[str]:
    """Text to learn merges from: fixed sums in words and digits, the same on every machine, so a benchmark's
    prompts come out the same length wherever the model is built. GSM8K questions come out about three times
    longer than through merges learned on GSM8K itself (~215 tokens against ~74 at 128 prompts)."""
    return [f"What is {a} plus {b}? The answer is {a + b}." for a in range(100) for b in range(0, 100, 7)]


def build_shaped_model(name: str, cache_dir: Path | None = None, seed: int = 0) -> Path:
    """Build (once) and return the folder of a random-weight model with the named real shape."""
    if name not in QWEN3_SHAPES:
        raise ValueError(f"unknown model shape {name!r}; allowed: {', '.join(shape_names())}")
    # One cache for every built model ($GRPO_TUI_CACHE_DIR), built into place atomically.
    from grpo_tui.tasks.tiny import build_once, cache_root

    def build(folder: Path) -> None:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(**_COMMON, **QWEN3_SHAPES[name])
        tokenizer = build_padded_tokenizer(config.vocab_size, _corpus())
        config.eos_token_id = tokenizer.eos_token_id
        config.pad_token_id = tokenizer.pad_token_id
        torch.manual_seed(seed)
        Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    return build_once((cache_dir or cache_root()) / "models" / name, build)
