"""The preset's `[grpo]`, `[logging]`, `[model]` and `[distributed]` fields as TRL's `GRPOConfig`.

The one place a preset field becomes a TRL argument; the fields grpo-tui fixes for every run carry why.
"""

from __future__ import annotations

from typing import Any

from grpo_tui.config.schema import Preset
from grpo_tui.runs.folder import RunDir


def grpo_config(preset: Preset, run: RunDir) -> Any:
    """TRL's `GRPOConfig` for `preset`, writing checkpoints under `run`."""
    from trl import GRPOConfig

    g, log = preset.grpo, preset.logging
    dtype = preset.model.dtype
    return GRPOConfig(
        output_dir=str(run.checkpoints),
        per_device_train_batch_size=g.per_device_batch_size,
        gradient_accumulation_steps=g.gradient_accumulation_steps,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        learning_rate=g.learning_rate,
        lr_scheduler_type=g.lr_scheduler_type,
        warmup_steps=g.warmup_steps,
        beta=g.beta,
        epsilon=g.epsilon_low,
        epsilon_high=g.epsilon_high,
        loss_type=g.loss_type,
        importance_sampling_level=g.importance_sampling_level,
        scale_rewards=g.scale_rewards,
        temperature=g.temperature,
        top_p=g.top_p,
        max_steps=g.max_steps,
        num_iterations=g.num_iterations,
        seed=g.seed,
        data_seed=g.seed,
        gradient_checkpointing=g.gradient_checkpointing,
        max_grad_norm=g.max_grad_norm,
        reward_weights=[spec.weight for spec in preset.rewards.functions],
        logging_steps=log.logging_steps,
        save_strategy="steps" if log.save_steps > 0 else "no",
        save_steps=max(log.save_steps, 1),
        save_total_limit=log.save_total_limit,
        report_to=[r for r in log.report_to if r != "none"] or "none",
        use_cpu=preset.distributed.use_cpu,
        bf16=preset.distributed.mixed_precision == "bf16",
        fp16=preset.distributed.mixed_precision == "fp16",
        model_init_kwargs={
            "dtype": dtype,
            "attn_implementation": preset.model.attn_implementation,
            "trust_remote_code": preset.model.trust_remote_code,
        },
        # grpo.generation_backend = vllm passes through to TRL's own vLLM path, in the same process and GPU.
        use_vllm=g.generation_backend == "vllm",
        vllm_mode="colocate",
        disable_tqdm=True,
        log_completions=False,
        # TRL 1.16 weights the KL term by the importance ratio by default; the chunked kernel's KL is the
        # plain k3 estimate. All three loss.impl must compute the same objective (they can be switched
        # live), so the plain KL is used throughout. No effect when beta == 0.
        use_bias_correction_kl=False,
        # The chunked loss uses the lm_head weight after DDP's forward; with unused-parameter search on
        # (the Trainer's default without gradient checkpointing), DDP marks lm_head unused at the forward's
        # end and its gradient then arrives "twice". Every parameter gets a gradient each step anyway.
        ddp_find_unused_parameters=False,
    )
