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

PositiveInt = Annotated[int, Field(ge=1)]
NonNegFloat = Annotated[float, Field(ge=0.0)]

# Names a user may give a preset: they become part of a run folder's name.
PRESET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

LossImpl = Literal["chunked", "naive", "trl"]
# Read from the type, so the CLI, the trainer and the control reader cannot drift from the schema.
LOSS_IMPLS: tuple[str, ...] = typing.get_args(LossImpl)
GenerationBackend = Literal["auto", "generate", "static", "graph"]
GENERATION_BACKENDS: tuple[str, ...] = typing.get_args(GenerationBackend)


class _Section(BaseModel):
    # Unknown keys are errors (a typo must not silently fall back to a default); assignment is
    # validated so `--set` overrides go through the same checks.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSection(_Section):
    name_or_path: str = Field(
        "builtin:tiny-qwen3",
        description="Hub id (Qwen/Qwen3-0.6B), local folder, or builtin:tiny-qwen3 (built offline)",
    )
    config_only: bool = Field(
        False, description="Build the architecture from the id's config with random weights (no weight download)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = "sdpa"
    trust_remote_code: bool = False


class DataSection(_Section):
    source: str = Field(
        "builtin:addition",
        description="openai/gsm8k (hub), a local .jsonl/.parquet path, or builtin:addition (synthetic)",
    )
    split: str = "train"
    prompt_template: str = Field("{question}", description="Python format string over the row's columns")
    system_prompt: str | None = None
    max_samples: PositiveInt | None = None


class RewardSpec(_Section):
    name: str = Field(description="A registered reward (grpo-tui rewards) or module:function")
    weight: float = 1.0


class RewardsSection(_Section):
    functions: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(name="addition_partial")])

    @field_validator("functions")
    @classmethod
    def _not_empty(cls, value: list[RewardSpec]) -> list[RewardSpec]:
        if not value:
            raise ValueError("at least one reward function is needed")
        return value


class GrpoSection(_Section):
    num_generations: Annotated[int, Field(ge=2)] = 8
    per_device_batch_size: PositiveInt = 8
    gradient_accumulation_steps: PositiveInt = 1
    max_prompt_length: PositiveInt = 512
    max_completion_length: PositiveInt | None = 256
    learning_rate: Annotated[float, Field(gt=0.0, le=1.0)] = 1e-6
    lr_scheduler_type: Literal["constant", "linear", "cosine", "constant_with_warmup"] = "constant"
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    beta: NonNegFloat = 0.0
    epsilon_low: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.2
    epsilon_high: Annotated[float, Field(gt=0.0)] = 0.2
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    importance_sampling_level: Literal["token", "sequence"] = "token"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    temperature: Annotated[float, Field(gt=0.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    max_steps: PositiveInt = 100
    num_iterations: PositiveInt = 1
    seed: int = 42
    gradient_checkpointing: bool = False
    max_grad_norm: Annotated[float, Field(gt=0.0)] = 1.0
    generation_sub_batch: PositiveInt | None = Field(
        None,
        description="Completions generated at a time per device (default: all at once). Bounds the KV cache, "
        "often the step's peak; generation gets slower",
    )
    generation_backend: GenerationBackend = Field(
        "auto",
        description="generate (TRL's model.generate) | static (transformers' static cache, compiled) | graph "
        "(static cache + CUDA-graph decode step) | auto (graph on CUDA where it can run, else generate)",
    )
    scoring_sub_batch: PositiveInt | None = Field(
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
    chunk_tokens: PositiveInt | None = Field(None, description="Tokens per kernel chunk; default picks by vocab size")
    lean: bool = Field(False, description="Accumulate the lm_head gradient in the weight's dtype (less memory)")


class PeftSection(_Section):
    enabled: bool = False
    r: PositiveInt = 16
    alpha: Annotated[float, Field(gt=0.0)] = 32.0
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.05
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class DistributedSection(_Section):
    use_cpu: bool = Field(False, description="Train on the CPU (gloo between processes)")
    num_processes: PositiveInt = 1
    fsdp: bool = False
    fsdp_version: Literal[1, 2] = 2
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    num_machines: PositiveInt = 1
    machine_rank: Annotated[int, Field(ge=0)] = 0
    main_process_ip: str | None = None
    main_process_port: Annotated[int, Field(ge=1, le=65535)] = 29500


class LoggingSection(_Section):
    runs_dir: str = "runs"
    logging_steps: PositiveInt = 1
    save_steps: Annotated[int, Field(ge=0)] = Field(0, description="Checkpoint every N steps; 0 = only on request")
    report_to: list[Literal["none", "tensorboard", "wandb", "trackio"]] = Field(default_factory=lambda: ["none"])
    completions_per_step: Annotated[int, Field(ge=0)] = Field(
        16, description="Completions kept per step in completions.jsonl (0 = none)"
    )


class Preset(_Section):
    name: str = "unnamed"
    description: str = ""
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
        path = ".".join(str(part) for part in item["loc"]) or "(top level)"
        kind = item["type"]
        if kind == "extra_forbidden":
            detail = "unknown key; allowed keys: " + ", ".join(sorted(model_at(item["loc"][:-1]).model_fields))
        elif kind == "missing":
            detail = "missing required value"
        else:
            message = item["msg"].removeprefix("Value error, ")
            detail = f"got {item.get('input')!r}; {message}"
        lines.append(f"{source + ': ' if source else ''}{path}: {detail}")
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
