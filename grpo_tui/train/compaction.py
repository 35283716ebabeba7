"""Finished rows stop costing: the graph decoder moves the rows still decoding to the front of its bucket and
decodes only those, on a view of the first rows of every tensor of the bucket.

A decode step's cost grows with its rows: each reads its own KV cache, and at a few rows the GEMMs are cheaper
too. Rows end at their own EOS, often long before the longest, so once at most half the rows are active the
decoder continues on the first `rows_for(active)` rows. The view shares the bucket's storage (the KV cache is
[R, H, L, D] per layer, so its first rows are one contiguous block): nothing is allocated, and a graph captured
on a view stays valid for the rest of the rollout and for later rollouts in the bucket.

Only the fused forward's own cache compacts (transformers' StaticCache keeps its rows). Each row's tokens and
arithmetic do not depend on the other rows, so greedy completions are those of the uncompacted decoder.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from grpo_tui.train.decode_model import KvCache
from grpo_tui.train.decode_step import DecodeState

# The row tensors of a state, by field name ([R, ...] each); the KV cache's layers are moved alongside.
ROW_FIELDS = ("tokens", "positions", "key_valid", "out", "finished", "logps", "seen", "stop_after")
# The step's shared scalars and row tensors a warm-up changes before a capture: restored after it, so that a
# graph captured in the middle of a rollout leaves the rollout where it was.
WARM_UP_FIELDS = ("tokens", "positions", "cache_index", "finished", "step", "seen")


def can_compact(state: DecodeState) -> bool:
    return isinstance(state.cache, KvCache)


def head(state: DecodeState, rows: int) -> DecodeState:
    """The first `rows` rows of `state`: views of its tensors (same storage), its shared scalars as they are."""
    cache = KvCache([k[:rows] for k in state.cache.keys], [v[:rows] for v in state.cache.values])
    fields = {name: getattr(state, name)[:rows] for name in ROW_FIELDS if getattr(state, name) is not None}
    return replace(state, cache=cache, **fields)


def rows_are_dynamic(view: DecodeState) -> None:
    """Mark the row dimension of a compacted view's tensors dynamic for torch.compile: the halvings of a bucket
    (64, 32, 16, 8 of 128) then share one compiled step, where each row count would compile again (~25 s each on
    the H100). The bucket's own row count keeps its static step."""
    mark = torch._dynamo.maybe_mark_dynamic
    for name in ROW_FIELDS:
        if getattr(view, name) is not None:
            mark(getattr(view, name), 0)
    for tensor in (*view.cache.keys, *view.cache.values):
        mark(tensor, 0)


def move_rows(state: DecodeState, order: torch.Tensor) -> None:
    """Row i of `state` takes the contents of row order[i], for i < len(order) (KV cache up to the slots written)."""
    rows = order.numel()
    written = int(state.cache_index)
    for tensor in (*state.cache.keys, *state.cache.values):
        tensor[:rows, :, :written] = tensor.index_select(0, order)[:, :, :written]
    for name in ROW_FIELDS:
        tensor = getattr(state, name)
        if tensor is not None:
            tensor[:rows] = tensor.index_select(0, order)


def snapshot(state: DecodeState) -> dict[str, torch.Tensor]:
    return {name: getattr(state, name).clone() for name in WARM_UP_FIELDS if getattr(state, name) is not None}


def restore(state: DecodeState, saved: dict[str, torch.Tensor]) -> None:
    for name, tensor in saved.items():
        getattr(state, name).copy_(tensor)


class RowMap:
    """Which prompt each row of the decoder holds, and the completions of rows that left the active block."""

    def __init__(self, count: int, state: DecodeState) -> None:
        device, length = state.finished.device, state.length
        self.origin = torch.arange(state.rows, device=device)  # row -> prompt (-1: a filler row)
        self.origin[count:] = -1
        self.out = torch.full((count, length), state.pad_id, dtype=torch.long, device=device)
        self.logps = torch.zeros((count, length), dtype=torch.float32, device=device)

    def keep(self, state: DecodeState, rows: torch.Tensor) -> None:
        """Store the completions of `rows` (indices into state's rows) under their prompts."""
        origin = self.origin[rows]
        real = origin >= 0
        rows, origin = rows[real], origin[real]
        self.out[origin] = state.out.index_select(0, rows)
        self.logps[origin] = state.logps.index_select(0, rows)

    def compact(self, state: DecodeState, rows: int) -> torch.Tensor:
        """Move the unfinished rows of `state` to its front, filling up to `rows` with finished ones (which emit
        pad); the completions of every finished row are kept here first. Returns the order applied."""
        finished = state.finished
        done = finished.nonzero().flatten()
        self.keep(state, done)
        active = (~finished).nonzero().flatten()
        order = torch.cat([active, done])[:rows]
        move_rows(state, order)
        self.origin = self.origin[order]
        self.origin[active.numel() :] = -1
        return order
