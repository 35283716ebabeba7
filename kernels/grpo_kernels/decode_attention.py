"""Attention of one new token per row over a static KV cache (flash-decoding: the keys split across programs).

The graph decoder (grpo_tui.train.generation) keeps a static cache of L slots per row: the left-padded prompt,
the tokens decoded so far, and slots not yet written. Its mask allows a contiguous run of them per row, but
`scaled_dot_product_attention` with a mask reads every slot. Here the keys of each (row, key/value head) are
cut into SPLITS contiguous ranges, one program each, so a decode batch fills the GPU even with few rows; a
program streams its range in BLOCK_KEYS-wide steps, skips every step the mask rules out (padding, unwritten
slots) without loading its keys/values, and folds the query heads of the group (grouped-query attention) into
the rows of one tensor-core product, padded to 16 rows: decode is memory-bound, the padding's flops are free.
Each program leaves an unnormalised partial (acc, running max, sum of exp); a second small kernel merges the
splits of each (row, head) with the usual log-sum-exp weights. Where one split covers the row (many rows, or a
short cache), its program writes the output itself and the merge is not launched.

Measured on the H200 (bf16, Qwen3-0.6B's 16 query / 8 key-value heads of 128, 300 of 512 slots filled per
row, in a CUDA graph; `benchmarks/decode_attention_bench.py`): 36.9 us per call at 128 rows against sdpa's
folded attention (cuDNN) 115.8 us, 119.1 against 418.5 at 512 rows, with the defaults below (the fastest of 108
settings at 128 rows, `benchmarks/results/decode-attention-h200/`; 53.6 and 183.1 us with the loop bounds
taken from the mask instead of hoisted). The graph decoder uses it by default. One program per (row, kv head)
with 32-key steps and elementwise products lost to sdpa.

`decode_attention` is a torch custom op, so torch.compile treats it as one opaque call and a CUDA graph
captures its launches; `decode_attention_torch` is its twin for tests and for devices without Triton.
"""

from __future__ import annotations

import math

import torch

from .triton_ops import HAS_TRITON, next_pow2, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

# Keys per loop step of a program (the N of the score product, the K of the output product; >= 16 for tl.dot)
BLOCK_KEYS = 64
# Fewest keys one split covers: shorter splits spend more on the merge than they save
MIN_SPLIT_KEYS = 64
# Programs the split rule aims for: 8 per SM of an H200 (132 SMs), so rows and heads alone need not fill it
# (with the hoisted loop bounds the fastest of 1,056 / 2,112 / 4,224 at 128 and 512 rows on the H200,
# `benchmarks/results/decode-attention-h200/`)
TARGET_PROGRAMS = 8 * 132
# Query rows of a group's tile: tl.dot needs M >= 16 (Qwen3's group is 2)
MIN_GROUP_PAD = 16
# Launch settings of the split kernel, left here for a GPU sweep
NUM_WARPS = 4
NUM_STAGES = 2
# Each program reads its row's mask once for its loop bounds (first and last allowed slot), up to this many
# slots in one load (the swept case) and in a loop of such loads beyond it, so long caches (e.g. 8k-token
# completions) do not hold the whole row in registers. The bounds replaced a check and branch per block
# (deleted after it lost every H200 sweep, 108 settings, `benchmarks/decode_attention_bench.py`: 36.9 vs
# 53.6 us per call at 128 rows x 300 of 512 slots, 119.1 vs 183.1 at 512 rows): with no branch between one
# block's keys and the next block's loads, the loads can be pipelined.
HOIST_MASK_BLOCK = 1024
LOG2E = 1.4426950408889634


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def split_geometry(programs: int, length: int) -> tuple[int, int]:
    """(keys per split, splits) for `programs` (row, kv head) pairs over `length` cache slots: up to a power
    of two of splits, enough for TARGET_PROGRAMS, none shorter than MIN_SPLIT_KEYS, each whole blocks (the
    last split may be shorter; rounding to blocks may leave fewer splits than asked)."""
    wanted = next_pow2(_ceil_div(TARGET_PROGRAMS, programs))
    splits = max(1, min(wanted, length // MIN_SPLIT_KEYS))
    split_keys = _ceil_div(_ceil_div(length, splits), BLOCK_KEYS) * BLOCK_KEYS
    return split_keys, _ceil_div(length, split_keys)


if HAS_TRITON:

    @triton.jit
    def _split_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        mask_ptr,
        acc_ptr,
        max_ptr,
        sum_ptr,
        out_ptr,
        so_r,
        so_h,
        sq_r,
        sq_h,
        sk_r,
        sk_h,
        sk_l,
        sv_r,
        sv_h,
        sv_l,
        sm_r,
        length,
        split_keys,
        qk_scale,
        KV_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        PRECISION: tl.constexpr,
        L_PAD: tl.constexpr,
        ONE_LOAD: tl.constexpr,
        FINAL: tl.constexpr,
    ):
        # Program (row * KV_HEADS + kv, split): the GROUP query heads of kv over keys [lo, hi)
        pid = tl.program_id(0)
        split = tl.program_id(1)
        splits = tl.num_programs(1)
        row = (pid // KV_HEADS).to(tl.int64)
        kv = pid % KV_HEADS
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM)
        heads = kv * GROUP + g  # repeat_kv's order: query head h reads kv head h // GROUP
        gmask = g < GROUP
        q = tl.load(q_ptr + row * sq_r + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None], other=0.0)  # [G, D]
        m_i = tl.full((GROUP_PAD,), -float("inf"), tl.float32)  # running max of log2-scaled scores
        l_i = tl.zeros((GROUP_PAD,), tl.float32)  # running sum of exp2(score - m_i)
        acc = tl.zeros((GROUP_PAD, DIM), tl.float32)  # unnormalised output
        k_base = k_ptr + row * sk_r + kv * sk_h
        v_base = v_ptr + row * sv_r + kv * sv_h
        lo = split * split_keys
        hi = tl.minimum(lo + split_keys, length)
        # Only the blocks from the row's first to its last allowed slot: no per-block check below
        slots = tl.arange(0, L_PAD)
        row_mask = tl.load(mask_ptr + row * sm_r + slots, mask=slots < length, other=0) != 0
        first = tl.min(tl.where(row_mask, slots, length), axis=0)
        last = tl.max(tl.where(row_mask, slots, -1), axis=0)
        if not ONE_LOAD:  # the rest of a long row, L_PAD slots at a time
            for m0 in range(L_PAD, length, L_PAD):
                more = m0 + slots
                row_mask = tl.load(mask_ptr + row * sm_r + more, mask=more < length, other=0) != 0
                first = tl.minimum(first, tl.min(tl.where(row_mask, more, length), axis=0))
                last = tl.maximum(last, tl.max(tl.where(row_mask, more, -1), axis=0))
        # The split's fixed range of cache slots, cut to the row's allowed run. Splits cut from each row's own run
        # instead (a left-padded row's first splits are idle here) were never faster on an H100 beyond noise, up
        # to 16% slower (benchmarks/results/decode-fused-h100/).
        lo = lo + tl.maximum(first - lo, 0) // BLOCK * BLOCK  # stays on the split's block grid
        hi = tl.minimum(hi, last + 1)
        for start in range(lo, hi, BLOCK):
            n = start + tl.arange(0, BLOCK)
            allowed = tl.load(mask_ptr + row * sm_r + n, mask=n < hi, other=0) != 0  # [BLOCK]
            # Masked loads read 0 there: a slot may hold anything, NaN included
            k = tl.load(k_base + n[:, None] * sk_l + d[None, :], mask=allowed[:, None], other=0.0)  # [BLOCK, D]
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [G, BLOCK] fp32, log2 units
            s = tl.where(allowed[None, :], s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            # -inf only for a block of holes inside the hoisted range (so far nothing allowed): exp2 of
            # -inf - 0 gives p = 0 and alpha = 0 there, not NaN
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            v = tl.load(v_base + n[:, None] * sv_l + d[None, :], mask=allowed[:, None], other=0.0)  # [BLOCK, D]
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new
        if FINAL:  # one split: the output itself, no partials and no merge
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
            tl.store(
                out_ptr + row * so_r + heads[:, None] * so_h + d[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=gmask[:, None],
            )
        else:
            # Partials [R, H, SPLITS(, D)]; a split the mask rules out entirely leaves max -inf, sum 0, acc 0
            part = (row * KV_HEADS * GROUP + heads) * splits + split  # [G]
            tl.store(acc_ptr + part[:, None] * DIM + d[None, :], acc, mask=gmask[:, None])
            tl.store(max_ptr + part, m_i, mask=gmask)
            tl.store(sum_ptr + part, l_i, mask=gmask)

    @triton.jit
    def _merge_kernel(
        acc_ptr,
        max_ptr,
        sum_ptr,
        out_ptr,
        so_r,
        so_h,
        splits,
        HEADS: tl.constexpr,
        DIM: tl.constexpr,
        SPLITS_PAD: tl.constexpr,
    ):
        # Program row * HEADS + h: out = sum_s w_s acc_s / sum_s w_s l_s, w_s = exp2(m_s - max_s m_s)
        pid = tl.program_id(0).to(tl.int64)
        row = pid // HEADS
        head = pid % HEADS
        s = tl.arange(0, SPLITS_PAD)
        d = tl.arange(0, DIM)
        valid = s < splits
        m = tl.load(max_ptr + pid * splits + s, mask=valid, other=-float("inf"))  # [S]
        l_s = tl.load(sum_ptr + pid * splits + s, mask=valid, other=0.0)
        acc = tl.load(acc_ptr + (pid * splits + s)[:, None] * DIM + d[None, :], mask=valid[:, None], other=0.0)
        top = tl.max(m, axis=0)
        w = tl.where(m > -float("inf"), tl.exp2(m - top), 0.0)  # splits with no allowed key weigh 0, not NaN
        total = tl.sum(w * l_s, axis=0)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)  # [D]
        tl.store(out_ptr + row * so_r + head * so_h + d, out.to(out_ptr.dtype.element_ty))


def decode_attention_torch(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """The twin: query [R, H, 1, D], key/value [R, H_kv, L, D], bool mask [R, L] (True = attend) -> [R, 1, H, D]."""
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    q = query.float().reshape(rows, kv_heads, heads // kv_heads, dim)
    ruled_out = ~mask[:, None, :, None]  # what the kernel never reads may hold anything, NaN included
    key, value = key.float().masked_fill(ruled_out, 0.0), value.float().masked_fill(ruled_out, 0.0)
    scores = torch.einsum("rkgd,rkld->rkgl", q, key) * scale
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    out = torch.einsum("rkgl,rkld->rkgd", scores.softmax(-1), value)
    return out.reshape(rows, 1, heads, dim).to(query.dtype)


def supports(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether `decode_attention` takes these inputs (else it raises): callers with a fallback ask first, so a
    model whose head size the kernel does not cover (not a power of two >= 16) keeps its sdpa path."""
    try:
        _check(query, key, value, mask)
    except ValueError:
        return False
    return True


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
    q, k = query.shape, key.shape
    if not (
        len(q) == len(k) == 4 and q[2] == 1 and k[0] == q[0] and q[1] % k[1] == 0 and k[3] == q[3] and k == value.shape
    ):
        raise ValueError(
            f"decode_attention: query [R, H, 1, D] with key/value [R, H_kv, L, D]; got {tuple(q)}, {tuple(k)}, "
            f"{tuple(value.shape)}"
        )
    rows, _, _, dim = q
    if mask.shape != (rows, key.shape[2]) or mask.dtype != torch.bool:
        raise ValueError(
            f"decode_attention: bool mask [R, L] = {(rows, key.shape[2])}, got {mask.dtype} {tuple(mask.shape)}"
        )
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(
            f"decode_attention: one dtype for query/key/value, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"decode_attention: head dim must be a power of two >= 16, got {dim}")


@torch.library.custom_op("grpo_kernels::decode_attention", mutates_args=())
def _decode_attention_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    if not use_triton(query.device):  # (False without Triton)
        return decode_attention_torch(query, key, value, mask, scale)
    rows, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    query, key, value, mask = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value, mask))
    split_keys, splits = split_geometry(rows * kv_heads, length)
    final = splits == 1
    out = torch.empty((rows, 1, heads, dim), device=query.device, dtype=query.dtype)
    if final:  # no partials: the kernel neither reads nor writes them, `out` stands in for their pointers
        acc = top = total = out
    else:  # scratch for the partials; inside a CUDA graph they come from its pool
        acc = torch.empty((rows, heads, splits, dim), device=query.device, dtype=torch.float32)
        top = torch.empty((rows, heads, splits), device=query.device, dtype=torch.float32)
        total = torch.empty_like(top)
    _split_kernel[(rows * kv_heads, splits)](
        query,
        key,
        value,
        mask,
        acc,
        top,
        total,
        out,
        out.stride(0),
        out.stride(2),
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        key.stride(2),
        value.stride(0),
        value.stride(1),
        value.stride(2),
        mask.stride(0),
        length,
        split_keys,
        scale * LOG2E,
        KV_HEADS=kv_heads,
        GROUP=group,
        GROUP_PAD=max(MIN_GROUP_PAD, next_pow2(group)),
        DIM=dim,
        BLOCK=BLOCK_KEYS,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",  # no TF32 rounding of fp32 inputs
        # (constexprs: one compile per power of two of the length up to HOIST_MASK_BLOCK)
        L_PAD=min(next_pow2(length), HOIST_MASK_BLOCK),
        ONE_LOAD=next_pow2(length) <= HOIST_MASK_BLOCK,
        FINAL=final,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    if final:
        return out
    _merge_kernel[(rows * heads,)](
        acc,
        top,
        total,
        out,
        out.stride(0),
        out.stride(2),
        splits,
        HEADS=heads,
        DIM=dim,
        SPLITS_PAD=next_pow2(splits),
        num_warps=1 if dim <= 64 else 2,
    )
    return out


@_decode_attention_op.register_fake
def _(query, key, value, mask, scale):
    rows, heads, _, dim = query.shape
    return query.new_empty((rows, 1, heads, dim))


def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Attention of one query per row: query [R, H, 1, D], key/value [R, H_kv, L, D] (head h reads key/value
    head h // (H / H_kv), as transformers' repeat_kv orders them; any strides, the last 1), bool mask [R, L]
    (True = attend; every row allows at least one key) -> [R, 1, H, D] in the query's dtype. Keys the mask
    rules out are never read, so they may hold anything; blocks of them cost next to nothing."""
    _check(query, key, value, mask)
    return _decode_attention_op(query, key, value, mask, scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
