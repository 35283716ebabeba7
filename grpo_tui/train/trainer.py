"""GRPOTrainer with a switchable loss implementation, per-phase memory and the run folder's streams.

How `loss.impl` scores and computes the loss is each implementation's own (`grpo_tui.losses`: trl, naive,
chunked); the trainer asks the registry and falls back to TRL's methods where an implementation leaves them.

The implementation can change between optimizer steps (`switch_loss_impl`); a record's `loss_impl` names its step's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from trl import GRPOTrainer

from grpo_tui.config.schema import LOSS_IMPLS
from grpo_tui.losses import IMPLEMENTATIONS, LossImplError, LossSettings, refusals
from grpo_tui.losses.base import peft_base
from grpo_tui.losses.packing import packing_refusal
from grpo_tui.train.decode_attention import training_attention
from grpo_tui.train.layer_compile import compile_layers
from grpo_tui.train.length_groups import TokenCounts, completion_lengths, computed_positions
from grpo_tui.train.loss_phase import LossPhaseMixin, slice_bounds
from grpo_tui.train.options import TrainerOptions


class GrpoTuiTrainer(LossPhaseMixin, GRPOTrainer):
    """GRPOTrainer + loss.impl switch, per-phase memory, and a hook for each logged step record."""

    def __init__(
        self,
        *args: Any,
        options: TrainerOptions | None = None,
        on_step_logged: Callable[[GrpoTuiTrainer, dict[str, Any]], None] | None = None,
        on_event: Callable[..., None] | None = None,
        **kwargs: Any,
    ) -> None:
        from grpo_tui.train.phase_memory import PhaseMemory
        from grpo_tui.train.profiling import StepProfiler
        from grpo_tui.train.rollouts import Rollouts

        options = options or TrainerOptions()
        self.loss_spec = options.loss
        self.loss_impl = options.loss.impl
        self.impl_of_step = self.loss_impl  # the impl that computed the current step's loss
        self.generation_sub_batch = options.generation_sub_batch
        self.scoring_sub_batch = options.scoring_sub_batch
        self.loss_sub_batch, self.activation_offload = options.loss_sub_batch, options.activation_offload
        self.sdpa_kernels = options.sdpa_kernels
        self.padding_free, self.groups_setting = options.padding_free, options.length_groups
        self.token_counts = TokenCounts()
        self.on_step_logged = on_step_logged
        self.last_train_logps: torch.Tensor | None = None  # the last loss forward's log-probs (decode mismatch)
        super().__init__(*args, **kwargs)
        cuda = self.accelerator.device.type == "cuda"
        profile_dir = options.profile_dir
        profiler = StepProfiler.from_env(profile_dir, cuda) if profile_dir is not None else None
        self.phases = PhaseMemory(self.accelerator.device, profiler=profiler)
        for impl in IMPLEMENTATIONS.values():  # every one: the implementation can change between steps
            impl.prepare_model(peft_base(self.model))
            if self.ref_model is not None:
                impl.prepare_model(self.ref_model)
        if options.compile_layers:
            compile_layers(self.model, self.ref_model)
        self.check_loss_impl(self.loss_impl)
        # grpo.padding_free packs the rows where the model allows it (else length groups alone; see `packs`)
        self.packing_refusal = packing_refusal(peft_base(self.model).config)
        if (refusal := self.loss_phase_refusal()) is not None:
            raise LossImplError(refusal)
        self.rollouts = Rollouts(
            self, options.generation_backend, on_event, options.decode_copy, compact=options.finished_rows == "compact"
        )

    # ---- the implementation switch -------------------------------------------------------------
    def check_loss_impl(self, impl: str) -> None:
        """Raise LossImplError when `impl` cannot run with this trainer's configuration (the refusal table)."""
        if impl not in LOSS_IMPLS:
            raise LossImplError(f"loss.impl: got {impl!r}; allowed: {', '.join(LOSS_IMPLS)}")
        head = peft_base(self.model).get_output_embeddings()
        settings = LossSettings(
            loss_type=self.loss_type,
            beta=self.beta,
            lm_head_adapted=hasattr(head, "base_layer"),  # peft's tuner layer
            use_vllm=self.use_vllm,
            top_entropy_quantile=self.top_entropy_quantile,
            off_policy_mask_threshold=self.off_policy_mask_threshold,
            entropy_bonus=self._entropy_bonus_enabled,
            delta=self.args.delta,
            bias_correction_kl=self.args.use_bias_correction_kl,
            aux_loss=self.aux_loss_enabled,
        )
        refused = refusals(impl, settings)
        if refused:
            raise LossImplError("; ".join(row.line() for row in refused))

    def switch_loss_impl(self, impl: str) -> str:
        """Use `impl` from the next step on; frees cached allocator memory so the change shows."""
        self.check_loss_impl(impl)
        previous, self.loss_impl = self.loss_impl, impl
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return previous

    @property
    def packs(self) -> bool:
        """Whether scoring and the loss run each length group packed (losses/packing.py): grpo.padding_free, our
        head (it takes the hidden states packing gives back) and a model packing can run."""
        return self.padding_free and self.loss_impl == "chunked" and self.packing_refusal is None

    # ---- phases ----------------------------------------------------------------------------------
    def _generate(self, prompts: list) -> Any:
        with self.phases.track("generation"):
            return super()._generate(prompts)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completion_ids, logprobs = self._sliced_turn(
            prompt_ids, images, multimodal_fields, num_generations, has_tool_images
        )
        self.rollouts.tokens += sum(map(len, completion_ids))  # the step record's generation/tokens
        valid = sum(map(len, prompt_ids)) + sum(map(len, completion_ids))
        computed = self.rollouts.take_positions()  # what the graph decoder counted, compaction included
        for start, stop in self._generation_slices(prompt_ids, multimodal_fields) if not computed else []:
            # generate computes every row of a slice until its slowest is done, prompts left-padded to the longest
            prompts, completions = prompt_ids[start:stop], completion_ids[start:stop]
            computed += (max(map(len, prompts)) + max(map(len, completions), default=0)) * len(prompts)
        self.token_counts.add("generation", valid, computed)
        self.rollouts.end_rollout()
        return completion_ids, logprobs

    def _generation_slices(self, prompt_ids, multimodal_fields) -> list[tuple[int, int]]:
        # grpo.generation_sub_batch: generate the rollout a slice at a time, so the KV cache (the step's peak
        # for long completions) holds one slice. Each completion is sampled independently, so slicing keeps
        # the distribution; vLLM, continuous batching and multimodal inputs manage their own memory.
        size = self.generation_sub_batch
        if self.use_vllm or self.use_transformers_continuous_batching or multimodal_fields:
            size = None
        return slice_bounds(len(prompt_ids), size) if prompt_ids else []

    def _sliced_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images):
        turn = self.rollouts.single_turn(super()._generate_single_turn)
        bounds = self._generation_slices(prompt_ids, multimodal_fields)
        if len(bounds) <= 1:
            return turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        parts = [
            turn(
                prompt_ids[start:stop],
                None if images is None else images[start:stop],
                multimodal_fields,
                num_generations,
                has_tool_images,
            )
            for start, stop in bounds
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
        scoring = not torch.is_grad_enabled()
        if self.scoring_sub_batch is not None and scoring:
            # Scoring (old/reference log-probs) runs without autograd: smaller forwards lower its peak. The loss
            # forward keeps its graph for backward, where slicing would not lower the peak; it is left alone.
            batch_size = min(batch_size or input_ids.size(0), self.scoring_sub_batch)
        if scoring and self.padding_free and not compute_aux_loss and all(v is None for v in multimodal.values()):
            return self._score_grouped(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy)
        if scoring:
            self.token_counts.add("scoring", attention_mask.sum().item(), attention_mask.numel())
        return self._score(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, multimodal
        )

    def _score_grouped(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy):
        """Scoring with rows grouped by completion length, each group cut after its longest completion
        (grpo.padding_free; `row_groups` picks the groups, none over `batch_size` rows); cut columns come back 0."""
        rows, prompt_width = input_ids.size(0), input_ids.size(1) - logits_to_keep
        lengths = completion_lengths(attention_mask[:, prompt_width:])
        groups = self.row_groups(lengths, batch_size or rows)
        logps = entropies = None
        for group in groups:
            index = torch.tensor(group.rows, device=input_ids.device)
            stop = prompt_width + group.width
            part = self._score(
                model,
                input_ids.index_select(0, index)[:, :stop],
                attention_mask.index_select(0, index)[:, :stop],
                group.width,
                len(group.rows),
                compute_entropy,
                False,
                {},
            )
            if logps is None:
                logps = part[0].new_zeros((rows, logits_to_keep))
                entropies = part[1].new_zeros((rows, logits_to_keep)) if compute_entropy else None
            logps[index, : group.width] = part[0]
            if compute_entropy:
                entropies[index, : group.width] = part[1]
        valid = attention_mask.sum().item()
        self.token_counts.add("scoring", valid, valid if self.packs else computed_positions(prompt_width, groups))
        return logps, entropies, None

    def _score(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size,
        compute_entropy,
        compute_aux_loss,
        multimodal,
    ):
        impl = IMPLEMENTATIONS[self.loss_impl]
        if impl.name == "trl" or compute_aux_loss or any(v is not None for v in multimodal.values()):
            args = (model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss)
            out = super()._get_per_token_logps_and_entropies(*args, **multimodal)
            self.last_train_logps = out[0] if torch.is_grad_enabled() else None  # the loss forward's, for the mismatch
            return out
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids = input_ids[start : start + batch_size]
            mask = attention_mask[start : start + batch_size]
            with self.accelerator.autocast():
                logps, entropies = impl.score(
                    self, model, ids, mask, logits_to_keep, ids[:, -logits_to_keep:], compute_entropy
                )
            all_logps.append(logps)
            all_entropies.append(entropies)
        entropies = torch.cat(all_entropies) if compute_entropy else None
        logps = torch.cat(all_logps)
        self.last_train_logps = logps if torch.is_grad_enabled() else None
        return logps, entropies, None

    # ---- the loss --------------------------------------------------------------------------------
    def _compute_loss(self, model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        loss = IMPLEMENTATIONS[self.loss_impl].loss(self, model, inputs)
        if loss is None:  # the implementation leaves the loss to TRL (over the log-probs it scored)
            loss = super()._compute_loss(model, inputs)
            self.rollouts.note_decode_mismatch(inputs, self.last_train_logps)
        return loss

    # ---- records ---------------------------------------------------------------------------------
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        is_step = self.model.training and "train_runtime" not in logs and "loss" in logs
        super().log(logs, start_time)
        if is_step and self.on_step_logged is not None:
            self.on_step_logged(self, logs)
