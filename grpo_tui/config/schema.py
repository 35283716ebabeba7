"""Preset schema: one typed, validated description of a GRPO run.

A preset is a TOML file with the sections below. Every field has a default, so a preset only
states what differs. Validation errors are turned into one line each by `format_errors`:
the dotted path of the field, the bad value, and what is allowed.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo

from grpo_tui.config.types import (
    ECHO_LIMIT,
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
    clip,
    shorten,
)

# Names a user may give a preset: they become part of a run folder's name.
PRESET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def name_from_stem(stem: str) -> str:
    """A valid preset name for a file named `stem` (spaces and other symbols become '-')."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).lstrip("._-")[:64]
    return name or "unnamed"


LossImpl = Literal["chunked", "naive", "trl"]
# Read from the type, so the CLI, the trainer and the control reader cannot drift from the schema.
LOSS_IMPLS: tuple[str, ...] = typing.get_args(LossImpl)
GenerationBackend = Literal["auto", "generate", "static", "graph", "vllm"]
GENERATION_BACKENDS: tuple[str, ...] = typing.get_args(GenerationBackend)
DecodeCopyMode = Literal["keep", "free", "off"]
DECODE_COPY_MODES: tuple[str, ...] = typing.get_args(DecodeCopyMode)


class _Section(BaseModel):
    # Unknown keys are errors (a typo must not silently fall back to a default); assignment is
    # validated so `--set` overrides go through the same checks.
    # NaN and ±inf are refused everywhere: `temperature = inf` or a `nan` weight would run to the end
    # with reward 0 and loss 0.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelSection(_Section):
    name_or_path: PathText = Field(
        "builtin:tiny-qwen3",
        description="Hub id (Qwen/Qwen3-0.6B), local folder, or builtin:tiny-qwen3 (built offline)",
    )
    config_only: bool = Field(
        False, description="Build the architecture from the id's config with random weights (no weight download)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = "sdpa"
    sdpa_kernels: Annotated[list[Literal["cudnn", "flash", "efficient", "math"]], Field(max_length=4)] = Field(
        default_factory=list,
        description="The sdpa kernels the run's attention may use, math always as the last resort (empty: "
        "torch's choice; without cudnn no kernel is planned again for each new sequence length)",
    )
    trust_remote_code: bool = False

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
    prompt_template: Prose = Field("{question}", description="Python format string over the row's columns")
    system_prompt: Prose | None = None
    max_samples: Annotated[PositiveInt, Field(le=MAX_ROWS)] | None = None


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
    per_device_batch_size: Count = 8
    gradient_accumulation_steps: Count = 1
    max_prompt_length: Tokens = 512
    max_completion_length: Tokens | None = 256
    learning_rate: Annotated[Float, Field(gt=0.0, le=1.0)] = 1e-6
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    warmup_steps: Steps = 0
    beta: Annotated[NonNegFloat, Field(le=MAX_BETA)] = 0.0
    epsilon_low: Annotated[Float, Field(gt=0.0, lt=1.0)] = 0.2
    epsilon_high: Annotated[Float, Field(gt=0.0)] = 0.2
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    importance_sampling_level: Literal["token", "sequence"] = "token"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    temperature: Annotated[Float, Field(gt=0.0, le=MAX_TEMPERATURE)] = 1.0
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] = 1.0
    max_steps: Annotated[Steps, Field(ge=1)] = 100
    # Passes over each generation batch; GRPO recipes use 1-4, and each pass costs a whole step.
    num_iterations: Annotated[PositiveInt, Field(le=1024)] = 1
    seed: Annotated[Int, Field(ge=0, lt=SEED_LIMIT)] = 42
    gradient_checkpointing: bool = False
    max_grad_norm: Annotated[Float, Field(gt=0.0)] = 1.0
    generation_sub_batch: Count | None = Field(
        None,
        description="Completions generated at a time per device (default: all at once). Bounds the KV cache, "
        "often the step's peak; generation gets slower",
    )
    generation_backend: GenerationBackend = Field(
        "auto",
        description="auto (graph on CUDA, else generate) | graph (ours: ~20x generate on an H200) | generate | "
        "static | vllm (needs vllm)",
    )
    decode_copy: DecodeCopyMode = Field(
        "keep",
        description="The graph decodes on a full copy of the weights (adapters merged; q/k/v and gate/up fused for "
        "Qwen3, Qwen2, Llama; always under FSDP2): keep (fastest) | free (dropped after each rollout: lower peak, "
        "rebuilt each time) | off (transformers' forward on the live weights; FSDP2 falls back to generate; LoRA "
        "decodes unmerged)",
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


class LossSection(_Section):
    impl: LossImpl = Field(
        "chunked", description="chunked (our Triton kernel) | naive (full logits) | trl (TRL's fused head)"
    )
    baseline: Literal["naive", "trl"] = Field("naive", description="What the live toggle switches to from chunked")
    chunk_tokens: Tokens | None = Field(None, description="Tokens per kernel chunk; default picks by vocab size")
    lean: bool = Field(False, description="Accumulate the lm_head gradient in the weight's dtype (less memory)")


class PeftSection(_Section):
    enabled: bool = False
    r: Annotated[PositiveInt, Field(le=MAX_LORA_RANK)] = 16
    alpha: Annotated[Float, Field(gt=0.0, le=MAX_LORA_ALPHA)] = 32.0
    dropout: Annotated[Float, Field(ge=0.0, lt=1.0)] = 0.05
    # Module names (an empty list with enabled = true is refused by the checks); 1,024 names is more
    # than a model has module kinds.
    target_modules: Annotated[list[Annotated[Line, Field(min_length=1)]], Field(max_length=1024)] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class DistributedSection(_Section):
    use_cpu: bool = Field(False, description="Train on the CPU (gloo between processes)")
    num_processes: Annotated[PositiveInt, Field(le=MAX_PROCESSES)] = 1
    fsdp: bool = False
    fsdp_version: Annotated[Literal[1, 2], NOT_BOOL] = 2
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    num_machines: Annotated[PositiveInt, Field(le=MAX_PROCESSES)] = 1
    machine_rank: Annotated[Int, Field(ge=0, lt=MAX_PROCESSES)] = 0
    # A host name or address: 253 characters is DNS's limit.
    main_process_ip: Annotated[Line, Field(min_length=1, max_length=253)] | None = None
    main_process_port: Annotated[Int, Field(ge=1, le=65535)] = 29500


class LoggingSection(_Section):
    runs_dir: PathText = "runs"
    logging_steps: Annotated[Steps, Field(ge=1)] = 1
    save_steps: Steps = Field(0, description="Checkpoint every N steps; 0 = only on request")
    report_to: Annotated[list[Literal["none", "tensorboard", "wandb", "trackio"]], Field(max_length=4)] = Field(
        default_factory=lambda: ["none"]
    )
    completions_per_step: Annotated[Int, Field(ge=0, le=MAX_BATCH)] = Field(
        16, description="Completions kept per step in completions.jsonl (0 = none)"
    )


class Preset(_Section):
    name: str = "unnamed"
    # One paragraph: it is shown on one line of `presets list` and the app's preset table.
    description: Annotated[Prose, Field(max_length=2_000)] = ""
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    rewards: RewardsSection = Field(default_factory=RewardsSection)
    grpo: GrpoSection = Field(default_factory=GrpoSection)
    loss: LossSection = Field(default_factory=LossSection)
    peft: PeftSection = Field(default_factory=PeftSection)
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    logging: LoggingSection = Field(default_factory=LoggingSection)

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


class SchemaField(NamedTuple):
    """One field met by `walk_fields`: its dotted path, pydantic's FieldInfo and its annotation."""

    path: str
    info: FieldInfo
    annotation: Any

    @property
    def section(self) -> type[BaseModel] | None:
        """The model this field holds, when it is a section (a table of fields) rather than a value."""
        return nested_model(self.annotation) if not _is_list(self.annotation) else None


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model inside `annotation` (`Section`, `list[Spec]`, `Spec | None`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = nested_model(arg)
        if found is not None:
            return found
    return None


def field_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model held by `model`'s field `name` (for a list of models, the items' model), else None."""
    field = model.model_fields.get(name)
    return nested_model(field.annotation) if field is not None else None


def model_at(loc: Sequence[str | int]) -> type[BaseModel]:
    """The model whose fields sit at `loc` (a pydantic error location; list indexes are skipped).

    Stops at the deepest model reached, so a location inside a plain value names its parent.
    """
    model: type[BaseModel] = Preset
    for part in loc:
        if isinstance(part, int):
            continue
        nested = field_model(model, str(part))
        if nested is None:
            break
        model = nested
    return model


def walk_fields(model: type[BaseModel] = Preset, prefix: str = "") -> Iterator[SchemaField]:
    """Every field of `model` in declaration order, depth first: a section, then its fields.

    Lists of models (`rewards.functions`) are one value, not walked into: their items have no names.
    """
    for name, info in model.model_fields.items():
        field = SchemaField(prefix + name, info, info.annotation)
        yield field
        if field.section is not None:
            yield from walk_fields(field.section, field.path + ".")


def literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The allowed values of a `Literal[...]` annotation (also inside `X | None`), else None."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return None


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list or any(
        typing.get_origin(a) is list for a in typing.get_args(annotation)
    )


# The preset's sections (tables of fields), in declaration order.
SECTIONS: tuple[str, ...] = tuple(f.path for f in walk_fields() if "." not in f.path and f.section is not None)
