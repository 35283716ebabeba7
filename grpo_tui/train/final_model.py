"""The final save: RUN/model/ in Hugging Face format, written once when training ends (finished or stopped).

Full fine-tuning saves the whole model (loadable with `AutoModelForCausalLM.from_pretrained`); LoRA saves
the adapter (`adapter_config.json` + weights, loadable with peft) and grpo-tui.json names its base. The
tokenizer is saved beside it either way. Sharded models (FSDP1, FSDP2) are gathered once into a full state
dict on rank 0 with accelerate's / torch's own helpers; every rank takes part in that gather, only rank 0
writes. A failed save raises `ModelSaveError` on every rank, so the run fails with that one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch

from grpo_tui.runs.failures import exception_line
from grpo_tui.runs.model_dir import KIND_FULL, KIND_LORA, folder_bytes, staged_folder, write_info


class ModelSaveError(RuntimeError):
    """The final model could not be written (one user-facing line)."""


class SavedModel(NamedTuple):
    path: Path
    bytes: int
    kind: str


def has_dtensors(model: torch.nn.Module) -> bool:
    """Whether `model`'s parameters are DTensor shards (FSDP2's `fully_shard`)."""
    return any(hasattr(param, "full_tensor") for param in model.parameters())


def full_state_dict(model: torch.nn.Module, accelerator: Any = None) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0, in CPU memory ({} on the other ranks when sharded).

    A collective under FSDP: every rank must call it. FSDP2 (also when sharded by hand, without an
    accelerator) goes through torch's `get_model_state_dict`; everything else through accelerate's
    `get_state_dict` (FSDP1's full-state-dict context, DDP unwrapped, a plain model as it is).
    """
    if has_dtensors(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    if accelerator is not None:
        return accelerator.get_state_dict(model)
    return model.state_dict()


def write_model(
    model: torch.nn.Module, state_dict: dict[str, torch.Tensor], tokenizer: Any, target: Path, info: dict[str, Any]
) -> SavedModel:
    """Write `model` (a transformers or peft model) with `state_dict` and `tokenizer` to `target`, whole or not at all."""
    from peft import PeftModel

    kind = KIND_LORA if isinstance(model, PeftModel) else KIND_FULL
    with staged_folder(target, replace=True) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        write_info(tmp, {**info, "kind": kind})
    return SavedModel(Path(target), folder_bytes(target), kind)


def save_final_model(trainer: Any, target: Path, info: dict[str, Any]) -> SavedModel | None:
    """Gather the trainer's model and write it to `target` on the main process (None on the others).

    Raises:
        ModelSaveError: on every rank, when the main process could not write the folder.
    """
    accelerator = trainer.accelerator
    state_dict = full_state_dict(trainer.model, accelerator)
    saved, error = None, None
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        # The base model's config records where the weights came from: an adapter needs it to load.
        adapter = getattr(model, "peft_config", {}).get("default")
        base = getattr(adapter, "base_model_name_or_path", None) or getattr(model, "name_or_path", None)
        try:
            saved = write_model(model, state_dict, trainer.processing_class, target, {**info, "base_path": base})
        except (OSError, RuntimeError, ValueError) as exc:
            error = f"saving the final model to {target} failed: {exception_line(exc)}"
    del state_dict
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error], from_process=0)[0]
    if error is not None:
        raise ModelSaveError(error)
    return saved
