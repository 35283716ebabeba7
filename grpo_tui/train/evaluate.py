"""Held-out evaluation: the base model and a run's trained model scored on the same prompts -> RUN/eval.json.

    grpo-tui eval RUN [--prompts N] [--mode greedy|sampled] [--device auto|cpu|cuda]

The prompts are the preset's `[eval]` held-out rows (tasks/heldout.py: another source or split, or rows of
the training source that training never saw). Both models complete every prompt the same way (greedy, or
sampled with grpo.temperature / top_p from a fixed seed, up to grpo.max_completion_length tokens) and each
reward function (eval.rewards, else the preset's) scores both. eval.json holds, per reward, the mean
"before" (base) and "after" (trained), and the preset's weighted total as `reward`. Also run by the trainer
when a run finishes, with `eval.at_end` (on in tiny-cpu).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from grpo_tui.config.schema import Preset
from grpo_tui.runs.folder import RunDir, write_json_atomic
from grpo_tui.runs.model_dir import KIND_LORA, read_info
from grpo_tui.train.export import MESSAGE_LIMIT, OneLineParser
from grpo_tui.userinput import clip


class EvalError(ValueError):
    """An evaluation that cannot run (one user-facing line)."""


# Completion length when the preset sets none (grpo.max_completion_length = none).
DEFAULT_NEW_TOKENS = 256


def load_models(run: RunDir, preset: Preset, device: Any) -> tuple[Any, Any, Any]:
    """(base model, trained model, tokenizer) of a run, in eval mode on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_tui.train.assemble import resolve_model

    if not run.model.is_dir():
        raise EvalError(f"{run.path}: no model/ to evaluate (saved when a run finishes or stops)")
    info = read_info(run.model)
    base_path = info.get("base_path")
    if not isinstance(base_path, str) or not Path(base_path).is_dir():
        base_path = resolve_model(preset)
    options = {"trust_remote_code": preset.model.trust_remote_code}
    try:
        base = AutoModelForCausalLM.from_pretrained(base_path, **options)
        if info.get("kind") == KIND_LORA:
            from peft import PeftModel

            # A second copy of the base under the adapter: the first stays the untouched "before"
            trained = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path, **options), run.model)
        else:
            trained = AutoModelForCausalLM.from_pretrained(run.model, **options)
        tokenizer = AutoTokenizer.from_pretrained(
            run.model if (run.model / "tokenizer_config.json").exists() else base_path
        )
    except Exception as exc:  # whatever the folders hold: one line
        from grpo_tui.runs.failures import exception_line

        raise EvalError(f"{run.model}: cannot load the models to evaluate: {exception_line(exc)[:200]}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return base.to(device).eval(), trained.to(device).eval(), tokenizer


def complete(model: Any, tokenizer: Any, prompts: list[Any], preset: Preset, device: Any) -> list[str]:
    """One completion per prompt (text, or chat messages rendered with the chat template)."""
    import torch

    section, grpo = preset.eval, preset.grpo
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) if isinstance(p, list) else p
        for p in prompts
    ]
    sampled = section.mode == "sampled"
    options: dict[str, Any] = {
        "max_new_tokens": grpo.max_completion_length or DEFAULT_NEW_TOKENS,
        "do_sample": sampled,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if sampled:
        options.update(temperature=grpo.temperature, top_p=grpo.top_p)
    else:  # no sampling knobs from the model's generation_config either
        options.update(temperature=None, top_p=None, top_k=None)
    torch.manual_seed(section.seed)  # the same draws for the base and the trained model
    out: list[str] = []
    for start in range(0, len(texts), section.batch_size):
        batch = tokenizer(
            texts[start : start + section.batch_size],
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=False,
        ).to(device)
        with torch.no_grad():
            ids = model.generate(**batch, **options)
        out += tokenizer.batch_decode(ids[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def score(preset: Preset, rows: Any, completions: list[str]) -> dict[str, float]:
    """Mean of each reward over the completions (None-valued rewards are left out of the mean)."""
    from grpo_tui.tasks.rewards import resolve_reward

    prompts = list(rows["prompt"])
    chat = bool(prompts) and isinstance(prompts[0], list)
    shaped = [[{"role": "assistant", "content": c}] for c in completions] if chat else completions
    columns = {name: list(rows[name]) for name in rows.column_names if name != "prompt"}
    means = {}
    for name in reward_names(preset):
        values = [
            float(v) for v in resolve_reward(name)(prompts=prompts, completions=shaped, **columns) if v is not None
        ]
        finite = [v for v in values if math.isfinite(v)]
        means[name] = sum(finite) / len(finite) if finite else float("nan")
    return means


def reward_names(preset: Preset) -> list[str]:
    return list(preset.eval.rewards) or [spec.name for spec in preset.rewards.functions]


def weighted(preset: Preset, means: dict[str, float]) -> float | None:
    """The preset's weighted reward total, as training logs `reward` (None with eval.rewards of its own)."""
    if preset.eval.rewards:
        return None
    return sum(spec.weight * means[spec.name] for spec in preset.rewards.functions)


def evaluate_run(run: RunDir, preset: Preset | None = None, device: Any = None) -> dict[str, Any]:
    """Score the base and the trained model of `run` on the held-out prompts; writes and returns eval.json."""
    import torch

    from grpo_tui.tasks.heldout import eval_rows

    preset = preset or run.load_preset()
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.time()
    base, trained, tokenizer = load_models(run, preset, device)
    rows = eval_rows(preset, tokenizer)
    prompts = list(rows["prompt"])
    before = score(preset, rows, complete(base, tokenizer, prompts, preset, device))
    after = score(preset, rows, complete(trained, tokenizer, prompts, preset, device))
    section = preset.eval
    result = {
        "prompts": len(prompts),
        "source": section.source or preset.data.source,
        "split": section.split if section.source else f"{preset.data.split} (held out by eval.seed)",
        "seed": section.seed,
        "mode": section.mode,
        "rewards": {name: {"before": before[name], "after": after[name]} for name in before},
        "reward": {"before": weighted(preset, before), "after": weighted(preset, after)},
        "model": str(run.model),
        "seconds": time.time() - started,
        "time": time.time(),
    }
    write_json_atomic(run.eval, result)
    return result


def summary_lines(result: dict[str, Any]) -> list[str]:
    """`name  before -> after` per reward, and the weighted total."""
    rows = [(name, r["before"], r["after"]) for name, r in result["rewards"].items()]
    if result["reward"]["before"] is not None:
        rows.append(("reward (weighted)", result["reward"]["before"], result["reward"]["after"]))
    width = max(len(name) for name, _, _ in rows)
    return [f"{name:<{width}}  {a:.3f} → {b:.3f}" for name, a, b in rows]


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="grpo-tui eval", description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the run folder")
    parser.add_argument("--prompts", type=int, help="held-out prompts scored (default: eval.prompts)")
    parser.add_argument("--mode", choices=("greedy", "sampled"), help="default: eval.mode")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    run = RunDir(args.run.resolve())
    try:
        if not run.is_run:
            raise EvalError(f"{args.run}: not a run folder (no run.json or metrics.jsonl)")
        preset = run.load_preset()
        changes = {k: v for k, v in (("prompts", args.prompts), ("mode", args.mode)) if v is not None}
        if changes:  # validated as the preset field would be
            preset.eval = preset.eval.model_validate({**preset.eval.model_dump(), **changes})
        device = None if args.device == "auto" else args.device
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise EvalError("--device cuda: no CUDA device here")
        result = evaluate_run(run, preset, device)
    except EvalError as exc:
        print(f"grpo-tui eval: {clip(str(exc), MESSAGE_LIMIT)}", file=sys.stderr)
        return 2
    print(f"{result['prompts']} held-out prompts ({result['mode']}), before → after:")
    for line in summary_lines(result):
        print(f"  {line}")
    print(f"wrote {run.eval}")
    return 0
