"""The graph decoder's token step: the static tensors a bucket decodes with, the prefill, and the step a CUDA
graph captures (the forward of each row's last token, the token's choice, its writing). `StaticDecoder`
(generation.py) runs them; the forward is transformers' (a StaticCache, a prepared mask) or, on a fused decode
copy, `decode_model.forward` with its own cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from grpo_tui.losses.packing import pack
from grpo_tui.train.decode_model import PLAIN_OPS, FusedModel, KvCache, compiled_ops
from grpo_tui.train.decode_model import forward as fused_forward
from grpo_tui.train.decode_model import prefill_packed as fused_prefill
from grpo_tui.train.sampling import Sampling, choose_tokens, token_logps

# Prompt tokens per prefill forward of transformers' forward (rows x columns), at least PREFILL_MIN_COLUMNS
# columns. The prefill's activations (~53 KiB a token on the H200, `benchmarks/generation_bench.py`) scale with it
# and come on top of the full static cache, where generate's prefill runs beside a prompt-sized one: one forward
# of 16 x 128 tokens put the graph's rollout peak above generate's. But each forward is ~1,700 eager kernel
# launches (~25 ms of host time): 1,024-token chunks at 128 rows (32 forwards) made a 128 x 256 rollout 0.7 s
# slower, 32-column chunks (8) 0.25 s. 64 columns (4 forwards for 256-token prompts) stay below the ~8 KiB a row
# and slot that generate's repeat_kv copies.
PREFILL_TOKENS = 1024
PREFILL_MIN_COLUMNS = 64
# Prompt tokens per forward of the fused copy's packed prefill (whole rows, at least one): its prompts carry no
# padding, so a forward of them costs what 128 rows x 64 columns of padded prompt cost above, or less. Where the
# bucket's cache is large, up to PREFILL_CACHE_SHARE of its slots go in one forward instead: each forward is
# ~1,000 eager launches and a few waits for the GPU, and a forward's activations (~28 KiB a token at Qwen3-0.6B's
# shape, freed layer by layer) stay well below the KV cache it fills (112 KiB a slot). At 128 x 256 with GSM8K
# prompts (~27k tokens) that is one forward instead of four, and the rollout's peak 8.3 GiB instead of 7.5.
PREFILL_PACK_TOKENS = 8192
PREFILL_CACHE_SHARE = 0.5


@dataclass
class DecodeState:
    """The static tensors one bucket's decode step reads and writes; their storage never moves."""

    cache: Any  # transformers StaticCache (max_cache_len = length), or the fused forward's KvCache
    tokens: torch.Tensor  # [R, 1] the token each row feeds next
    positions: torch.Tensor  # [R, 1] its rotary position
    cache_index: torch.Tensor  # [] the cache slot the step writes (the same for every row: prompts are left-padded)
    key_valid: torch.Tensor  # [R, L] False on prompt padding
    key_index: torch.Tensor  # [L] 0..L-1
    additive_mask: bool  # eager attention adds the mask; sdpa takes it as bool
    cache_argument: str  # the forward's keyword for the cache (see `cache_argument`)
    # The token choice, captured with the forward: what it samples with and where it writes.
    sampling: Sampling
    pad_id: int
    eos: torch.Tensor  # [E] the ids that end a row
    out: torch.Tensor  # [R, L] the tokens chosen so far (pad once a row finished)
    finished: torch.Tensor  # [R] rows past their EOS (and the bucket's filler rows)
    step: torch.Tensor  # [1] the column of `out` the next token goes to
    logps: torch.Tensor  # [R, L] fp32 log-prob of each chosen token under the decode weights (0 after a row ends)
    seen: torch.Tensor | None = None  # [R, V + 1] `seen_tokens` of prompt and output, for the repetition penalty
    stop_after: torch.Tensor | None = (
        None  # [R] forced lengths (tasks.workload): the row emits EOS as this token at the latest
    )
    fused: FusedModel | None = None  # the decode copy's fused view: decode with `decode_model.forward`
    seed: torch.Tensor | None = None  # [1] int64, drawn per rollout: grpo_kernels' token choice (`kernel_chooses`)

    @property
    def rows(self) -> int:
        return self.tokens.size(0)

    @property
    def length(self) -> int:
        return self.key_index.numel()


def _attention_mask(state: DecodeState, allowed: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    # A prepared mask mapping skips transformers' own mask building (host logic a graph cannot replay).
    if state.additive_mask:
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    return {"full_attention": allowed}


def cache_argument(model: Any) -> str:
    """The name the model's forward takes its KV cache under: `cache` from transformers ~5.2x on,
    `past_key_values` before (5.17 on the GPU image). An unknown name is swallowed by `**kwargs` and the
    model silently builds a fresh one-token cache each call, so this is read from the base model's signature.
    """
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT's forward is **kwargs
    names = inspect.signature(type(base).forward).parameters
    return "cache" if "cache" in names else "past_key_values"


def forward_columns(
    model: Any,
    state: DecodeState,
    ids: torch.Tensor,
    positions: torch.Tensor,
    allowed: torch.Tensor,
    slots: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Feed ids [R, c] at rotary positions [R, c] (their keys and values go to cache slots [c]; each query sees
    the slots allowed [R, c, L] allows); the logits [R, V] after the last column (the fused forward's in the
    model's dtype, transformers' in fp32, as generate scores them)."""
    if state.fused is not None:
        return fused_forward(state.fused, state.cache, ids, positions, allowed, slots)
    # transformers' StaticCache advances its own write position by each forward's width
    cache = {state.cache_argument: state.cache}
    mask = _attention_mask(state, allowed[:, None], dtype)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **cache)
    return out.logits[:, -1].float()


def prefill_columns(rows: int) -> int:
    """Prompt columns per prefill forward for `rows` rows (see PREFILL_TOKENS)."""
    return max(PREFILL_MIN_COLUMNS, PREFILL_TOKENS // max(rows, 1))


def prefill(model: Any, state: DecodeState, ids: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Write the left-padded prompts ids/mask [R, P] into the reset cache; the logits [R, V] after the prompts.
    On a fused copy the prompts go without their padding (`prefill_packs`), else `prefill_columns` columns of
    them per forward."""
    width = ids.size(1)
    state.key_valid.fill_(True)
    state.key_valid[:, :width] = mask
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    if state.fused is not None:
        logits = _prefill_packed(state, ids, mask, positions)
    else:
        logits = _prefill_in_columns(model, state, ids, mask, positions, dtype)
    state.positions.copy_(positions[:, -1:] + 1)
    state.cache_index.fill_(width)
    return logits


def prefill_pack_tokens(rows: int, length: int) -> int:
    """Prompt tokens per packed prefill forward for a bucket of `rows` x `length` cache slots."""
    return max(PREFILL_PACK_TOKENS, int(rows * length * PREFILL_CACHE_SHARE))


def prefill_packs(lengths: list[int], budget: int) -> list[list[int]]:
    """The rows of each packed prefill forward: consecutive rows of prompt `lengths`, up to `budget` tokens a
    forward (one row alone where it is longer); rows with no prompt (a bucket's filler rows) in none."""
    packs: list[list[int]] = []
    tokens = budget
    for row, length in enumerate(lengths):
        if length == 0:
            continue
        if tokens + length > budget:
            packs.append([])
            tokens = 0
        packs[-1].append(row)
        tokens += length
    return packs


def _prefill_packed(state: DecodeState, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    # Each prompt token's keys/values go to its column's slot, as the padded prefill writes them; padding slots
    # keep the reset's zeros, masked by key_valid. Rows with no prompt get zero logits (they are finished).
    fused = state.fused
    logits = ids.new_zeros((ids.size(0), fused.lm_head.size(0)), dtype=fused.lm_head.dtype)
    lengths = mask.sum(-1).tolist()
    ops = compiled_ops() if ids.is_cuda else PLAIN_OPS
    for pack_rows in prefill_packs(lengths, prefill_pack_tokens(state.rows, state.length)):
        index = torch.tensor(pack_rows, device=ids.device)
        valid = mask[index]
        tokens, slots, packing = pack(ids[index], valid)  # slots: each token's column in the padded layout
        # each token's cache row, from the row lengths pack put on the device (a known size: no wait for it)
        rows = index.repeat_interleave(packing.cu_seqlens.diff(), output_size=packing.bounds[-1])
        logits[index] = fused_prefill(
            fused, state.cache, tokens[0], positions[index][valid], rows, slots[0], packing, ops
        )
    return logits


def _prefill_in_columns(
    model: Any, state: DecodeState, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    width = ids.size(1)
    step = prefill_columns(ids.size(0))
    for start in range(0, width, step):
        end = min(start + step, width)
        query = torch.arange(start, end, device=ids.device)[:, None]  # [c, 1]
        keys = state.key_index
        # A padding query sees itself, so no row is fully masked (sdpa would return NaN into the cache).
        allowed = (keys[None, :] <= query) & state.key_valid[:, None, :] | (keys[None, :] == query)  # [R, c, L]
        columns = slice(start, end)
        logits = forward_columns(model, state, ids[:, columns], positions[:, columns], allowed, query[:, 0], dtype)
    return logits


def take_token(state: DecodeState, logits: torch.Tensor) -> None:
    """Choose each row's next token from `logits` [R, V], write it to `out` and `tokens` (its log-prob to `logps`),
    and mark rows that ended."""
    if state.seed is not None:  # one pass of grpo_kernels' token choice (`kernel_chooses` registered its op)
        temperature = state.sampling.temperature
        choose = torch.ops.grpo_kernels.choose_tokens
        token, logp = choose(logits, state.seed, state.step, float(temperature), state.sampling.greedy)
        if state.stop_after is not None:
            forced = state.step + 1 >= state.stop_after
            # log-prob of the forced EOS from the chosen token's: both share the row's logsumexp
            eos = state.eos[:1].expand(logits.size(0), 1)  # a tensor index: no host read inside the graph
            shift = (logits.gather(1, eos) - logits.gather(1, token[:, None]))[:, 0].float() / temperature
            logp = torch.where(forced, logp + shift, logp)
            token = torch.where(forced, state.eos[0], token)
    else:
        logits = logits.float()
        token = choose_tokens(logits, state.sampling, state.seen)
        if state.stop_after is not None:
            token = torch.where(state.step + 1 >= state.stop_after, state.eos[0], token)
        logp = token_logps(logits, token, state.sampling.temperature)
    token = torch.where(state.finished, state.pad_id, token)  # finished rows emit pad
    logp = logp.masked_fill(state.finished, 0.0)
    state.out.index_copy_(1, state.step, token[:, None])
    state.logps.index_copy_(1, state.step, logp[:, None])
    state.finished |= (token[:, None] == state.eos).any(-1)
    if state.seen is not None:
        state.seen.scatter_(1, token[:, None], True)
    state.step.add_(1)
    state.tokens.copy_(token[:, None])


def kernel_chooses(sampling: Sampling, device: torch.device) -> bool:
    """Whether the decoder's token choice runs grpo_kernels' one-pass kernel: on its devices, for the argmax or a
    draw at a temperature with no other warper (GRPOConfig's defaults); top-k, top-p, min-p and the repetition
    penalty keep the torch path. Importing the kernel registers the op `take_token` calls, once per bucket."""
    from grpo_kernels.token_choice import runs_on

    plain = not sampling.top_k and sampling.top_p >= 1.0 and sampling.min_p is None
    return plain and sampling.repetition_penalty == 1.0 and sampling.temperature > 0 and runs_on(device)


def decode_and_take(model: Any, state: DecodeState, dtype: torch.dtype) -> None:
    """The step the graph captures: the forward of every row's last token, then the choice of the next."""
    take_token(state, decode_step(model, state, dtype))


def step_keys(state: DecodeState) -> torch.Tensor:
    """The cache slots each row's new token attends to [R, L]: its prompt and every slot written so far; a
    finished row only its own new slot. Its token is pad and thrown away, so what it sees does not matter, and
    grpo_kernels' decode kernel then reads one block of its KV cache, not all of it: rows that ended stop costing
    attention even where they still fill the bucket (sdpa needs one allowed key per row, hence that slot)."""
    written = state.key_index <= state.cache_index
    return state.key_valid & written & ~state.finished[:, None] | (state.key_index == state.cache_index)


def decode_step(model: Any, state: DecodeState, dtype: torch.dtype) -> torch.Tensor:
    """One token for every row: feeds `state.tokens`, returns the next logits [R, V]."""
    allowed = step_keys(state)
    slot = state.cache_index.view(1)
    logits = forward_columns(model, state, state.tokens, state.positions, allowed[:, None], slot, dtype)
    state.positions.add_(1)
    state.cache_index.add_(1)
    return logits


def length_is_dynamic(state: DecodeState) -> None:
    """Mark the cache-length dimension of the step's tensors dynamic for torch.compile: one compiled step then
    serves every cache length (each new exact length would otherwise compile again, ~35 s on the H200: the first
    call `benchmarks/generation_bench.py` times)."""
    mark = torch._dynamo.maybe_mark_dynamic
    mark(state.key_valid, 1)
    mark(state.key_index, 0)
    mark(state.out, 1)
    mark(state.logps, 1)
    if isinstance(state.cache, KvCache):
        state.cache.mark_dynamic_length()
    for layer in getattr(state.cache, "layers", ()):  # transformers' StaticLayer: keys/values [R, H, L, D]
        for name in ("keys", "values"):
            if isinstance(getattr(layer, name, None), torch.Tensor):
                mark(getattr(layer, name), 2)
