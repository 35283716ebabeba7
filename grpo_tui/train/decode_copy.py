"""The decode copy: the policy's full weights, LoRA merged, as plain tensors for the graph decoder.

Under FSDP2 the trained parameters are shards (DTensors) that each forward gathers and frees again, so a
captured graph has no storage to read; with LoRA every adapted projection adds two thin matmuls per token.
The copy is a plain model of the same architecture. Once per rollout it is refreshed in place:
- each parameter is gathered whole (`full_tensor`, a collective every rank makes in the same order, once),
- each LoRA-adapted weight becomes W + scale * B @ A (in fp32, then the copy's dtype),
- the result is written into the copy's own tensors, which never move.
The trained parameters and adapters are only read. Every rank decodes its own prompts on its own copy.

`grpo.decode_copy`: `keep` holds the copy between rollouts (fastest: built once, refreshed in place); `free`
drops it after each rollout (the lowest peak outside generation, for one build per rollout); `off` decodes on
the live weights (LoRA unmerged), which FSDP cannot do (it falls back to generate).
"""

from __future__ import annotations

import copy as copying
import time
from collections.abc import Iterator
from typing import Any

import torch

from grpo_tui.losses.base import peft_base
from grpo_tui.train.decode_model import fuse_projections, fused_blockers

# peft's name parts of adapter weights (merged into the base weight, never copied themselves)
_ADAPTER_PART = ".lora_"
# peft wraps an adapted module's own layer under this name; the copy has the plain layer in its place
_BASE_LAYER = ".base_layer"


def _is_tuner_layer(module: torch.nn.Module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "active_adapters")


def merge_blockers(model: torch.nn.Module) -> list[str]:
    """Why this model's adapters cannot be merged into a plain copy (empty: they can)."""
    from peft.tuners.lora import Linear

    reasons = set()
    for name, module in peft_base(model).named_modules():
        if "modules_to_save" in name.split("."):
            reasons.add("peft modules_to_save")
        if not _is_tuner_layer(module):
            continue
        if not isinstance(module, Linear):
            reasons.add(f"peft adapter {type(module).__name__} (only LoRA on linear layers merges)")
        elif any(module.use_dora.get(a, False) for a in module.active_adapters):
            reasons.add("DoRA adapters")
        elif any(getattr(module, "lora_bias", {}).get(a, False) for a in module.active_adapters):
            reasons.add("LoRA bias")
    return sorted(reasons)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A whole tensor: an FSDP2 shard (DTensor) gathered, a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _delta(layer: Any) -> torch.Tensor | None:
    """scale * B @ A summed over the layer's active, unmerged adapters, fp32 [out, in]; None without one."""
    if getattr(layer, "disable_adapters", False):
        return None
    total = None
    merged = set(getattr(layer, "merged_adapters", ()))
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A or adapter in merged:
            continue
        a = _full(layer.lora_A[adapter].weight).float()  # [r, in]
        b = _full(layer.lora_B[adapter].weight).float()  # [out, r]
        delta = (b @ a) * layer.scaling[adapter]
        if layer.fan_in_fan_out:
            delta = delta.T
        total = delta if total is None else total + delta
    return total


def merged_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name in the plain model, whole tensor) for every parameter and buffer of `model`, LoRA merged.

    One parameter is gathered at a time, so the extra memory is the largest single tensor."""
    base = peft_base(model)
    tuners = {name: module for name, module in base.named_modules() if _is_tuner_layer(module)}
    for name, param in base.named_parameters():
        if _ADAPTER_PART in name:
            continue
        owner, _, leaf = name.rpartition(".")
        tensor = _full(param.detach())
        if owner.endswith(_BASE_LAYER) and leaf == "weight":
            delta = _delta(tuners[owner.removesuffix(_BASE_LAYER)])
            if delta is not None:
                tensor = tensor.float() + delta.to(tensor.device)
        yield name.replace(_BASE_LAYER + ".", "."), tensor
    for name, buffer in base.named_buffers():
        yield name.replace(_BASE_LAYER + ".", "."), buffer


class DecodeCopyError(RuntimeError):
    """The copy could not be built or filled (one line for the run's log)."""


def empty_plain_model(source: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A model of `source`'s architecture with uninitialised tensors on `device` (no random init: the
    refresh overwrites every tensor), tied weights tied again, in eval mode without gradients."""
    base = peft_base(source)
    config = copying.deepcopy(base.config)
    with torch.device("meta"):
        plain = type(base)(config)
    plain.to(dtype=dtype)
    plain.to_empty(device=device)  # a new tensor per parameter: ties are undone here
    plain.tie_weights()
    # Buffers (rotary frequencies) keep the trained model's dtype: `to(dtype)` cast them with the weights.
    for name, buffer in base.named_buffers():
        owner, _, leaf = name.replace(_BASE_LAYER + ".", ".").rpartition(".")
        module = plain.get_submodule(owner)
        own = dict(module.named_buffers(recurse=False)).get(leaf)
        if own is not None and own.dtype != buffer.dtype:
            setattr(module, leaf, torch.empty_like(buffer, device=device))
    plain.eval().requires_grad_(False)
    return plain


class DecodeCopy:
    """The decode copy of one trainer's policy (`mode`: keep or free, see the module docstring)."""

    def __init__(self, mode: str, dtype: torch.dtype | None = None) -> None:
        if mode not in ("keep", "free"):
            raise ValueError(f"grpo.decode_copy: got {mode!r}; allowed: keep, free (off builds no copy)")
        self.mode = mode
        self.dtype = dtype  # None: the trained parameters' own dtype
        self.model: torch.nn.Module | None = None
        self.builds = 0  # times the copy was allocated (once with keep; every rollout with free)
        self.seconds = 0.0  # wall time of every build and refresh so far (readers take differences)
        self.last_nbytes = 0  # the copy's size when it was last built (kept after a free)

    @staticmethod
    def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {**dict(model.named_parameters()), **dict(model.named_buffers())}

    @property
    def nbytes(self) -> int:
        """Bytes the copy holds now (0 when freed); tied tensors count once."""
        if self.model is None:
            return 0
        sizes = {t.data_ptr(): t.numel() * t.element_size() for t in self._tensors(self.model).values()}
        return sum(sizes.values())

    def build(self, trained: torch.nn.Module) -> torch.nn.Module:
        """Allocate the copy for `trained` (uninitialised until `refresh`)."""
        start = time.perf_counter()
        source = next(peft_base(trained).parameters())
        device = source.to_local().device if hasattr(source, "to_local") else source.device
        self.model = empty_plain_model(trained, device, self.dtype or source.dtype)
        if not fused_blockers(self.model):
            fuse_projections(self.model)  # the graph decoder then runs its own forward on it
        self.builds += 1
        self.last_nbytes = self.nbytes
        self.seconds += time.perf_counter() - start
        return self.model

    def refresh(self, trained: torch.nn.Module) -> torch.nn.Module:
        """Write `trained`'s current weights (adapters merged) into the copy, in place. Every rank must call it
        at the same point (the gathers are collectives)."""
        if self.model is None:
            raise DecodeCopyError("decode copy: refresh before build")
        start = time.perf_counter()
        with torch.no_grad():
            targets = self._tensors(self.model)
            filled = set()
            for name, tensor in merged_tensors(trained):
                target = targets.get(name)
                if target is None:
                    raise DecodeCopyError(f"decode copy: the trained model has {name}, the plain model does not")
                if target.shape != tensor.shape:
                    shapes = f"{tuple(tensor.shape)} vs {tuple(target.shape)}"
                    raise DecodeCopyError(f"decode copy: {name} has shape {shapes} in the plain model")
                target.copy_(tensor)
                filled.add(target.data_ptr())
            missing = [name for name, t in targets.items() if t.data_ptr() not in filled]
            if missing:
                raise DecodeCopyError(f"decode copy: nothing in the trained model for {', '.join(missing[:3])}")
        self.seconds += time.perf_counter() - start
        return self.model

    def after_rollout(self) -> None:
        """With `free`, drop the copy (the next rollout builds it again)."""
        if self.mode == "free":
            self.model = None
