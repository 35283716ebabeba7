"""The trainer's rollout backend: which `grpo.generation_backend` runs, why a requested one cannot, the hook
that puts the graph decoder (`generation.StaticDecoder`) in place of TRL's `_generate_single_turn`, the
decode copy it reads under FSDP2 and LoRA (`decode_copy`), and the completion lengths $GRPO_TUI_COMPLETION_LENGTHS
forces (`tasks.workload`; on the graph, generate and static backends)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from grpo_tui.config.schema import GENERATION_BACKENDS
from grpo_tui.losses.base import loss_mask, peft_base
from grpo_tui.runs.failures import labelled_failure
from grpo_tui.tasks.workload import ForcedLengths, forced_lengths_from_env
from grpo_tui.train.decode_copy import DecodeCopy, DecodeCopyError, merge_blockers
from grpo_tui.train.decode_model import fused_blockers
from grpo_tui.train.forced_lengths import ending_at
from grpo_tui.train.generation import Sampling, StaticDecoder
from grpo_tui.train.phase_memory import MIB


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


def is_fsdp2(trainer: Any) -> bool:
    return bool(trainer.is_fsdp_enabled and getattr(trainer.accelerator, "is_fsdp2", False))


def is_peft(model: Any) -> bool:
    return hasattr(model, "get_base_model")


def wants_copy(trainer: Any, mode: str) -> bool:
    """Whether the graph decodes on a decode copy: under FSDP2 (the only way it can), with LoRA (merged adapters
    decode as fast as the plain model) and wherever the fused forward covers the model (`decode_model`: four
    GEMMs a layer instead of seven), unless `grpo.decode_copy = off` or the adapters cannot merge."""
    model = trainer.model
    if mode == "off" or not (is_fsdp2(trainer) or is_peft(model) or not fused_blockers(peft_base(model))):
        return False
    return not merge_blockers(model)


def graph_blockers(trainer: Any, copy_mode: str = "keep") -> list[str]:
    """What in this trainer's setup would break a captured decode step."""
    config = trainer.model.config
    attn = getattr(config, "_attn_implementation", None)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    fsdp2 = is_fsdp2(trainer)
    unmergeable = merge_blockers(trainer.model) if fsdp2 and copy_mode != "off" else []
    refusals = {
        "FSDP1 reshards the parameters between forwards (FSDP2 decodes on a gathered copy)": (
            trainer.is_fsdp_enabled and not fsdp2
        ),
        "FSDP2 reshards the parameters between forwards and grpo.decode_copy is off": fsdp2 and copy_mode == "off",
        f"FSDP2's decode copy cannot merge {', '.join(unmergeable)}": bool(unmergeable),
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


def decode_dtype(trainer: Any) -> torch.dtype | None:
    """The copy's dtype: the mixed-precision compute dtype when one is set (what the training forward runs in),
    else None (the parameters' own)."""
    if trainer.args.bf16:
        return torch.bfloat16
    if trainer.args.fp16:
        return torch.float16
    return None


class RolloutStats(NamedTuple):
    """One process's rollout figures since the last `take_stats`, for the step record."""

    tokens: int  # completion tokens generated
    decode_copy_mib: float | None  # the decode copy's size at its last refresh (None: no copy)
    copy_refresh_s: float | None  # gathering, merging and writing it (its build included), summed
    copy_builds: int  # times it was allocated
    mismatch_sum: float  # sum of |log p_decode - log p_train| over the sampled tokens compared
    mismatch_count: int
    mismatch_max: float | None


class Rollouts:
    """The trainer's chosen backend; `single_turn` wraps TRL's `_generate_single_turn` when it is `graph`."""

    def __init__(
        self,
        trainer: Any,
        requested: str,
        on_event: Callable[..., None] | None = None,
        decode_copy: str = "keep",
        compact: bool = False,
    ) -> None:
        self.trainer = trainer
        # Lengths each rollout slice's rows end at (None: their own EOS or the cap); read here so that a bad
        # value stops the run before its first step
        self.forced: ForcedLengths | None = forced_lengths_from_env()
        self._draw_step, self._draws = -1, 0  # the step whose slices were drawn last, and how many
        blockers = graph_blockers(trainer, decode_copy)
        self.backend, reason = choose_backend(requested, trainer.accelerator.device.type, blockers)
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
        self.copy: DecodeCopy | None = None
        if self.backend == "graph":
            self.decoder = StaticDecoder(
                use_graph=True,
                compiled=True,
                on_compile_failure=self._compile_failed,
                on_compile_start=self._compiling,
                on_kernel_failure=self._kernel_failed,
                compact=compact,
            )
            if wants_copy(trainer, decode_copy):
                self.copy = DecodeCopy(decode_copy, decode_dtype(trainer))
        self._fresh = False  # the copy holds this rollout's weights
        self._clear_stats()

    def _clear_stats(self) -> None:
        self.tokens = 0  # completion tokens generated since the last `take_stats`
        self.decoded_positions = 0  # token positions the graph decoder computed since the last `take_positions`
        # The copy's cumulative seconds and builds when the figures were last taken
        self._copy_mark = (self.copy.seconds, self.copy.builds) if self.copy is not None else (0.0, 0)
        self._mismatch_sum, self._mismatch_count, self._mismatch_max = 0.0, 0, None

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

    def _copy_failed(self, reason: str) -> None:
        """No decode copy (out of memory, or a model it cannot mirror): generate for the rest of the run."""
        step = self.trainer.state.global_step + 1
        self.decoder, self.copy, self.backend = None, None, "generate"
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        line = f"graph decoding stopped: {reason}; using generate from here on"
        self._fell_back(line, requested="graph (decode copy)", used="generate", reason=reason, step=step)

    def end_rollout(self) -> None:
        """Free the decoder's bucket before scoring and the loss (the next rollout captures again), and with
        `grpo.decode_copy = free` the copy too; the next rollout refreshes the copy from the new weights."""
        self._fresh = False
        if self.copy is not None:
            self.copy.after_rollout()
        if self.decoder is not None and self.decoder.state is not None:
            self.decoder.release()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the graph's private pool goes back to the device only here

    def note_decode_mismatch(self, inputs: dict[str, Any], train_logps: torch.Tensor | None) -> None:
        """Add |log p_decode - log p_train| over a micro-batch's sampled tokens to the step's figures, where the
        decoder returned its log-probs. The training side is the rollout's own weights: the old log-probs where
        TRL computed them, else the loss forward's (TRL skips the old ones exactly when the policy has not moved
        since the rollout)."""
        decoded = inputs.get("sampling_per_token_logps")
        train = inputs.get("old_per_token_logps")
        train = train_logps if train is None else train
        if decoded is None or train is None or self.trainer.use_vllm:
            return
        delta = (train.detach().float() - decoded.float()).abs()[loss_mask(inputs).bool()]
        if delta.numel() == 0:
            return
        total, worst = torch.stack([delta.sum(), delta.max()]).tolist()  # one wait for the device
        self._mismatch_sum += total
        self._mismatch_count += delta.numel()
        self._mismatch_max = worst if self._mismatch_max is None else max(self._mismatch_max, worst)

    def take_positions(self) -> int:
        """Token positions the graph decoder computed since the last call (0 where it did not decode)."""
        positions, self.decoded_positions = self.decoded_positions, 0
        return positions

    def take_stats(self) -> RolloutStats:
        copy = self.copy
        built = copy is not None and copy.builds > 0
        seconds, builds = self._copy_mark
        stats = RolloutStats(
            tokens=self.tokens,
            decode_copy_mib=round(copy.last_nbytes / MIB, 2) if built else None,
            copy_refresh_s=round(copy.seconds - seconds, 4) if built else None,
            copy_builds=copy.builds - builds if copy is not None else 0,
            mismatch_sum=self._mismatch_sum,
            mismatch_count=self._mismatch_count,
            mismatch_max=self._mismatch_max,
        )
        self._clear_stats()
        return stats

    def forced_lengths(self, rows: int) -> list[int] | None:
        """The lengths the next slice of `rows` rows ends at (None when none are forced, or without a
        max_completion_length to draw them under): drawn from the step, this process's rank and the slice's
        number within the step, so a run with the same seed draws alike."""
        if self.forced is None or not self.trainer.max_completion_length:
            return None
        step = self.trainer.state.global_step
        if step != self._draw_step:
            self._draw_step, self._draws = step, 0
        rank = self.trainer.accelerator.process_index
        self._draws += 1
        return self.forced.draw(rows, self.trainer.max_completion_length, step, rank, self._draws - 1)

    def single_turn(self, default: Callable[..., Any]) -> Callable[..., Any]:
        """`default` itself, or a function with its signature that decodes text prompts with the graph (and falls
        back to `default` for good if the decode copy cannot be had), ending rows at the forced lengths if any.
        vLLM and continuous batching do not call `generate`: forced lengths leave them alone."""
        if self.decoder is None and self.forced is None:
            return default

        def fallback(lengths, *args):
            if lengths is None:
                return default(*args)
            model = self.trainer.accelerator.unwrap_model(self.trainer.model_wrapped)
            with ending_at(model, lengths, self.trainer.eos_token_ids[0]):
                return default(*args)

        def turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            lengths = self.forced_lengths(len(prompt_ids))
            args = (prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
            if self.decoder is None or images is not None or multimodal_fields:
                return fallback(lengths, *args)
            try:
                completions = self.generate(prompt_ids, lengths)
            except DecodeCopyUnavailable as exc:
                self._copy_failed(str(exc))
                return fallback(lengths, *args)
            self.decoded_positions += self.decoder.positions
            return completions.ids, completions.logprobs

        return turn

    def decode_model(self) -> Any:
        """The decode copy with this rollout's weights (refreshed on the rollout's first slice); every rank
        builds it or none does (the refresh's gathers are collectives)."""
        copy = self.copy
        if self._fresh:
            return copy.model
        if not copy.builds and is_fsdp2(self.trainer):
            self._first_forward()
        try:
            if copy.model is None:
                copy.build(self.trainer.model)
            failed = None
        except (torch.OutOfMemoryError, DecodeCopyError) as exc:
            copy.model, failed = None, labelled_failure("the decode copy could not be built", exc)
        if _any_rank(self.trainer.accelerator, failed is not None):
            raise DecodeCopyUnavailable(failed or "another rank could not build its decode copy")
        try:
            copy.refresh(self.trainer.model)
        except DecodeCopyError as exc:  # alike on every rank: the names and shapes are the model's
            copy.model = None
            raise DecodeCopyUnavailable(str(exc)) from exc
        self._fresh = True
        return copy.model

    def _first_forward(self) -> None:
        """One one-token forward of the FSDP2 model before its first rollout on the copy. FSDP2 sets itself up
        on the model's first forward, reading then which parameters train (the dtype its gradients are reduced
        to). With the rollout on the copy, TRL's first forward would be the reference log-probs under peft's
        `disable_adapter`, which turns the adapters' requires_grad off: FSDP would find nothing trainable and
        hand bf16 gradients to the fp32 adapters at the first backward."""
        t = self.trainer
        ids = torch.ones((1, 1), dtype=torch.long, device=t.accelerator.device)
        with torch.no_grad():
            t.model_wrapped(input_ids=ids)

    def generate(self, prompt_ids: list[list[int]], lengths: list[int] | None = None) -> Any:
        t = self.trainer
        model = self.decode_model() if self.copy is not None else None
        args = (t.max_completion_length, t.eos_token_ids, t._tokenizer.pad_token_id, Sampling.of_trainer(t), lengths)
        if model is not None:
            with torch.no_grad():
                return self.decoder.generate(model, prompt_ids, *args)
        from trl.models.utils import unwrap_model_for_generation

        with (
            unwrap_model_for_generation(
                t.model_wrapped,
                t.accelerator,
                gather_deepspeed3_params=t.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=t.args.gradient_checkpointing_kwargs,
            ) as model,
            torch.no_grad(),
        ):
            return self.decoder.generate(model, prompt_ids, *args)


class DecodeCopyUnavailable(RuntimeError):
    """The decode copy could not be had on some rank (the line says why)."""


def _any_rank(accelerator: Any, flag: bool) -> bool:
    """Whether `flag` holds on any process (one small all-reduce; the flag itself with one process)."""
    if accelerator.num_processes == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(value, reduction="sum").item() > 0)
