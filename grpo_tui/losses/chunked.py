"""loss.impl = chunked: grpo_kernels on the backbone's last hidden states, never the logits.

The hidden states and the lm_head weight go to `fused_linear_grpo_loss` for the training loss and to
`selective_logprobs` for scoring.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from grpo_tui.losses.base import LossImplementation, LossImplError, Refusal, loss_mask, peft_base

CHUNKED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")  # the others are refused with their GRPOConfig names
OTHERS = "use loss.impl naive or trl"


def add_hidden_states_forward(model: Any) -> None:
    """Let `model(..., return_last_hidden=True)` return the backbone's last hidden states, no logits.

    Wraps whatever forward the model has (TRL's fused-head forward included). Going through the
    model's own forward, rather than calling its backbone directly, keeps DDP/FSDP forward hooks firing.
    """
    if getattr(model, "_grpo_tui_hidden_forward", False):
        return
    inner = model.forward

    @functools.wraps(type(model).forward)
    def forward(self: Any, *args: Any, return_last_hidden: bool = False, **kwargs: Any) -> Any:
        if not return_last_hidden:
            return inner(*args, **kwargs)
        kwargs["use_cache"] = False
        return self.base_model(*args, **kwargs).last_hidden_state

    model.forward = types.MethodType(forward, model)
    model._grpo_tui_hidden_forward = True


def lm_head_of(model: Any) -> Any:
    """The output projection of a (possibly PEFT-wrapped) causal LM; refuses a LoRA-adapted head."""
    head = peft_base(model).get_output_embeddings()
    if hasattr(head, "base_layer"):  # peft's BaseTunerLayer: the plain weight would silently ignore the adapter
        raise LossImplError(
            "loss.impl: chunked reads the plain lm_head weight, but peft.target_modules adapts lm_head; "
            "remove lm_head from peft.target_modules or use loss.impl = naive or trl"
        )
    return head


def full_head_params(head: Any) -> tuple[Any, Any | None]:
    """The lm_head weight and bias as whole tensors; under FSDP2 only the head is gathered.

    Inside the root FSDP unit the head is already unsharded after the forward (plain tensors, reduced by
    FSDP's own backward). When the head is an FSDP unit of its own, its weight is a sharded DTensor here:
    `full_tensor()` gathers it, and `grad_placements=Partial("avg")` makes the backward a reduce-scatter
    that averages the ranks' gradients onto the shards, as FSDP does. The default (Replicate) would keep
    each rank's own gradient, silently unreduced (measured on 2 CPU ranks).
    """
    return _full(head.weight), (None if head.bias is None else _full(head.bias))


def _full(param: Any) -> Any:
    if not hasattr(param, "full_tensor"):
        return param
    from torch.distributed.tensor import Partial

    return param.full_tensor(grad_placements=[Partial("avg")] * param.device_mesh.ndim)


def hidden_states(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, packed: bool = False) -> Any:
    """The backbone's last hidden states at the positions that predict the completion: [B, T, H]. `packed`: the
    backbone computes the real tokens only (losses/packing.py); padding positions come back 0."""
    if packed:
        from grpo_tui.losses.packing import packed_hidden_states

        return packed_hidden_states(model, input_ids, attention_mask, logits_to_keep)
    hidden = model(input_ids=input_ids, attention_mask=attention_mask, return_last_hidden=True)
    return hidden[:, -logits_to_keep - 1 : -1]


class ChunkedLoss(LossImplementation):
    name = "chunked"
    summary = "our Triton kernel"
    needs = "the backbone's last hidden states and the plain lm_head weight (no adapter on lm_head)"
    memory_options = ("loss.chunk_tokens", "loss.lean")
    refusals = (
        Refusal(
            "chunked",
            "peft.target_modules",
            lambda s: s.lm_head_adapted,
            "lm_head with loss.impl chunked is refused (the fused head reads the base weight and would ignore "
            "the adapter); drop lm_head or use loss.impl naive or trl",
        ),
        Refusal(
            "chunked",
            "grpo.generation_backend",
            lambda s: s.use_vllm,
            "vllm goes through TRL's vLLM path, which loss.impl chunked does not implement (its "
            "importance-sampling correction); use loss.impl trl or naive",
        ),
        Refusal(
            "chunked",
            "grpo.loss_type",
            lambda s: s.loss_type not in CHUNKED_LOSS_TYPES,
            f"loss.impl chunked supports {', '.join(CHUNKED_LOSS_TYPES)}; {OTHERS}",
        ),
        Refusal("chunked", "top_entropy_quantile", lambda s: s.top_entropy_quantile < 1.0, f"not in chunked; {OTHERS}"),
        Refusal(
            "chunked",
            "off_policy_mask_threshold",
            lambda s: s.off_policy_mask_threshold is not None,
            f"not in chunked; {OTHERS}",
        ),
        Refusal("chunked", "entropy_coef", lambda s: s.entropy_bonus, f"not in chunked; {OTHERS}"),
        Refusal("chunked", "delta", lambda s: s.delta is not None, f"not in chunked; {OTHERS}"),
        Refusal(
            "chunked",
            "use_bias_correction_kl",
            lambda s: s.bias_correction_kl and s.beta != 0.0,
            f"not in chunked; {OTHERS}",
        ),
        Refusal("chunked", "router aux loss", lambda s: s.aux_loss, f"not in chunked; {OTHERS}"),
    )

    def prepare_model(self, model: Any) -> None:
        add_hidden_states_forward(model)

    def score(self, trainer, model, input_ids, attention_mask, logits_to_keep, targets, compute_entropy):
        import torch

        from grpo_kernels import selective_logprobs

        hidden = hidden_states(model, input_ids, attention_mask, logits_to_keep, getattr(trainer, "packs", False))
        weight, bias = full_head_params(lm_head_of(trainer.accelerator.unwrap_model(model)))
        with torch.no_grad():
            out = selective_logprobs(
                hidden,
                weight,
                targets,
                # Padding after EOS costs nothing (its log-prob comes back 0; every consumer masks it).
                mask=attention_mask[:, -logits_to_keep:],
                bias=bias,
                temperature=trainer.temperature,
                return_entropy=compute_entropy,
                chunk_tokens=trainer.loss_spec.chunk_tokens,
            )
        return out if compute_entropy else (out, None)

    def loss(self, trainer, model, inputs):
        import torch

        from grpo_kernels import fused_linear_grpo_loss

        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = loss_mask(inputs)
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        accelerator = trainer.accelerator
        with accelerator.autocast():
            hidden = hidden_states(model, input_ids, attention_mask, logits_to_keep, getattr(trainer, "packs", False))
        weight, bias = full_head_params(lm_head_of(accelerator.unwrap_model(model)))

        mode = "train" if trainer.model.training else "eval"
        accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1
        num_items = None
        if trainer.loss_type == "dapo":  # TRL's normaliser, rescaled to one accumulation window of this process
            num_items = inputs["num_items_in_batch"].clamp(min=1.0) / accelerator.num_processes
            if mode == "train":
                num_items = num_items * accumulation / trainer.args.steps_per_generation
        advantages = inputs["advantages"]
        old_logps = inputs.get("old_per_token_logps")
        # Under mixed precision accelerate hands back fp32 outputs while the head stays in the model's
        # dtype: autocast makes the kernel see what the model's own lm_head would (the autocast dtype).
        with accelerator.autocast():
            loss, metrics = fused_linear_grpo_loss(
                hidden,
                weight,
                completion_ids,
                mask,
                advantages if advantages.dim() == 1 else advantages[:, 0],
                bias=bias,
                old_logps=old_logps,
                ref_logps=inputs.get("ref_per_token_logps") if trainer.beta else None,
                beta=trainer.beta,
                epsilon_low=trainer.epsilon_low,
                epsilon_high=trainer.epsilon_high,
                loss_type=trainer.loss_type,
                temperature=trainer.temperature,
                max_completion_length=trainer.max_completion_length,
                num_items_in_batch=num_items,
                importance_sampling_level=trainer.importance_sampling_level,
                chunk_tokens=trainer.loss_spec.chunk_tokens,
                lean=trainer.loss_spec.lean,
            )
        if trainer.loss_type != "dapo":
            loss = loss / accumulation
        log_metrics(trainer, mode, metrics, mask, advantages, old_logps)
        trainer.rollouts.note_decode_mismatch(inputs, metrics.logps)
        return loss


def log_metrics(trainer: Any, mode: str, metrics: Any, mask: Any, advantages: Any, old_logps: Any) -> None:
    """The metrics TRL's `_compute_loss` logs, from the kernel's per-process sums."""
    import torch
    from trl.trainer.utils import nanmax, nanmin

    accelerator, logged = trainer.accelerator, trainer._metrics[mode]
    reduce = functools.partial(accelerator.reduce, reduction="sum")
    count = metrics.token_count.float()
    sums = reduce(torch.stack([metrics.kl * count, metrics.entropy * count, count]))
    if trainer.beta != 0.0:
        logged["kl"].append((sums[0] / sums[2].clamp(min=1.0)).item())
    logged["entropy"].append((sums[1] / sums[2].clamp(min=1.0)).item())
    clip_count = metrics.clip_count.float()
    clips = reduce(
        torch.stack([metrics.clip_ratio_low, metrics.clip_ratio_high, metrics.clip_ratio_region]) * clip_count
    )
    total = reduce(clip_count).clamp(min=1.0)
    for name, value in zip(("low_mean", "high_mean", "region_mean"), clips / total):
        logged[f"clip_ratio/{name}"].append(value.item())
    # Per-sequence extremes need per-token ratios: cheap to rebuild from the kernel's [B, T] log-probs
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    log_ratio = metrics.logps - (metrics.logps if old_logps is None else old_logps)
    m = mask.to(log_ratio.dtype)
    if trainer.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    ratio = torch.exp(log_ratio)
    low = ((ratio < 1 - trainer.epsilon_low) & (adv < 0)).float()
    high = ((ratio > 1 + trainer.epsilon_high) & (adv > 0)).float()

    def seq_mean(x: Any) -> Any:
        return x.squeeze(1) if x.shape[1] == 1 else (x * m).sum(-1) / m.sum(-1)

    logged["clip_ratio/low_min"].append(nanmin(accelerator.gather(seq_mean(low))).item())
    logged["clip_ratio/high_max"].append(nanmax(accelerator.gather(seq_mean(high))).item())
