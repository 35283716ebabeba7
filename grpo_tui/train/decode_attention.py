"""Attention for the static-cache decoder: grouped-query heads folded into the query length.

transformers' sdpa path repeats each key/value head for every query head of its group (`repeat_kv`)
whenever a mask is given, and the decoder always gives one (left padding, unwritten cache slots). At
decode time that copy dominates: on the H200 (Qwen3-0.6B shape, 128 rows, bf16; `benchmarks/generation_bench.py`)
the captured step ran at 5.5% of the memory-bandwidth bound, its time growing with the KV cache, not the weights.

Folding instead views the queries [R, H, q, D] as [R, H_kv, G*q, D] (head h = kv * G + g, the order
repeat_kv uses), so each key/value head is read once by the G queries of its group; the mask is repeated
over g, which is small. Same arithmetic per (query head, key) pair as the unfolded attention.

With the name "triton" in `attention_context` (the graph decoder's default where Triton is installed:
`DEFAULT_DECODE_ATTENTION`), a decode step (one query per row, a bool mask) goes to
`grpo_kernels.decode_attention` instead: a split-KV Triton kernel that reads only the cache slots the mask
allows (its torch twin off CUDA); prefill stays on sdpa, held to `PREFILL_ATTENTION`. On the H200
(Qwen3-0.6B shape, 300 of 512 slots filled) it takes 36.9 us per layer call at 128 rows against sdpa's
115.8 (cuDNN), 119.1 against 418.5 at 512 rows (`benchmarks/results/decode-attention-h200/`); rollouts of
128 x 256 run at 29,567 tokens/s against 21,934 with cuDNN's sdpa (`benchmarks/results/generation-h200/`).
A kernel without splits or tensor cores lost to sdpa.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.nn.functional as F

# The name the decoder's forwards run under (registered with transformers' AttentionInterface on import).
DECODE_ATTENTION = "grpo_tui_folded_gqa"
# The name that sends decode steps to grpo_kernels' kernel (beside torch's SDPBackend names)
TRITON_DECODE = "triton"
# sdpa's kernels for the decoder's prefill (and its decode steps where the kernel is off): not cuDNN, which
# builds a new plan for each new cache length, and every rollout in training brings one. On the H200 (128 x 256,
# each rollout a new length, `benchmarks/generation_bench.py --fresh`) 21,374 tokens/s with torch's choice
# (cuDNN; the first rollout at a new length 2.4 s against 1.2) and 27,068 held to these; 29,825 vs 29,321 at one
# length.
PREFILL_ATTENTION: tuple[str, ...] = ("efficient", "math")
# What the graph decoder runs on unless told otherwise: grpo_kernels' kernel for decode steps where Triton is
# installed, sdpa held to PREFILL_ATTENTION for the rest
DEFAULT_DECODE_ATTENTION: tuple[str, ...] = (
    (TRITON_DECODE, *PREFILL_ATTENTION) if importlib.util.find_spec("triton") else PREFILL_ATTENTION
)
# Whether `folded_attention` sends decode steps to grpo_kernels.decode_attention: set only inside
# `attention_context`; torch.compile reads it while tracing (and guards on it), a CUDA graph keeps the choice.
_decode_kernel_on = False


def folded_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: [R, H, q, D] queries, [R, H_kv, L, D] keys/values, a bool
    (True = attend) or additive mask [R, 1, q, L]; returns [R, q, H, D] and no weights."""
    rows, heads, length, dim = query.shape
    mask = attention_mask
    if (
        _decode_kernel_on
        and length == 1
        and mask is not None
        and mask.dtype == torch.bool
        and mask.shape[1:3] == (1, 1)
    ):
        from grpo_kernels.decode_attention import decode_attention, supports

        if supports(query, key, value, mask[:, 0, 0]):  # else (e.g. a head size of 80) sdpa below
            return decode_attention(query, key, value, mask[:, 0, 0], scaling), None
    kv_heads = key.shape[1]
    group = heads // kv_heads
    q = query.reshape(rows, kv_heads, group * length, dim)
    if mask is not None:
        if mask.shape[1] != 1:
            raise ValueError(f"folded attention takes a mask shared by the heads, got shape {tuple(mask.shape)}")
        keys = mask.shape[-1]
        mask = mask[:, :, None].expand(rows, 1, group, length, keys).reshape(rows, 1, group * length, keys)
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(rows, heads, length, dim).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(DECODE_ATTENTION, folded_attention)


@contextmanager
def folded_heads(model: Any) -> Iterator[None]:
    """Run the model's attention layers through `folded_attention` inside the block (the config is shared by
    every layer and read per forward; the decoder is never running while the model trains)."""
    _register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


def sdpa_backend_list(names: tuple[str, ...]) -> list[Any]:
    """torch's SDPBackend members for names like "efficient" or "cudnn" ("triton" is accepted and left out: it
    is no sdpa kernel, see `attention_context`); a one-line ValueError for others."""
    from torch.nn.attention import SDPBackend

    known = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    unknown = [name for name in names if name not in known and name != TRITON_DECODE]
    if unknown:
        raise ValueError(f"sdpa backend: got {', '.join(unknown)}; allowed: {', '.join([*known, TRITON_DECODE])}")
    return [getattr(SDPBackend, known[name]) for name in names if name != TRITON_DECODE]


def training_attention(names: tuple[str, ...]) -> AbstractContextManager[None]:
    """The block a training step runs in (`model.sdpa_kernels`): sdpa held to the named kernels and, as the last
    resort, math, so that no input is left without a kernel; none named: torch's choice."""
    if not names:
        return nullcontext()
    return _attention_choice(sdpa_backend_list(names if "math" in names else (*names, "math")), False)


def attention_context(names: tuple[str, ...]) -> AbstractContextManager[None]:
    """The block a decoder runs its steps in: sdpa held to the named kernels (none named: torch's choice) and,
    with "triton", decode steps on grpo_kernels.decode_attention. Checks the names now (a one-line ValueError)."""
    return _attention_choice(sdpa_backend_list(names), TRITON_DECODE in names)


@contextmanager
def _attention_choice(backends: list[Any], decode_kernel: bool) -> Iterator[None]:
    from torch.nn.attention import sdpa_kernel

    global _decode_kernel_on
    previous = _decode_kernel_on
    _decode_kernel_on = decode_kernel
    try:
        with sdpa_kernel(backends) if backends else nullcontext():
            yield
    finally:
        _decode_kernel_on = previous
