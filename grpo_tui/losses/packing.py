"""Scoring and the loss over packed rows: the real tokens of a batch in one sequence, no padding computed.

Length groups (length_groups.py) cut each group after its longest completion, but every row still computes
its group's longest completion and the batch's longest prompt. Packed, the backbone runs once over the real
tokens of every row, laid end to end ([1, T]), each at the position it had in the padded layout (so the rotary
angles are the padded path's), and attention keeps each row to its own tokens: torch's variable-length flash
attention (`torch.nn.attention.varlen`) where it runs (CUDA, half precision), else a causal sdpa per row. The
hidden states go back to the padded [rows, completion, H] layout (zeros under padding, which every consumer
masks), so the heads and the loss see the padded path's inputs.

transformers reads the attention function by name at every forward, the recomputing forward of gradient
checkpointing included, which runs after the packed forward has returned. So the packing travels with the
forward's keyword arguments (transformers hands them to every attention call) and "sdpa" is replaced, once per
process, by a function that sends packed calls here and every other call to transformers' own sdpa.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

# The forward keyword that carries the packing to the attention calls.
PACKED_KEY = "grpo_tui_packed"


class Packing(NamedTuple):
    """Where each row's tokens sit in the packed sequence: rows r's are bounds[r]:bounds[r + 1]."""

    bounds: tuple[int, ...]
    cu_seqlens: torch.Tensor  # the bounds as int32 on the tokens' device (varlen attention's input)
    longest: int


def packing_refusal(config: Any) -> str | None:
    """Why rows of a model with this config cannot be packed (one line), or None."""
    attn = getattr(config, "_attn_implementation", None)
    if attn != "sdpa":
        return f"attn_implementation {attn} (packing runs under sdpa)"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"layer types {', '.join(sorted(layer_types))} (packing has full attention only)"
    return None


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Packing]:
    """The real tokens of `input_ids` ([rows, L], real where `attention_mask` is 1) as one [1, T] sequence, their
    positions in the padded layout, and the packing."""
    valid = attention_mask.bool()
    columns = torch.arange(valid.size(1), device=valid.device).expand_as(valid)
    lengths = valid.sum(dim=1).tolist()
    bounds = (0, *itertools.accumulate(lengths))
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32, device=input_ids.device)
    packing = Packing(bounds, cu_seqlens, max(lengths, default=0))
    return input_ids[valid].unsqueeze(0), columns[valid].unsqueeze(0), packing


def completion_hidden(packed: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """The packed forward's hidden states ([1, T, H]) at the positions that predict the completion, in the padded
    layout [rows, logits_to_keep, H]; zeros where the position is padding."""
    rows, width = attention_mask.shape
    valid = attention_mask.bool()
    at = (valid.flatten().cumsum(0) - 1).view(rows, width)[:, width - logits_to_keep - 1 : width - 1]
    keep = valid[:, width - logits_to_keep - 1 : width - 1]
    out = packed.new_zeros(rows, logits_to_keep, packed.size(-1))
    out[keep] = packed[0].index_select(0, at[keep])
    return out


def packed_hidden_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int):
    """`chunked.hidden_states` over packed rows: the same [rows, logits_to_keep, H], computed without padding."""
    install()
    ids, positions, packing = pack(input_ids, attention_mask)
    hidden = model(
        input_ids=ids,
        position_ids=positions,
        # A prepared mask per layer type: transformers builds none (over T packed tokens it would be [T, T]).
        attention_mask={"full_attention": None},
        return_last_hidden=True,
        **{PACKED_KEY: packing},
    )
    return completion_hidden(hidden, attention_mask, logits_to_keep)


# ---- attention -------------------------------------------------------------------------------------
_sdpa: Any = None  # transformers' own sdpa function, which every call that is not packed still goes to


def install() -> None:
    """Send packed attention calls of this process's models here (idempotent)."""
    global _sdpa
    if _sdpa is not None:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    _sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa_or_packed


def sdpa_or_packed(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract ([B, H, S, D] in, [B, S, H, D] out); packed calls ([1, H, T, D],
    `PACKED_KEY` in the keywords) attend within each row, causally."""
    packing = kwargs.pop(PACKED_KEY, None)
    if packing is None:
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, H, D]
    scale = query.size(-1) ** -0.5 if scaling is None else scaling
    out = varlen_attention(q, k, v, packing, scale)
    return out.unsqueeze(0), None


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, scale: float) -> torch.Tensor:
    """Causal attention of [T, H, D] queries over [T, H_kv, D] keys/values within each packed row: [T, H, D]."""
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and (flash := _flash()) is not None:
        return flash(q, k, v, packing, scale)
    parts = [
        F.scaled_dot_product_attention(
            *(t[start:stop].transpose(0, 1) for t in (q, k, v)), is_causal=True, scale=scale, enable_gqa=True
        ).transpose(0, 1)
        for start, stop in itertools.pairwise(packing.bounds)
        if stop > start
    ]
    return torch.cat(parts)


_FLASH: list[Any] = []  # [the flash call, or None where torch has no usable varlen attention], once looked up


def _flash() -> Any:
    if not _FLASH:
        _FLASH.append(_flash_call())
    return _FLASH[0]


def _flash_call() -> Any:
    """A call of torch.nn.attention.varlen.varlen_attn for the installed torch, or None. Its keywords changed
    between releases (is_causal, then window_size; scale and enable_gqa came later): it is read off the
    signature."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, packing: Packing, scale: float) -> torch.Tensor:
        options = dict(causal)
        if "scale" in params:
            options["scale"] = scale
        elif abs(scale - q.size(-1) ** -0.5) > 1e-12:  # its default scale only
            return varlen_attention(q.float(), k.float(), v.float(), packing, scale).to(q.dtype)
        if k.size(1) != q.size(1):
            if "enable_gqa" in params:
                options["enable_gqa"] = True
            else:
                k, v = (t.repeat_interleave(q.size(1) // t.size(1), dim=1) for t in (k, v))
        cu = packing.cu_seqlens
        return varlen_attn(q, k, v, cu, cu, packing.longest, packing.longest, **options)

    return call
