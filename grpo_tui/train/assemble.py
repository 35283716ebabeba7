"""The trainer put together from a preset: model path, tokenizer, prompts, rewards, LoRA, GRPOConfig.

Used by the training entry, by `grpo-tui check` (tools/parity_check.py) and by tests and benchmarks that
need a configured trainer without a run.
"""

from __future__ import annotations

from typing import Any

from grpo_tui.config.schema import Preset
from grpo_tui.runs.folder import RunDir
from grpo_tui.train.config_map import grpo_config


def resolve_model(preset: Preset) -> str:
    """A path or hub id TRL can load; builds a built-in model (tiny, or a real shape) on first use."""
    from grpo_tui.tasks.tiny import BUILTIN_MODEL, ensure_tiny_model

    name = preset.model.name_or_path
    if name == BUILTIN_MODEL:
        return str(ensure_tiny_model())
    if name.startswith("builtin:"):
        from grpo_tui.tasks.shapes import QWEN3_SHAPES, build_shaped_model

        shape = name.removeprefix("builtin:")
        if shape not in QWEN3_SHAPES:
            allowed = ", ".join([BUILTIN_MODEL, *(f"builtin:{s}" for s in QWEN3_SHAPES)])
            raise ValueError(f"model.name_or_path: unknown built-in {name!r}; allowed: {allowed}")
        return str(build_shaped_model(shape))
    if preset.model.config_only:
        from grpo_tui.tasks.tiny import ensure_random_model

        return str(ensure_random_model(name, trust_remote_code=preset.model.trust_remote_code))
    return name


def build_trainer(
    preset: Preset, run: RunDir, callbacks: list | None = None, on_step_logged: Any = None, on_event: Any = None
) -> Any:
    """The configured trainer (model, tokenizer, prompts, rewards) — used by train, check and tests."""
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from grpo_tui.tasks.data import build_prompt_dataset
    from grpo_tui.tasks.heldout import training_rows
    from grpo_tui.tasks.rewards import resolve_reward
    from grpo_tui.train.options import TrainerOptions
    from grpo_tui.train.phase_memory import apply_memory_cap
    from grpo_tui.train.trainer import GrpoTuiTrainer

    state = PartialState()
    apply_memory_cap(state.device)
    with state.main_process_first():
        model_path = resolve_model(preset)
    from grpo_tui.tasks.tiny import BUILTIN_MODEL

    if preset.model.name_or_path == BUILTIN_MODEL and state.device.type == "cpu":
        import torch

        # One thread for the tiny model: its matrices are too small to split, and on a busy 2-core machine
        # two threads were measured 4x slower than one (82 s vs 17 s for the default run).
        torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=preset.model.trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Rows held out for [eval] (when it reads data.source itself) are never trained on
    dataset = training_rows(build_prompt_dataset(preset.data, tokenizer, preset.grpo.max_prompt_length), preset.eval)
    rewards = [resolve_reward(spec.name) for spec in preset.rewards.functions]
    peft_config = None
    if preset.peft.enabled:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=preset.peft.r,
            lora_alpha=preset.peft.alpha,
            lora_dropout=preset.peft.dropout,
            target_modules=list(preset.peft.target_modules),
            task_type="CAUSAL_LM",
        )
    trainer = GrpoTuiTrainer(
        model=model_path,
        reward_funcs=rewards,
        args=grpo_config(preset, run),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=callbacks,
        options=TrainerOptions.from_preset(preset, profile_dir=str(run.path)),
        on_event=on_event,
        on_step_logged=on_step_logged,
    )
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # the runner prints its own line per step from metrics.jsonl
    return trainer
