"""`model.compile_layers`: each decoder layer of the trained model (and of a separate reference model) compiled by
torch.compile for the training forwards, scoring's and the loss's.

At a small model's width the eager layer is many memory-bound passes: RMSNorm's fp32 round trips, the rotary
embedding's halves, SiLU times the up projection, each residual add, once in the forward, again in gradient
checkpointing's recompute, twice more in the backward. Compiled, they fuse into a few kernels around the GEMMs
and attention. The layer is what is compiled, not the model: one graph serves every layer (their parameters are
its inputs), the sequence length is a dynamic dimension (length groups and packing change it every step), and
gradient checkpointing wraps the compiled call as it wraps the eager one. The graph decoder's fused decode copy
has its own forward and is not affected.
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_tui.losses.base import peft_base


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's decoder layers: the modules of the classes transformers keeps whole when it splits a model
    across devices (`_no_split_modules`, e.g. Qwen3DecoderLayer); a PEFT model is asked for its base."""
    names = set(getattr(peft_base(model), "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def compile_layers(*models: Any) -> None:
    """Compile every decoder layer of `models` (None skipped) in place."""
    for model in models:
        for layer in decoder_layers(model) if model is not None else ():
            layer.compile(dynamic=True)
