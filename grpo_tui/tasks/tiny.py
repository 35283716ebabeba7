"""The embedded default model: a tiny Qwen3-architecture causal LM built offline, with a warm start.

`builtin:tiny-qwen3` is built from `TINY_CONFIG` with a fixed seed and a character-level tokenizer made
with `tokenizers`, then given a short supervised warm start on the built-in addition task (300 steps of
64 problems, ~5-10 s on 2 cores). The warm start uses label smoothing 0.5: the model learns the answer
format and ranks the right digits high, but its sampled completions stay spread out (reward ~0.25 at
temperature 1). GRPO then has what it needs to show learning on a small CPU budget: reward variance
within each group and a policy it can sharpen. Measured on this 2-core machine (400 GRPO steps, lr 3e-4):
first-20-step mean reward ~0.25, last-20 ~0.6. Without smoothing, a 150-step warm start climbed only
~0.1 in 1500 steps; exact-match reward alone gave no signal at all.

The result is saved with `save_pretrained` (model and tokenizer) under
`<cache>/models/<key>/`, where `<cache>` is `platformdirs.user_cache_path("grpo-tui")` or the
`GRPO_TUI_CACHE_DIR` environment variable, and `<key>` hashes the config and the warm-start recipe, so
changing either builds a new model instead of reusing a stale one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from grpo_tui.userinput import user_path

BUILTIN_MODEL = "builtin:tiny-qwen3"
CACHE_ENV = "GRPO_TUI_CACHE_DIR"

# Special tokens first so their ids are stable: pad 0, eos 1, unk 2.
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")
# Printable ASCII without the form-feed family: enough for addition and, lossily, for GSM8K text.
CHARACTERS = tuple(string.digits + string.ascii_letters + string.punctuation + " \n")

# hidden 64, 2 layers: ~100k parameters, 20+ GRPO steps/s on 2 CPU cores.
TINY_CONFIG: dict = {
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class WarmStart:
    """Supervised warm start on `a+b=` -> `sum<eos>` (teacher forcing, loss on the answer only)."""

    steps: int = 300
    batch_size: int = 64
    learning_rate: float = 3e-3
    digits: int = 2
    # Label smoothing leaves the sampled policy spread out even where the argmax is right (see module doc).
    label_smoothing: float = 0.5
    seed: int = 0


DEFAULT_WARM_START = WarmStart()
# Bump when the builder's code changes in a way the config and recipe do not capture.
BUILDER_VERSION = 1


def cache_root() -> Path:
    """Where built models live: $GRPO_TUI_CACHE_DIR, else the platform's user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return user_path(override).resolve()
    import platformdirs

    return platformdirs.user_cache_path("grpo-tui")


def cache_key(config: dict | None = None, recipe: WarmStart = DEFAULT_WARM_START) -> str:
    payload = {"config": config or TINY_CONFIG, "warm": asdict(recipe), "v": BUILDER_VERSION, "chars": CHARACTERS}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A character-level tokenizer: one token per character, decoded by plain concatenation."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    # BPE without merges splits every word into characters; the Split pre-tokenizer keeps spaces and newlines
    # as tokens of their own (a WordPiece/whitespace pre-tokenizer would drop them).
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    return tokenizer


def build_model(config: dict | None = None, seed: int = 0):  # -> transformers.Qwen3ForCausalLM
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    vocab_size = len(SPECIAL_TOKENS) + len(CHARACTERS)
    qwen_config = Qwen3Config(
        vocab_size=vocab_size,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        **(config or TINY_CONFIG),
    )
    return Qwen3ForCausalLM(qwen_config).float()


def warm_start(model, tokenizer, recipe: WarmStart = DEFAULT_WARM_START) -> list[float]:
    """Teacher-forced training on random addition problems; returns the loss per step."""
    import torch

    from grpo_tui.tasks.data import addition_problem

    generator = torch.Generator().manual_seed(recipe.seed)
    # One thread: at this size thread hand-offs cost more than the math, and on a busy 2-core machine
    # two threads were measured 20x slower than one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(recipe.steps):
        texts, answers = [], []
        for _ in range(recipe.batch_size):
            question, answer = addition_problem(generator, recipe.digits)
            texts.append(question)
            answers.append(answer + tokenizer.eos_token)
        input_ids, labels = _teacher_forcing_batch(tokenizer, texts, answers)
        logits = model(input_ids=input_ids).logits[:, :-1]  # [B, L-1, V]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            labels[:, 1:].reshape(-1),
            ignore_index=-100,
            label_smoothing=recipe.label_smoothing,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.set_num_threads(threads)
    model.eval()
    return losses


def _teacher_forcing_batch(tokenizer, prompts: list[str], answers: list[str]):
    import torch

    rows, label_rows = [], []
    for prompt, answer in zip(prompts, answers, strict=True):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"]
        rows.append(p + a)
        label_rows.append([-100] * len(p) + a)  # the loss is on the answer only, like GRPO's completions
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    labels = torch.tensor([r + [-100] * (width - len(r)) for r in label_rows])
    return input_ids, labels


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(folder)` unless `target` holds a saved model already; returns `target`.

    Safe against concurrent builders (several ranks, parallel tests): each builds in a temp folder and
    renames it into place; the loser of the race discards its copy.
    """
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def ensure_tiny_model(
    config: dict | None = None, recipe: WarmStart = DEFAULT_WARM_START, root: Path | None = None
) -> Path:
    """Path of the built, warm-started tiny model; builds it on first use."""

    def build(folder: Path) -> None:
        tokenizer = build_tokenizer()
        model = build_model(config, seed=recipe.seed)
        losses = warm_start(model, tokenizer, recipe)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        record = {"recipe": asdict(recipe), "first_loss": losses[:1], "last_loss": losses[-1:]}
        (folder / "warm_start.json").write_text(json.dumps(record, indent=1))

    return build_once((root or cache_root()) / "models" / cache_key(config, recipe), build)


def ensure_random_model(model_id: str, trust_remote_code: bool = False, seed: int = 0) -> Path:
    """`model_id`'s architecture with random weights (fixed seed), saved once so TRL can load it by path.

    Used by `model.config_only`: benchmarks need a real model's shapes, not its weights. The tokenizer is
    the model's own when it can be loaded, else the character tokenizer (its ids fit any large vocab).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(model_id, trust_remote_code=trust_remote_code)
    digest = hashlib.sha256(f"{config.to_json_string()}|{seed}|{BUILDER_VERSION}".encode()).hexdigest()[:16]

    def build(folder: Path) -> None:
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code).save_pretrained(folder)
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=trust_remote_code)
        except (OSError, ValueError):
            tokenizer = build_tokenizer()
        tokenizer.save_pretrained(folder)

    return build_once(cache_root() / "models" / f"random-{digest}", build)
