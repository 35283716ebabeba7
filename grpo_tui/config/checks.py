"""Cross-field checks that run before anything launches.

Each finding is one line, `dotted.path: reason`. Errors stop a launch; notes are informational.
Static checks look only at the preset; environment checks (visible GPUs) look at this machine,
so `presets validate` can report them without failing on a laptop that will not run the preset.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_tui.config.data_check import data_file_problems, template_columns
from grpo_tui.config.eval_checks import eval_errors
from grpo_tui.config.hub_check import hub_model_problem
from grpo_tui.config.schema import GENERATION_BACKENDS, Preset
from grpo_tui.losses import LossSettings, refusals
from grpo_tui.tasks.data import BUILTIN_ADDITION, LOCAL_SUFFIXES, first_row, template_problem
from grpo_tui.tasks.reward_trial import reward_trial_problem, sample_prompt
from grpo_tui.tasks.rewards import REWARDS, RewardError, resolve_reward, signature_problem
from grpo_tui.tasks.shapes import QWEN3_SHAPES
from grpo_tui.tasks.tiny import BUILTIN_MODEL
from grpo_tui.tasks.workload import forced_lengths_from_env
from grpo_tui.userinput import ECHO_LIMIT, clip, shorten, user_path

# Models and tasks built in code (grpo_tui's training side); `builtin:<name>` must name one.
BUILTIN_MODELS: tuple[str, ...] = (BUILTIN_MODEL.removeprefix("builtin:"), *QWEN3_SHAPES)
BUILTIN_DATA: tuple[str, ...] = (BUILTIN_ADDITION.removeprefix("builtin:"),)
# owner/name as the hub spells it (a local file would have a known suffix or exist).
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class CheckResult:
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def check_preset(preset: Preset, environment: bool = True, visible_gpus: int | None = None) -> CheckResult:
    """All cross-field checks; with `environment`, also those that depend on this machine."""
    result = CheckResult()
    _check_batch(preset, result)
    _check_sub_batches(preset, result)
    _check_generation(preset, result)
    _check_loss(preset, result)
    _check_distributed(preset, result)
    _check_model(preset, result)
    # Read once: a parquet row costs a pyarrow import and a file open; the template and rewards both need it.
    row = first_row(preset.data.source)
    _check_data(preset, result, row)
    _check_rewards(preset, result, row)
    result.errors += eval_errors(preset, HUB_ID_RE)
    if environment:
        result.errors += environment_errors(preset, visible_gpus)
    return result


def environment_errors(preset: Preset, visible_gpus: int | None = None) -> list[str]:
    """The errors only this machine causes (too few GPUs, a hub model it cannot get, a bad forced-lengths variable):
    `check_preset`'s difference between `environment=True` and `False`, for a caller that shows both without running
    every check twice."""
    name = preset.model.name_or_path
    hub = hub_model_problem(name, not name.startswith("builtin:") and bool(HUB_ID_RE.match(name)))
    errors = [hub] if hub else []
    try:
        forced_lengths_from_env()
    except ValueError as exc:
        errors.append(str(exc))
    d = preset.distributed
    if d.use_cpu:
        return errors
    seen = visible_gpu_count() if visible_gpus is None else visible_gpus
    if d.num_processes > seen:
        errors.append(
            f"distributed.num_processes: got {d.num_processes}; {seen} GPU(s) visible on this machine "
            "(one process per GPU; or set distributed.use_cpu=true)"
        )
    return errors


def generation_batch(preset: Preset) -> int:
    """Completions generated per optimizer step across all processes."""
    g, d = preset.grpo, preset.distributed
    return g.per_device_batch_size * d.num_processes * d.num_machines * g.gradient_accumulation_steps


def _check_batch(preset: Preset, result: CheckResult) -> None:
    g, d = preset.grpo, preset.distributed
    total = generation_batch(preset)
    if total % g.num_generations:
        result.errors.append(
            f"grpo.num_generations: got {g.num_generations}; must divide the generation batch "
            f"per_device_batch_size {g.per_device_batch_size} x num_processes {d.num_processes} x "
            f"num_machines {d.num_machines} x gradient_accumulation_steps {g.gradient_accumulation_steps} = {total}"
        )


def _check_sub_batches(preset: Preset, result: CheckResult) -> None:
    g = preset.grpo
    rollout = g.per_device_batch_size * g.gradient_accumulation_steps  # TRL generates once per optimizer step
    if g.generation_sub_batch is not None and g.generation_sub_batch >= rollout:
        result.notes.append(
            f"grpo.generation_sub_batch: {g.generation_sub_batch} >= the {rollout} completions each device "
            f"generates per step (per_device_batch_size x gradient_accumulation_steps); it has no effect"
        )
    if g.scoring_sub_batch is not None and g.scoring_sub_batch >= g.per_device_batch_size:
        result.notes.append(
            f"grpo.scoring_sub_batch: {g.scoring_sub_batch} >= per_device_batch_size {g.per_device_batch_size}, "
            f"which scoring already uses; it has no effect"
        )
    if g.loss_sub_batch is not None and g.loss_sub_batch >= g.per_device_batch_size:
        result.notes.append(
            f"grpo.loss_sub_batch: {g.loss_sub_batch} >= per_device_batch_size {g.per_device_batch_size}, "
            f"which the loss already uses; it has no effect"
        )
    if g.activation_offload and preset.distributed.use_cpu:
        result.notes.append(
            "grpo.activation_offload: on the CPU the activations already live in host memory; no effect"
        )


def _check_generation(preset: Preset, result: CheckResult) -> None:
    backend, d = preset.grpo.generation_backend, preset.distributed
    if backend == "vllm":
        _check_vllm(preset, result)
    if backend != "graph":
        return
    # The trainer falls back to generate in these cases; saying so before launch saves a surprise in the log.
    if d.use_cpu:
        result.notes.append("grpo.generation_backend: graph needs CUDA; on the CPU the run uses generate")
    elif d.fsdp and d.fsdp_version == 1:
        result.notes.append(
            "grpo.generation_backend: graph with distributed.fsdp_version 1 falls back to generate (FSDP1 reshards "
            "the parameters the captured graph would read; FSDP2 decodes on a gathered copy)"
        )
    elif d.fsdp and preset.grpo.decode_copy == "off":
        result.notes.append(
            "grpo.generation_backend: graph with distributed.fsdp and grpo.decode_copy = off falls back to generate "
            "(the decode copy is how FSDP2 rollouts run on the graph)"
        )
    if preset.model.attn_implementation == "flash_attention_2":
        result.notes.append(
            "grpo.generation_backend: graph supports model.attn_implementation sdpa or eager; with "
            "flash_attention_2 the run uses generate"
        )


def _check_vllm(preset: Preset, result: CheckResult) -> None:
    import importlib.util

    if preset.distributed.use_cpu:
        result.errors.append("grpo.generation_backend: vllm needs a GPU; on the CPU use generate or auto")
    elif importlib.util.find_spec("vllm") is None:
        others = ", ".join(b for b in GENERATION_BACKENDS if b != "vllm")
        result.errors.append(
            "grpo.generation_backend: vllm needs the vllm package (pip install vllm), not installed here; "
            f"allowed without it: {others}"
        )


def _check_loss(preset: Preset, result: CheckResult) -> None:
    g, p = preset.grpo, preset.peft
    if g.loss_type == "dr_grpo" and g.max_completion_length is None:
        result.errors.append("grpo.max_completion_length: loss_type dr_grpo normalises by it; set a value")
    if p.enabled and g.beta > 0:
        result.notes.append(
            f"grpo.beta: {g.beta} with LoRA: the reference model is the base with adapters disabled (no second copy)"
        )
    if p.enabled and not p.target_modules:
        result.errors.append("peft.target_modules: empty with peft.enabled; name the modules LoRA adapts, e.g. q_proj")
    # The refusal table the trainer applies too, with what a preset states
    result.errors += [row.line() for row in refusals(preset.loss.impl, LossSettings.from_preset(preset))]


def _check_distributed(preset: Preset, result: CheckResult) -> None:
    d = preset.distributed
    if d.num_machines > 1 and not d.main_process_ip:
        result.errors.append(
            f"distributed.main_process_ip: num_machines {d.num_machines} needs the rank-0 machine's address"
        )
    if d.machine_rank >= d.num_machines:
        result.errors.append(
            f"distributed.machine_rank: got {d.machine_rank}; allowed 0..{d.num_machines - 1} (num_machines {d.num_machines})"
        )
    if d.fsdp and d.use_cpu:
        result.notes.append(
            "distributed.fsdp: on the CPU accelerate runs DDP, not FSDP (every process holds the whole model)"
        )
    if d.use_cpu and d.mixed_precision == "fp16":
        result.errors.append("distributed.mixed_precision: fp16 is not supported on the CPU; allowed: no, bf16")


def _check_model(preset: Preset, result: CheckResult) -> None:
    m = preset.model
    if m.sdpa_kernels and m.attn_implementation != "sdpa":
        result.errors.append(
            f"model.sdpa_kernels: applies to model.attn_implementation sdpa, got {m.attn_implementation}; "
            "set sdpa or leave sdpa_kernels empty"
        )
    if m.compile_layers and preset.distributed.fsdp:
        result.errors.append(
            "model.compile_layers: not with distributed.fsdp (FSDP's gathers around each layer are not compiled "
            "here); set one of them false"
        )
    name = m.name_or_path
    if name.startswith("builtin:"):
        if name.removeprefix("builtin:") not in BUILTIN_MODELS:
            known = ", ".join(f"builtin:{m}" for m in BUILTIN_MODELS)
            result.errors.append(f"model.name_or_path: got {shorten(name)}; built-in models: {known}")
        return
    if _looks_local(name) and not _exists(user_path(name)):
        result.errors.append(
            f"model.name_or_path: got {shorten(name)}; no such local folder (or give a hub id owner/name)"
        )


def _check_data(preset: Preset, result: CheckResult, row: Mapping[str, Any] | None) -> None:
    source = preset.data.source
    allowed = "builtin:addition, a hub id (openai/gsm8k), or a local .jsonl/.json/.parquet file"
    if source.startswith("builtin:"):
        if source.removeprefix("builtin:") not in BUILTIN_DATA:
            result.errors.append(f"data.source: got {shorten(source)}; allowed: {allowed}")
            return
    else:
        path = user_path(source)
        if path.suffix in LOCAL_SUFFIXES:  # what grpo_tui.tasks.data reads from a local file
            if not _exists(path, file=True):
                result.errors.append(f"data.source: got {shorten(source)}; no such file")
            else:
                result.errors += data_file_problems(path, preset.data.prompt_template)
        elif _exists(path):
            result.errors.append(
                f"data.source: got {shorten(source)}; a local file must end in .jsonl, .json or .parquet"
            )
        elif _looks_local(source) or not HUB_ID_RE.match(source):
            result.errors.append(f"data.source: got {shorten(source)}; allowed: {allowed}")
    # Tried on the first row where it is known, else for its form alone; the trainer checks again.
    problem = template_problem(preset.data.prompt_template, row, echo=shorten)
    if problem is None and not template_columns(preset.data.prompt_template):
        problem = "names no column of the data, so every prompt is the same; use {column}, e.g. {question}"
    if problem:
        result.errors.append(f"data.prompt_template: {problem}")


def _looks_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~"))


def _exists(path: Path, file: bool = False) -> bool:
    """Whether `path` exists (is a file); a path the system refuses to look at (EACCES, ELOOP) does not."""
    try:
        return path.is_file() if file else path.exists()
    except OSError:
        return False


def _check_rewards(preset: Preset, result: CheckResult, row: Mapping[str, Any] | None) -> None:
    columns = set(row) - {"prompt"} if row is not None else None  # TRL passes every column but the prompt
    for index, spec in enumerate(preset.rewards.functions):
        where = f"rewards.functions.{index}.name"
        if ":" not in spec.name and spec.name not in REWARDS:
            known = ", ".join(sorted(REWARDS))
            result.errors.append(f"{where}: got {shorten(spec.name)}; registered rewards: {known} (or module:function)")
            continue
        try:
            # Imports a module:function reward (its top-level code runs: see the README's Security section).
            func = resolve_reward(spec.name)
            problem = signature_problem(func, columns)
            if problem is None and spec.name not in REWARDS and row is not None:
                problem = reward_trial_problem(func, row, sample_prompt(preset.data.prompt_template, row))
        except RewardError as exc:
            problem = str(exc).removeprefix("rewards.functions.name: ")
        if problem:
            result.errors.append(f"{where}: got {shorten(spec.name)}; {clip(problem, 3 * ECHO_LIMIT)}")


def visible_gpu_count() -> int:
    """GPUs this process may use: NVML's count (torch's if NVML is absent), capped by CUDA_VISIBLE_DEVICES."""
    count = _nvml_count()
    if count is None:
        count = _torch_count()
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        entries = [e for e in mask.split(",") if e.strip()]
        count = min(count, len(entries))
    return count


def _nvml_count() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: NVML raises NVMLError subclasses or ImportError
        return None


def _torch_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
