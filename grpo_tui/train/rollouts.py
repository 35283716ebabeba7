"""The trainer's rollout backend: which `grpo.generation_backend` runs, why a requested one cannot, and the hook
that puts the graph decoder (`generation.StaticDecoder`) in place of TRL's `_generate_single_turn`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from grpo_tui.config.schema import GENERATION_BACKENDS
from grpo_tui.train.generation import Sampling, StaticDecoder


def choose_backend(requested: str, device_type: str, blockers: list[str]) -> tuple[str, str | None]:
    """The backend to use, and why a requested `graph` cannot run (None when nothing was refused)."""
    if requested not in GENERATION_BACKENDS:
        raise ValueError(f"grpo.generation_backend: got {requested!r}; allowed: {', '.join(GENERATION_BACKENDS)}")
    if requested in ("generate", "static", "vllm"):  # vllm: TRL's own path (GRPOConfig.use_vllm)
        return requested, None
    if requested == "auto":  # the fastest that can run here; not a refusal, so no note
        return ("graph" if device_type == "cuda" and not blockers else "generate"), None
    if device_type != "cuda":  # the eager twin is for tests: on the CPU it is no faster than generate
        return "generate", f"needs a CUDA device, this run is on {device_type}"
    if blockers:
        return "generate", ", ".join(blockers)
    return "graph", None


def graph_blockers(trainer: Any) -> list[str]:
    """What in this trainer's setup would break a captured decode step."""
    config = trainer.model.config
    attn = getattr(config, "_attn_implementation", None)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    refusals = {
        "FSDP reshards the parameters between forwards": trainer.is_fsdp_enabled,
        "DeepSpeed gathers the parameters per forward": trainer.is_deepspeed_enabled,
        "use_vllm": trainer.use_vllm,  # (only set with generation_backend = vllm)
        "use_transformers_continuous_batching": trainer.use_transformers_continuous_batching,
        "a vision-language model": trainer._is_vlm,
        "an encoder-decoder model": config.is_encoder_decoder,
        f"attn_implementation {attn} (sdpa or eager only)": attn not in ("sdpa", "eager"),
        "sliding-window or non-full attention layers": layer_types != {"full_attention"},
        "no max_completion_length": trainer.max_completion_length is None,
    }
    return [reason for reason, refused in refusals.items() if refused]


class Rollouts:
    """The trainer's chosen backend; `single_turn` wraps TRL's `_generate_single_turn` when it is `graph`."""

    def __init__(self, trainer: Any, requested: str, on_event: Callable[..., None] | None = None) -> None:
        self.trainer = trainer
        self.backend, reason = choose_backend(requested, trainer.accelerator.device.type, graph_blockers(trainer))
        self._on_event = on_event
        if reason is not None:
            line = f"grpo.generation_backend {requested} cannot run ({reason}); using generate"
            self._fell_back(line, requested=requested, used=self.backend, reason=reason)
        if self.backend == "static":
            # TRL builds its GenerationConfig with disable_compile=True, which would leave the static cache uncompiled.
            trainer.generation_config.cache_implementation = "static"
            trainer.generation_config.disable_compile = False
            trainer.generation_kwargs["cache_implementation"] = "static"
        self.decoder = None
        if self.backend == "graph":
            self.decoder = StaticDecoder(
                use_graph=True,
                compiled=True,
                on_compile_failure=self._compile_failed,
                on_compile_start=self._compiling,
                on_kernel_failure=self._kernel_failed,
            )
        self.tokens = 0  # completion tokens generated since the last `take_tokens`

    def _say(self, line: str) -> None:
        """One line in the run's log, from the main process only."""
        if self.trainer.accelerator.is_main_process:
            print(f"grpo-tui: {line}", flush=True)

    def _compiling(self, rows: int, length: int) -> None:
        # The first rollout's half minute would otherwise look like a hang.
        self._say(
            f"graph decoder: compiling the token step for {rows} rows ({length} cache positions now; once per "
            "row count, any length; ~35 s on an H200 the first time, cached on disk for later runs)"
        )

    def _fell_back(self, line: str, **fields: Any) -> None:
        """A rollout path that could not run as asked: one line in the log and a `generation_fallback` event."""
        self._say(line)
        if self._on_event is not None:
            self._on_event("generation_fallback", **fields)

    def _compile_failed(self, reason: str) -> None:
        self._graph_fell_back("without torch.compile", "graph (compiled)", "graph", reason)

    def _kernel_failed(self, reason: str) -> None:
        self._graph_fell_back("with sdpa attention", "graph (decode kernel)", "graph (sdpa attention)", reason)

    def _graph_fell_back(self, how: str, requested: str, used: str, reason: str) -> None:
        # The graph decoder lost a speed-up during a rollout: the event names the step whose rollout it was
        # (the trainer counts finished steps)
        step = self.trainer.state.global_step + 1
        self._fell_back(f"graph decoding {how}: {reason}", requested=requested, used=used, reason=reason, step=step)

    def end_rollout(self) -> None:
        """Free the decoder's bucket before scoring and the loss (the next rollout captures again)."""
        if self.decoder is not None and self.decoder.state is not None:
            self.decoder.release()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the graph's private pool goes back to the device only here

    def take_tokens(self) -> int:
        tokens, self.tokens = self.tokens, 0
        return tokens

    def single_turn(self, default: Callable[..., Any]) -> Callable[..., Any]:
        """`default` itself, or a function with its signature that decodes text prompts with the graph."""
        if self.decoder is None:
            return default

        def turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            if images is not None or multimodal_fields:
                return default(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
            return self.generate(prompt_ids), None  # logprobs: None, as TRL's generate path returns

        return turn

    def generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        from trl.models.utils import unwrap_model_for_generation

        t = self.trainer
        with (
            unwrap_model_for_generation(
                t.model_wrapped,
                t.accelerator,
                gather_deepspeed3_params=t.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=t.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            return self.decoder.generate(
                model,
                prompt_ids,
                t.max_completion_length,
                t.eos_token_ids,
                t._tokenizer.pad_token_id,
                Sampling.of_trainer(t),
            )
