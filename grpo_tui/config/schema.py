"""Preset schema: one typed, validated description of a GRPO run.

A preset is a TOML file with the sections below. Every field has a default, so a preset only
states what differs. Validation errors are turned into one line each by `format_errors`:
the dotted path of the field, the bad value, and what is allowed.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from grpo_tui.config import schema_walk
from grpo_tui.config.schema_walk import SchemaField
from grpo_tui.config.types import (
    MAX_BATCH,
    MAX_BETA,
    MAX_LORA_ALPHA,
    MAX_LORA_RANK,
    MAX_PROCESSES,
    MAX_REWARD_WEIGHT,
    MAX_ROWS,
    MAX_TEMPERATURE,
    NOT_BOOL,
    SEED_LIMIT,
    Count,
    Float,
    Int,
    Line,
    NonNegFloat,
    PathText,
    PositiveInt,
    Prose,
    Steps,
    Tokens,
)
from grpo_tui.losses import IMPLEMENTATIONS
from grpo_tui.userinput import ECHO_LIMIT, clip, shorten

# Names a user may give a preset: they become part of a run folder's name.
PRESET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def name_from_stem(stem: str) -> str:
    """A valid preset name for a file named `stem` (spaces and other symbols become '-')."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).lstrip("._-")[:64]
    return name or "unnamed"


LossImpl = Literal[tuple(IMPLEMENTATIONS)]  # the registry's names; the CLI and control reader read LOSS_IMPLS
LOSS_IMPLS: tuple[str, ...] = typing.get_args(LossImpl)
GenerationBackend = Literal["auto", "generate", "static", "graph", "vllm"]
GENERATION_BACKENDS: tuple[str, ...] = typing.get_args(GenerationBackend)
DecodeCopyMode = Literal["keep", "free", "off"]
FinishedRows = Literal["keep", "compact"]
DECODE_COPY_MODES: tuple[str, ...] = typing.get_args(DecodeCopyMode)


class _Section(BaseModel):
    # Unknown keys are errors (a typo must not silently fall back to a default); assignment is validated so
    # `--set` overrides go through the same checks. NaN and ±inf are refused everywhere: `temperature = inf` or a
    # `nan` weight would run to the end with reward 0 and loss 0. A field's docstring is its description.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, allow_inf_nan=False, use_attribute_docstrings=True
    )


class ModelSection(_Section):
    name_or_path: PathText = Field(
        "builtin:tiny-qwen3",
        description="Hub id (Qwen/Qwen3-0.6B), local folder, or builtin:tiny-qwen3 (built offline)",
    )
    config_only: bool = Field(
        False, description="Build the architecture from the id's config with random weights (no weight download)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights' dtype: auto (the checkpoint's own) | float32 | bfloat16 | float16."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = "sdpa"
    """transformers' attention for the training forwards: eager | sdpa | flash_attention_2."""
    sdpa_kernels: Annotated[list[Literal["cudnn", "flash", "efficient", "math"]], Field(max_length=4)] = Field(
        default_factory=list,
        description="The sdpa kernels the run's attention may use, math always as the last resort (empty: "
        "torch's choice; without cudnn no kernel is planned again for each new sequence length)",
    )
    compile_layers: bool = Field(
        False,
        description="Compile each decoder layer with torch.compile for scoring and the loss: norms, rotary and "
        "activations fused around the GEMMs (one compile per run; not with distributed.fsdp)",
    )
    trust_remote_code: bool = False
    """Allow a hub model's own Python code (it then runs on this machine)."""

    @field_validator("name_or_path")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a hub id (owner/name), a local folder or builtin:tiny-qwen3, not only whitespace")
        return value


class DataSection(_Section):
    source: PathText = Field(
        "builtin:addition",
        description="openai/gsm8k (hub), a local .jsonl/.parquet path, or builtin:addition (synthetic)",
    )
    split: Annotated[Line, Field(min_length=1)] = "train"
    """The dataset split to train on."""
    prompt_template: Prose = Field("{question}", description="Python format string over the row's columns")
    system_prompt: Prose | None = None
    """A system message before each prompt, for chat templates (default: none)."""
    max_samples: Annotated[PositiveInt, Field(le=MAX_ROWS)] | None = None
    """Train on at most this many rows of the split (default: all)."""


class RewardSpec(_Section):
    name: Annotated[Line, Field(min_length=1)] = Field(
        description="A registered reward (grpo-tui rewards) or module:function"
    )
    weight: Annotated[Float, Field(ge=-MAX_REWARD_WEIGHT, le=MAX_REWARD_WEIGHT)] = 1.0


class RewardsSection(_Section):
    # 64: more reward functions than any recipe uses; each one is called on every completion.
    functions: Annotated[list[RewardSpec], Field(max_length=64)] = Field(
        default_factory=lambda: [RewardSpec(name="addition_partial")]
    )
    """The reward functions and their weights: a completion's reward is the weighted sum."""

    @field_validator("functions")
    @classmethod
    def _not_empty(cls, value: list[RewardSpec]) -> list[RewardSpec]:
        if not value:
            raise ValueError("at least one reward function is needed")
        names = [spec.name for spec in value]
        twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if twice is not None:
            raise ValueError(f"{shorten(twice)} is listed twice; list it once (its weight scales it)")
        return value


class GrpoSection(_Section):
    num_generations: Annotated[Count, Field(ge=2)] = 8
    """Completions sampled per prompt: the group whose rewards GRPO compares."""
    per_device_batch_size: Count = 8
    """Completions per device in each forward/backward (TRL's per_device_train_batch_size)."""
    gradient_accumulation_steps: Count = 1
    """Forward/backward passes summed before each optimizer step."""
    max_prompt_length: Tokens = 512
    """Longest prompt, in tokens."""
    max_completion_length: Tokens | None = 256
    """Most new tokens per completion."""
    learning_rate: Annotated[Float, Field(gt=0.0, le=1.0)] = 1e-6
    """The optimizer's learning rate."""
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    """How the learning rate changes over max_steps."""
    warmup_steps: Steps = 0
    """Steps of learning-rate warm-up (for the schedules that have one)."""
    beta: Annotated[NonNegFloat, Field(le=MAX_BETA)] = 0.0
    """Weight of the KL penalty against the reference model (0: no reference model is loaded)."""
    epsilon_low: Annotated[Float, Field(gt=0.0, lt=1.0)] = 0.2
    """The importance ratio is clipped below at 1 - epsilon_low."""
    epsilon_high: Annotated[Float, Field(gt=0.0)] = 0.2
    """The importance ratio is clipped above at 1 + epsilon_high."""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """How per-token losses are normalised: grpo | bnpo | dr_grpo | dapo (TRL's loss_type)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token, or one per sequence (GSPO)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantages divided by the reward std of the group, of the batch, or not at all."""
    temperature: Annotated[Float, Field(gt=0.0, le=MAX_TEMPERATURE)] = 1.0
    """Sampling temperature of the rollouts (the log-probs use it too)."""
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] = 1.0
    """Nucleus sampling: sample from the smallest set of tokens holding this probability."""
    max_steps: Annotated[Steps, Field(ge=1)] = 100
    """Optimizer steps the run trains for."""
    num_iterations: Annotated[PositiveInt, Field(le=1024)] = 1
    """Passes over each generation batch (> 1 reuses each rollout; recipes use 1-4, each pass costs a whole step)."""
    seed: Annotated[Int, Field(ge=0, lt=SEED_LIMIT)] = 42
    """Random seed of sampling, data order and initialisation."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward instead of keeping them (less memory, slower)."""
    max_grad_norm: Annotated[Float, Field(gt=0.0)] = 1.0
    """The gradient norm is clipped to this."""
    generation_sub_batch: Count | None = Field(
        None,
        description="Completions generated at a time per device (default: all at once). Bounds the KV cache, "
        "often the step's peak; generation gets slower",
    )
    generation_backend: GenerationBackend = Field(
        "auto",
        description="auto (graph on CUDA, else generate) | graph (ours: ~20x generate on an H200, docs/benchmarks.md) | generate | "
        "static | vllm (needs vllm)",
    )
    decode_copy: DecodeCopyMode = Field(
        "keep",
        description="The graph decodes on a full copy of the weights (adapters merged; q/k/v and gate/up fused for "
        "Qwen3, Qwen2, Llama; always under FSDP2): keep (fastest) | free (dropped after each rollout: lower peak, "
        "rebuilt each time) | off (transformers' forward on the live weights; FSDP2 falls back to generate; LoRA "
        "decodes unmerged)",
    )
    finished_rows: FinishedRows = Field(
        "compact",
        description="The graph decoder's finished rows: compact (once at most half the rows decode, move them "
        "together and decode only those, on the bucket halved: 0.67x the step at real lengths, docs/benchmarks.md; "
        "one more compile per halving) | keep (decode padding until the last row ends)",
    )
    scoring_sub_batch: Count | None = Field(
        None,
        description="Sequences per scoring forward (default: per_device_batch_size); bounds scoring's peak at "
        "little cost",
    )
    loss_sub_batch: PositiveInt | None = Field(
        None,
        description="Sequences per loss forward+backward (default: all); lowers the loss peak, same gradients, slower",
    )
    activation_offload: bool = Field(
        False,
        description="Keep the loss forward's saved activations in host memory; lowers the loss peak, costs copy time",
    )
    padding_free: bool = Field(
        True,
        description="Scoring and the loss skip padding: rows grouped by length, each group cut after its longest "
        "completion and, with loss.impl chunked under sdpa, packed into one sequence of real tokens (same log-probs; "
        "false: TRL's padded batches)",
    )
    length_groups: Count | None = Field(
        None,
        description="Forwards a scoring batch and a loss micro-batch are split into under padding_free, rows sorted "
        "by completion length (more where a sub_batch bound asks; default: 1 packed, 4 padded). More: a lower "
        "activation peak and, padded, less padding; fewer: less of each forward's fixed cost (Python, launches)",
    )


class LossSection(_Section):
    impl: LossImpl = Field(
        "chunked", description=" | ".join(f"{name} ({impl.summary})" for name, impl in IMPLEMENTATIONS.items())
    )
    baseline: Literal["naive", "trl"] = Field("naive", description="What the live toggle switches to from chunked")
    chunk_tokens: Tokens | None = Field(None, description="Tokens per kernel chunk; default picks by vocab size")
    lean: bool = Field(False, description="Accumulate the lm_head gradient in the weight's dtype (less memory)")


class PeftSection(_Section):
    enabled: bool = False
    """Train LoRA adapters instead of all the weights."""
    r: Annotated[PositiveInt, Field(le=MAX_LORA_RANK)] = 16
    """LoRA rank."""
    alpha: Annotated[Float, Field(gt=0.0, le=MAX_LORA_ALPHA)] = 32.0
    """LoRA alpha: the adapters' update is scaled by alpha / r."""
    dropout: Annotated[Float, Field(ge=0.0, lt=1.0)] = 0.05
    """Dropout on the adapters' input."""
    # 1,024 names: more than a model has module kinds (an empty list with enabled = true is refused by the checks)
    target_modules: Annotated[list[Annotated[Line, Field(min_length=1)]], Field(max_length=1024)] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    """Names of the modules that get adapters (e.g. q_proj, v_proj)."""


class DistributedSection(_Section):
    use_cpu: bool = Field(False, description="Train on the CPU (gloo between processes)")
    num_processes: Annotated[PositiveInt, Field(le=MAX_PROCESSES)] = 1
    """Processes (one per GPU) on each machine."""
    fsdp: bool = False
    """Shard the model across processes with FSDP."""
    fsdp_version: Annotated[Literal[1, 2], NOT_BOOL] = 2
    """FSDP 1 or 2 (FSDP2 shards each parameter)."""
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    """accelerate's mixed precision: no | bf16 | fp16."""
    num_machines: Annotated[PositiveInt, Field(le=MAX_PROCESSES)] = 1
    """Machines in the run (more than 1: multi-node)."""
    machine_rank: Annotated[Int, Field(ge=0, lt=MAX_PROCESSES)] = 0
    """This machine's rank in a multi-node run (0: the main machine)."""
    main_process_ip: Annotated[Line, Field(min_length=1, max_length=253)] | None = None
    """Host name or address of the main machine in a multi-node run (253 characters at most: DNS's limit)."""
    main_process_port: Annotated[Int, Field(ge=1, le=65535)] = 29500
    """Port of the main machine's rendezvous."""


class LoggingSection(_Section):
    runs_dir: PathText = "runs"
    """The folder that holds one folder per run."""
    logging_steps: Annotated[Steps, Field(ge=1)] = 1
    """Metrics are recorded every this many steps."""
    save_steps: Steps = Field(0, description="Checkpoint every N steps; 0 = only on request")
    # 10,000: far more checkpoints than a disk holds; None keeps every one.
    save_total_limit: Annotated[PositiveInt, Field(le=10_000)] | None = Field(
        None, description="Checkpoints kept, the newest (older ones are deleted); empty: all"
    )
    report_to: Annotated[list[Literal["none", "tensorboard", "wandb", "trackio"]], Field(max_length=4)] = Field(
        default_factory=lambda: ["none"]
    )
    """Trackers to report to beside the run folder: none | tensorboard | wandb | trackio."""
    completions_per_step: Annotated[Int, Field(ge=0, le=MAX_BATCH)] = Field(
        16, description="Completions kept per step in completions.jsonl (0 = none)"
    )


class EvalSection(_Section):
    """Held-out evaluation: the base and the trained model scored on the same prompts (`grpo-tui eval`)."""

    source: PathText | None = Field(
        None,
        description="Held-out prompts, a source as data.source (empty: eval.prompts rows of data.source, drawn "
        "by eval.seed and left out of training)",
    )
    split: Annotated[Line, Field(min_length=1)] = Field("test", description="Split of eval.source (hub datasets)")
    prompts: Annotated[PositiveInt, Field(le=MAX_BATCH)] = Field(64, description="Held-out prompts scored")
    mode: Literal["greedy", "sampled"] = Field("greedy", description="greedy | sampled (grpo.temperature, top_p)")
    seed: Annotated[Int, Field(ge=0, lt=SEED_LIMIT)] = Field(0, description="Draws the held-out prompts")
    rewards: Annotated[list[Annotated[Line, Field(min_length=1)]], Field(max_length=64)] = Field(
        default_factory=list, description="Reward names scored (empty: the preset's rewards.functions)"
    )
    at_end: bool = Field(False, description="Score the base and the trained model when the run ends (eval.json)")
    batch_size: Count = Field(32, description="Prompts generated at a time")


class Preset(_Section):
    name: str = "unnamed"
    """The preset's name: its file name, and part of each of its runs' folder names."""
    description: Annotated[Prose, Field(max_length=2_000)] = ""
    """What the preset is for, shown on one line of `presets list` and the app's preset table."""
    model: ModelSection = Field(default_factory=ModelSection)
    """The policy model to train."""
    data: DataSection = Field(default_factory=DataSection)
    """The prompts to train on."""
    rewards: RewardsSection = Field(default_factory=RewardsSection)
    """How completions are scored."""
    grpo: GrpoSection = Field(default_factory=GrpoSection)
    """GRPO training settings (TRL's GRPOConfig) and the rollouts' memory options."""
    loss: LossSection = Field(default_factory=LossSection)
    """How the policy's log-probs and the GRPO loss are computed."""
    peft: PeftSection = Field(default_factory=PeftSection)
    """LoRA adapters (peft) instead of full fine-tuning."""
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    """Processes, machines and sharding (accelerate launch)."""
    logging: LoggingSection = Field(default_factory=LoggingSection)
    """Where runs go and what they record."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """Held-out evaluation of the base and the trained model."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not PRESET_NAME_RE.match(value):
            raise ValueError("letters, digits, '.', '_' or '-' (at most 64, not starting with a symbol)")
        return value


def format_errors(error: ValidationError, source: str = "") -> list[str]:
    """One line per problem: `source: dotted.path: got VALUE; allowed: ...`."""
    lines = []
    for item in error.errors():
        path = clip(".".join(str(part) for part in item["loc"])) or "(top level)"
        kind = item["type"]
        if kind == "extra_forbidden":
            detail = "unknown key; allowed keys: " + ", ".join(sorted(model_at(item["loc"][:-1]).model_fields))
        elif kind == "missing":
            detail = "missing required value"
        else:
            message = item["msg"].removeprefix("Value error, ")
            detail = f"got {shorten(item.get('input'))}; {clip(message, 4 * ECHO_LIMIT)}"
        lines.append(f"{clip(source) + ': ' if source else ''}{path}: {detail}")
    return lines


class PresetError(Exception):
    """A user-facing problem with a preset: `lines` holds one message per problem."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def validate_data(data: dict[str, Any], source: str) -> Preset:
    """Validate a parsed preset; errors become one line per problem prefixed by `source`."""
    try:
        return Preset.model_validate(data)
    except ValidationError as exc:
        raise PresetError(format_errors(exc, source)) from None


# ---- walking the schema: the one place that looks inside annotations ------------------------------


def model_at(loc: Sequence[str | int]) -> type[BaseModel]:
    """The preset's model whose fields sit at `loc` (see `schema_walk.model_at`)."""
    return schema_walk.model_at(Preset, loc)


def walk_fields(model: type[BaseModel] = Preset, prefix: str = "") -> Iterator[SchemaField]:
    """Every field of `model` (default: the preset) in declaration order, depth first (see `schema_walk`)."""
    return schema_walk.walk_fields(model, prefix)


# The preset's sections (tables of fields), in declaration order.
SECTIONS: tuple[str, ...] = tuple(f.path for f in walk_fields() if "." not in f.path and f.section is not None)
