"""GRPOTrainer with a switchable loss implementation, per-phase memory and the run folder's streams.

loss.impl:
    trl      TRL 1.16's own path, untouched (its fused LM head computes the log-probs).
    naive    full logits materialised: model(...).logits -> log_softmax -> gather (the pre-fused baseline).
    chunked  grpo_kernels: the backbone's last hidden states (no logits ever) and the lm_head weight go to
             `fused_linear_grpo_loss` for the training loss and to `selective_logprobs` for scoring.

The implementation can change between optimizer steps (`switch_loss_impl`); a record's `loss_impl` names its step's.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch
from trl import GRPOTrainer
from trl.trainer.utils import nanmax, nanmin

from grpo_tui.config.schema import LOSS_IMPLS
from grpo_tui.train.decode_attention import training_attention
from grpo_tui.train.decode_copy import peft_base
from grpo_tui.train.loss_phase import LossPhaseMixin, loss_mask, slice_bounds

_CHUNKED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")  # the others are refused with their GRPOConfig names


class LossImplError(ValueError):
    """A loss implementation that cannot run with this configuration (one user-facing line)."""


def add_hidden_states_forward(model: torch.nn.Module) -> None:
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


def lm_head_of(model: torch.nn.Module) -> torch.nn.Module:
    """The output projection of a (possibly PEFT-wrapped) causal LM; refuses a LoRA-adapted head."""
    head = peft_base(model).get_output_embeddings()
    if hasattr(head, "base_layer"):  # peft's BaseTunerLayer: the plain weight would silently ignore the adapter
        raise LossImplError(
            "loss.impl: chunked reads the plain lm_head weight, but peft.target_modules adapts lm_head; "
            "remove lm_head from peft.target_modules or use loss.impl = naive or trl"
        )
    return head


def full_head_params(head: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The lm_head weight and bias as whole tensors; under FSDP2 only the head is gathered.

    Inside the root FSDP unit the head is already unsharded after the forward (plain tensors, reduced by
    FSDP's own backward). When the head is an FSDP unit of its own, its weight is a sharded DTensor here:
    `full_tensor()` gathers it, and `grad_placements=Partial("avg")` makes the backward a reduce-scatter
    that averages the ranks' gradients onto the shards, as FSDP does. The default (Replicate) would keep
    each rank's own gradient, silently unreduced (measured on 2 CPU ranks).
    """
    return _full(head.weight), (None if head.bias is None else _full(head.bias))


def _full(param: torch.Tensor) -> torch.Tensor:
    if not hasattr(param, "full_tensor"):
        return param
    from torch.distributed.tensor import Partial

    return param.full_tensor(grad_placements=[Partial("avg")] * param.device_mesh.ndim)


def naive_logps_and_entropies(
    logits: torch.Tensor, ids: torch.Tensor, temperature: float, entropy: bool = True, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `ids` and (if `entropy`) entropies from materialised logits [B, T, V], in fp32.

    The entropy is a logged metric unless an entropy bonus trains on it (`entropy_grad`): outside
    autograd its [B, T, V] intermediates are freed at once instead of being kept for a backward that
    never comes, as TRL computes it.
    """
    logps_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    logps = logps_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return logps, None
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropies = -(logps_all.exp() * logps_all).sum(-1)
    return logps, entropies


class GrpoTuiTrainer(LossPhaseMixin, GRPOTrainer):
    """GRPOTrainer + loss.impl switch, per-phase memory, and a hook for each logged step record."""

    def __init__(
        self,
        *args: Any,
        loss_impl: str = "trl",
        chunk_tokens: int | None = None,
        lean: bool = False,
        generation_sub_batch: int | None = None,
        generation_backend: str = "auto",
        decode_copy: str = "keep",
        scoring_sub_batch: int | None = None,
        loss_sub_batch: int | None = None,
        activation_offload: bool = False,
        sdpa_kernels: tuple[str, ...] = (),
        profile_dir: str | None = None,
        on_step_logged: Callable[[GrpoTuiTrainer, dict[str, Any]], None] | None = None,
        on_event: Callable[..., None] | None = None,
        **kwargs: Any,
    ) -> None:
        from grpo_tui.train.phase_memory import PhaseMemory
        from grpo_tui.train.profiling import StepProfiler
        from grpo_tui.train.rollouts import Rollouts

        self.loss_impl = loss_impl
        self.impl_of_step = loss_impl  # the impl that computed the current step's loss
        self.chunk_tokens = chunk_tokens
        self.lean = lean
        self.generation_sub_batch = generation_sub_batch
        self.scoring_sub_batch = scoring_sub_batch
        self.loss_sub_batch, self.activation_offload = loss_sub_batch, activation_offload
        self.sdpa_kernels = sdpa_kernels  # model.sdpa_kernels: held for the whole step (`training_attention`)
        self.on_step_logged = on_step_logged
        self.last_train_logps: torch.Tensor | None = None  # the last loss forward's log-probs (decode mismatch)
        super().__init__(*args, **kwargs)
        # $GRPO_TUI_PROFILE_STEP profiles one step into the run folder (profile_dir); None: no profiling.
        cuda = self.accelerator.device.type == "cuda"
        profiler = StepProfiler.from_env(profile_dir, cuda) if profile_dir is not None else None
        self.phases = PhaseMemory(self.accelerator.device, profiler=profiler)
        add_hidden_states_forward(peft_base(self.model))
        if self.ref_model is not None:
            add_hidden_states_forward(self.ref_model)
        self.check_loss_impl(loss_impl)
        if (refusal := self.loss_phase_refusal()) is not None:
            raise LossImplError(refusal)
        self.rollouts = Rollouts(self, generation_backend, on_event, decode_copy)  # grpo.generation_backend

    # ---- the implementation switch -------------------------------------------------------------
    def check_loss_impl(self, impl: str) -> None:
        """Raise LossImplError when `impl` cannot run with this trainer's configuration."""
        if impl not in LOSS_IMPLS:
            raise LossImplError(f"loss.impl: got {impl!r}; allowed: {', '.join(LOSS_IMPLS)}")
        if impl != "chunked":
            return
        lm_head_of(self.model)
        refusals = {
            "grpo.loss_type": self.loss_type not in _CHUNKED_LOSS_TYPES,
            "top_entropy_quantile": self.top_entropy_quantile < 1.0,
            "off_policy_mask_threshold": self.off_policy_mask_threshold is not None,
            "use_vllm": self.use_vllm,
            "entropy_coef": self._entropy_bonus_enabled,
            "delta": self.args.delta is not None,
            "use_bias_correction_kl": self.args.use_bias_correction_kl and self.beta != 0.0,
            "router aux loss": self.aux_loss_enabled,
        }
        bad = [name for name, refused in refusals.items() if refused]
        if bad:
            raise LossImplError(
                f"loss.impl: chunked supports loss types {', '.join(_CHUNKED_LOSS_TYPES)} without "
                f"{', '.join(bad)}; use loss.impl = naive or trl"
            )

    def switch_loss_impl(self, impl: str) -> str:
        """Use `impl` from the next step on; frees cached allocator memory so the change shows."""
        self.check_loss_impl(impl)
        previous, self.loss_impl = self.loss_impl, impl
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return previous

    # ---- phases ----------------------------------------------------------------------------------
    def _generate(self, prompts: list) -> Any:
        with self.phases.track("generation"):
            return super()._generate(prompts)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completion_ids, logprobs = self._sliced_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )
        self.rollouts.tokens += sum(map(len, completion_ids))  # the step record's generation/tokens
        self.rollouts.end_rollout()
        return completion_ids, logprobs

    def _sliced_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images):
        # grpo.generation_sub_batch: generate the rollout a slice at a time, so the KV cache (the step's peak
        # for long completions) holds one slice. Each completion is sampled independently, so slicing keeps
        # the distribution; vLLM, continuous batching and multimodal inputs manage their own memory.
        size = self.generation_sub_batch
        turn = self.rollouts.single_turn(super()._generate_single_turn)
        if (
            size is None
            or len(prompt_ids) <= size
            or self.use_vllm
            or self.use_transformers_continuous_batching
            or multimodal_fields
        ):
            return turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        parts = [
            turn(
                prompt_ids[start:stop],
                None if images is None else images[start:stop],
                multimodal_fields,
                num_generations,
                has_tool_images,
            )
            for start, stop in slice_bounds(len(prompt_ids), size)
        ]
        completion_ids = [ids for part_ids, _ in parts for ids in part_ids]
        logprobs = None if any(lp is None for _, lp in parts) else [x for _, lp in parts for x in lp]
        return completion_ids, logprobs

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        with self.phases.track("scoring"):
            return super()._generate_and_score_completions(inputs)

    def training_step(self, model: torch.nn.Module, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        self.impl_of_step = self.loss_impl
        with self.phases.track("loss"), training_attention(self.sdpa_kernels):
            return super().training_step(model, inputs, num_items_in_batch)

    # ---- log-probs -------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        if self.scoring_sub_batch is not None and not torch.is_grad_enabled():
            # Scoring (old/reference log-probs) runs without autograd: smaller forwards lower its peak. The loss
            # forward keeps its graph for backward, where slicing would not lower the peak; it is left alone.
            batch_size = min(batch_size or input_ids.size(0), self.scoring_sub_batch)
        if self.loss_impl == "trl" or compute_aux_loss or any(v is not None for v in multimodal.values()):
            out = super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )
            self.last_train_logps = out[0] if torch.is_grad_enabled() else None  # the loss forward's, for the mismatch
            return out
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids = input_ids[start : start + batch_size]
            mask = attention_mask[start : start + batch_size]
            targets = ids[:, -logits_to_keep:]
            with self.accelerator.autocast():
                if self.loss_impl == "naive":
                    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1).logits
                    logps, entropies = naive_logps_and_entropies(
                        logits[:, :-1], targets, self.temperature, compute_entropy, self._entropy_bonus_enabled
                    )
                else:
                    logps, entropies = self._chunked_logps(model, ids, mask, logits_to_keep, targets, compute_entropy)
            all_logps.append(logps)
            all_entropies.append(entropies)
        entropies = torch.cat(all_entropies) if compute_entropy else None
        logps = torch.cat(all_logps)
        self.last_train_logps = logps if torch.is_grad_enabled() else None
        return logps, entropies, None

    def _hidden_states(self, model, input_ids, attention_mask, logits_to_keep: int) -> torch.Tensor:
        hidden = model(input_ids=input_ids, attention_mask=attention_mask, return_last_hidden=True)
        return hidden[:, -logits_to_keep - 1 : -1]  # [B, T, H]: the positions that predict the completion

    def _chunked_logps(self, model, input_ids, attention_mask, logits_to_keep, targets, entropy: bool = True):
        from grpo_kernels import selective_logprobs

        hidden = self._hidden_states(model, input_ids, attention_mask, logits_to_keep)
        weight, bias = full_head_params(lm_head_of(self.accelerator.unwrap_model(model)))
        with torch.no_grad():
            out = selective_logprobs(
                hidden,
                weight,
                targets,
                # Padding after EOS costs nothing (its log-prob comes back 0; every consumer masks it).
                mask=attention_mask[:, -logits_to_keep:],
                bias=bias,
                temperature=self.temperature,
                return_entropy=entropy,
                chunk_tokens=self.chunk_tokens,
            )
        return out if entropy else (out, None)

    # ---- the loss --------------------------------------------------------------------------------
    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        if self.loss_impl != "chunked":
            loss = super()._compute_loss(model, inputs)
            self.rollouts.note_decode_mismatch(inputs, self.last_train_logps)
            return loss
        from grpo_kernels import fused_linear_grpo_loss

        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        mask = loss_mask(inputs)
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        with self.accelerator.autocast():
            hidden = self._hidden_states(model, input_ids, attention_mask, logits_to_keep)
        weight, bias = full_head_params(lm_head_of(self.accelerator.unwrap_model(model)))

        mode = "train" if self.model.training else "eval"
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
        num_items = None
        if self.loss_type == "dapo":  # TRL's normaliser, rescaled to one accumulation window of this process
            num_items = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                num_items = num_items * accumulation / self.args.steps_per_generation
        advantages = inputs["advantages"]
        old_logps = inputs.get("old_per_token_logps")
        # Under mixed precision accelerate hands back fp32 outputs while the head stays in the model's
        # dtype: autocast makes the kernel see what the model's own lm_head would (the autocast dtype).
        with self.accelerator.autocast():
            loss, metrics = fused_linear_grpo_loss(
                hidden,
                weight,
                completion_ids,
                mask,
                advantages if advantages.dim() == 1 else advantages[:, 0],
                bias=bias,
                old_logps=old_logps,
                ref_logps=inputs.get("ref_per_token_logps") if self.beta else None,
                beta=self.beta,
                epsilon_low=self.epsilon_low,
                epsilon_high=self.epsilon_high,
                loss_type=self.loss_type,
                temperature=self.temperature,
                max_completion_length=self.max_completion_length,
                num_items_in_batch=num_items,
                importance_sampling_level=self.importance_sampling_level,
                chunk_tokens=self.chunk_tokens,
                lean=self.lean,
            )
        if self.loss_type != "dapo":
            loss = loss / accumulation
        self._log_chunked_metrics(mode, metrics, mask, advantages, old_logps)
        self.rollouts.note_decode_mismatch(inputs, metrics.logps)
        return loss

    def _log_chunked_metrics(self, mode, metrics, mask, advantages, old_logps) -> None:
        """The metrics TRL's `_compute_loss` logs, from the kernel's per-process sums."""
        reduce = functools.partial(self.accelerator.reduce, reduction="sum")
        count = metrics.token_count.float()
        sums = reduce(torch.stack([metrics.kl * count, metrics.entropy * count, count]))
        if self.beta != 0.0:
            self._metrics[mode]["kl"].append((sums[0] / sums[2].clamp(min=1.0)).item())
        self._metrics[mode]["entropy"].append((sums[1] / sums[2].clamp(min=1.0)).item())
        clip_count = metrics.clip_count.float()
        clips = reduce(
            torch.stack([metrics.clip_ratio_low, metrics.clip_ratio_high, metrics.clip_ratio_region]) * clip_count
        )
        total = reduce(clip_count).clamp(min=1.0)
        for name, value in zip(("low_mean", "high_mean", "region_mean"), clips / total):
            self._metrics[mode][f"clip_ratio/{name}"].append(value.item())
        # Per-sequence extremes need per-token ratios: cheap to rebuild from the kernel's [B, T] log-probs
        adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        log_ratio = metrics.logps - (metrics.logps if old_logps is None else old_logps)
        m = mask.to(log_ratio.dtype)
        if self.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        ratio = torch.exp(log_ratio)
        low = ((ratio < 1 - self.epsilon_low) & (adv < 0)).float()
        high = ((ratio > 1 + self.epsilon_high) & (adv > 0)).float()

        def seq_mean(x: torch.Tensor) -> torch.Tensor:
            return x.squeeze(1) if x.shape[1] == 1 else (x * m).sum(-1) / m.sum(-1)

        self._metrics[mode]["clip_ratio/low_min"].append(nanmin(self.accelerator.gather(seq_mean(low))).item())
        self._metrics[mode]["clip_ratio/high_max"].append(nanmax(self.accelerator.gather(seq_mean(high))).item())

    # ---- records ---------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        is_step = self.model.training and "train_runtime" not in logs and "loss" in logs
        super().log(logs, start_time)
        if is_step and self.on_step_logged is not None:
            self.on_step_logged(self, logs)
