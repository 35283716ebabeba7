"""Attention of one new token per row over a static KV cache, reading only the keys the mask allows.

The graph decoder (grpo_tui.train.generation) keeps a static cache of L slots per row: the left-padded prompt,
the tokens decoded so far, and slots not yet written. Its mask allows a contiguous run of them per row, but
`scaled_dot_product_attention` with a mask reads every slot, and picks a kernel built for long queries. Here
one program per (row, key/value head) streams the cache in blocks, skips every block the mask rules out
(padding, unwritten slots) without loading it, and folds the query heads of the group (grouped-query
attention) into one pass over their shared keys, with an online softmax in fp32.

`decode_attention` is a torch custom op, so torch.compile treats it as one opaque call and a CUDA graph
captures its launch; `decode_attention_torch` is its twin for tests and for devices without Triton.
"""

from __future__ import annotations

import math

import torch

from .triton_ops import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

# Keys per loop step of a program.
BLOCK_KEYS = 32


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


if HAS_TRITON:

    @triton.jit
    def _decode_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        mask_ptr,
        out_ptr,
        sq_r,
        sq_h,
        sk_r,
        sk_h,
        sk_l,
        sv_r,
        sv_h,
        sv_l,
        sm_r,
        so_r,
        so_h,
        length,
        scale,
        KV_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        DIM: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row = (pid // KV_HEADS).to(tl.int64)
        kv = pid % KV_HEADS
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, DIM)
        heads = kv * GROUP + g
        gmask = g < GROUP
        q = tl.load(q_ptr + row * sq_r + heads[:, None] * sq_h + d[None, :], mask=gmask[:, None], other=0.0)
        q = q.to(tl.float32) * scale  # [G, D]
        m_i = tl.full((GROUP_PAD,), -float("inf"), tl.float32)
        l_i = tl.zeros((GROUP_PAD,), tl.float32)
        acc = tl.zeros((GROUP_PAD, DIM), tl.float32)
        k_base = k_ptr + row * sk_r + kv * sk_h
        v_base = v_ptr + row * sv_r + kv * sv_h
        for start in range(0, length, BLOCK):
            n = start + tl.arange(0, BLOCK)
            allowed = tl.load(mask_ptr + row * sm_r + n, mask=n < length, other=0) != 0
            if tl.max(allowed.to(tl.int32), axis=0) > 0:  # blocks of padding or unwritten slots are never read
                k = tl.load(k_base + n[:, None] * sk_l + d[None, :], mask=allowed[:, None], other=0.0).to(tl.float32)
                s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [G, BLOCK]
                s = tl.where(allowed[None, :], s, -float("inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
                v = tl.load(v_base + n[:, None] * sv_l + d[None, :], mask=allowed[:, None], other=0.0).to(tl.float32)
                acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                m_i = m_new
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + row * so_r + heads[:, None] * so_h + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=gmask[:, None],
        )


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


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
    rows, heads, q_len, dim = query.shape
    if q_len != 1 or key.shape[0] != rows or heads % key.shape[1] or key.shape != value.shape:
        raise ValueError(
            f"decode_attention: query [R, H, 1, D] with key/value [R, H_kv, L, D]; got {tuple(query.shape)}, "
            f"{tuple(key.shape)}, {tuple(value.shape)}"
        )
    if mask.shape != (rows, key.shape[2]) or mask.dtype != torch.bool:
        raise ValueError(f"decode_attention: bool mask [R, L] = {(rows, key.shape[2])}, got {tuple(mask.shape)}")
    if dim & (dim - 1):
        raise ValueError(f"decode_attention: head dim must be a power of two, got {dim}")


@torch.library.custom_op("grpo_kernels::decode_attention", mutates_args=())
def _decode_attention_op(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    if not (HAS_TRITON and use_triton(query.device)):
        return decode_attention_torch(query, key, value, mask, scale)
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    out = torch.empty((rows, 1, heads, dim), device=query.device, dtype=query.dtype)
    mask = mask.contiguous()
    _decode_attention_kernel[(rows * kv_heads,)](
        query,
        key,
        value,
        mask,
        out,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        key.stride(2),
        value.stride(0),
        value.stride(1),
        value.stride(2),
        mask.stride(0),
        out.stride(0),
        out.stride(2),
        key.shape[2],
        scale,
        KV_HEADS=kv_heads,
        GROUP=group,
        GROUP_PAD=_next_pow2(group),
        DIM=dim,
        BLOCK=BLOCK_KEYS,
        num_warps=4,
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
    head h // (H / H_kv), as transformers' repeat_kv orders them), bool mask [R, L] (True = attend; every row
    allows at least one key) -> [R, 1, H, D] in the query's dtype. The mask's disallowed blocks cost nothing."""
    _check(query, key, value, mask)
    return _decode_attention_op(query, key, value, mask, scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
