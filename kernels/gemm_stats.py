"""The logits GEMM with the row statistics in its epilogue: one kernel where the chunk loop runs two.

The chunk loop's default (`chunk_loop`) writes each chunk's `[C, V]` logits with cuBLAS, then reads them
again in `triton_ops.row_stats` (per row and vocabulary segment: max, sum of exp, the entropy term, the
target logit). Here a Triton GEMM computes a `[BLOCK_M, BLOCK_N]` tile of logits and, before leaving it,
folds the tile's statistics: the segment of `row_stats` becomes the GEMM's N tile. For scoring (no
gradient) the logits are then never written at all: no `[C, V]` buffer, no pass over it. For the loss the
tile is still written (the gradient pass rewrites it in place) and only the statistics pass goes.

Statistics come from the logits rounded to the inputs' dtype, as `row_stats` reads them from cuBLAS's
output, so the log-sum-exp matches the tile the gradient pass reads. Same partial layout as `row_stats`
(`[3, n, n_seg]`, n_seg = ceil(V / BLOCK_N)), so `triton_ops.finish_rows` folds them unchanged.

Opt-in (`fused_stats=True` of `selective_logprobs` / `fused_linear_grpo_loss`) until timed against cuBLAS +
`row_stats` on a GPU (issue 14: the statistics pass is ~3.7 ms of the 32k-token loss); it becomes the only
path if it wins, and is deleted if it loses. `gemm_stats_torch` is its twin (torch.mm + `row_stats`' twin).
"""

from __future__ import annotations

import torch

from . import triton_ops
from .triton_ops import HAS_TRITON, INTERPRET

if HAS_TRITON:
    import triton
    import triton.language as tl

# Columns per program = vocabulary segment of the partials (fixed: the partials are sized before launch).
# 128 keeps a [128, 128] fp32 accumulator at 64 registers a thread (8 warps), leaving room for the epilogue's
# temporaries of the same shape; 256 would spill them
BLOCK_N = 128
# Programs along M grouped so neighbouring programs share weight tiles in L2
GROUP_M = 8


if HAS_TRITON:
    # Compiled once per model: a chunk's row count and its ids' offset change with each batch's valid-token
    # count, and Triton would specialise on both (a compile inside a training step; see triton_ops._jit)
    @triton_ops._jit(loose=("ids_ptr",), loose_ints=("n_rows",))
    def _gemm_stats_kernel(
        h_ptr,
        w_ptr,
        b_ptr,
        ids_ptr,
        logits_ptr,
        part_max_ptr,
        part_sum_ptr,
        part_xsum_ptr,
        target_logit_ptr,
        n_rows,
        n_cols,
        width,
        s_h,
        s_w,
        s_l,
        n_seg,
        inv_t,
        HAS_BIAS: tl.constexpr,
        WRITE: tl.constexpr,
        PRECISION: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):
        pid = tl.program_id(0)
        num_m = tl.cdiv(n_rows, BLOCK_M)
        num_n = tl.cdiv(n_cols, BLOCK_N)
        per_group = GROUP_M * num_n
        first_m = (pid // per_group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % size_m
        pid_n = (pid % per_group) // size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        row_ok = rm < n_rows
        col_ok = rn < n_cols
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, width, BLOCK_K):
            k_ok = (k0 + rk) < width
            a = tl.load(
                h_ptr + rm[:, None].to(tl.int64) * s_h + (k0 + rk)[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            b = tl.load(
                w_ptr + rn[:, None].to(tl.int64) * s_w + (k0 + rk)[None, :],
                mask=col_ok[:, None] & k_ok[None, :],
                other=0.0,
            )
            acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        z_io = acc.to(h_ptr.dtype.element_ty)  # the logits as cuBLAS would have written them
        if WRITE:
            out = logits_ptr + rm[:, None].to(tl.int64) * s_l + rn[None, :]
            tl.store(out, z_io, mask=row_ok[:, None] & col_ok[None, :])
        inv_t = tl.cast(inv_t, tl.float32)
        z = z_io.to(tl.float32) * inv_t
        m = tl.max(tl.where(col_ok[None, :], z, -float("inf")), axis=1)  # [BLOCK_M], finite: a column is valid
        d = tl.where(col_ok[None, :], z - m[:, None], 0.0)
        e = tl.where(col_ok[None, :], tl.exp(d), 0.0)
        part = rm.to(tl.int64) * n_seg + pid_n
        tl.store(part_max_ptr + part, m, mask=row_ok)
        tl.store(part_sum_ptr + part, tl.sum(e, axis=1), mask=row_ok)
        tl.store(part_xsum_ptr + part, tl.sum(e * d, axis=1), mask=row_ok)
        target = tl.load(ids_ptr + rm, mask=row_ok, other=-1)
        hit = row_ok & (target >= pid_n * BLOCK_N) & (target < pid_n * BLOCK_N + BLOCK_N)
        value = tl.sum(tl.where(rn[None, :] == target[:, None], z, 0.0), axis=1)
        tl.store(target_logit_ptr + rm, value, mask=hit)

    # Tile shapes and pipelining tuned once per (vocabulary, width); BLOCK_N stays BLOCK_N (the partials' layout)
    _CONFIGS = [
        triton.Config({"BLOCK_M": bm, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bm, bk, w, s in ((128, 64, 8, 3), (128, 64, 4, 4), (64, 64, 4, 4), (128, 128, 8, 3), (256, 64, 8, 3))
    ]
    _gemm_stats_tuned = (
        None if INTERPRET else triton.autotune(configs=_CONFIGS, key=["n_cols", "width"])(_gemm_stats_kernel)
    )


def gemm_stats_torch(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ids: torch.Tensor,
    inv_t: float,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The twin: `hidden @ weight.T (+ bias)` in the inputs' dtype (into `out` if given), then `row_stats`'
    twin with segments of `block_n` columns (default BLOCK_N)."""
    block_n = block_n or BLOCK_N
    n, vocab = hidden.shape[0], weight.shape[0]
    logits = out if out is not None else torch.empty((n, vocab), device=hidden.device, dtype=hidden.dtype)
    if bias is None:
        torch.mm(hidden, weight.t(), out=logits)
    else:
        torch.addmm(bias, hidden, weight.t(), out=logits)
    parts, target_logit = _empty_stats(n, vocab, block_n, hidden)
    triton_ops._row_stats_torch(
        logits, logits.stride(0), ids, *parts, target_logit, vocab, parts.shape[2], inv_t, block_n, block_n
    )
    return parts, target_logit


def segments(vocab: int, block_n: int | None = None) -> int:
    """Statistics segments per row (one per `block_n`-column tile, default BLOCK_N); each holds 3 fp32 partials."""
    return -(-vocab // (block_n or BLOCK_N))


def _empty_stats(n: int, vocab: int, block_n: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    parts = torch.empty((3, n, segments(vocab, block_n)), device=like.device, dtype=dtype)
    return parts, torch.empty((n,), device=like.device, dtype=dtype)


def gemm_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    ids: torch.Tensor,
    inv_t: float,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(row, `block_n`-column segment) statistics of `(hidden @ weight.T + bias) * inv_t`, and each row's
    scaled target logit, as `triton_ops.row_stats` returns them for the same logits; the logits themselves
    go to `out` ([n, V], any row stride) when given, else nowhere.

    hidden: [n, H]; weight: [V, H]; bias: [V] or None; ids: [n] int64 in [0, V); block_n: default BLOCK_N.
    """
    block_n = block_n or BLOCK_N
    if not triton_ops.use_triton(hidden.device) or hidden.dtype == torch.float64:
        return gemm_stats_torch(hidden, weight, bias, ids, inv_t, out, block_n)
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    n, width = hidden.shape
    vocab = weight.shape[0]
    parts, target_logit = _empty_stats(n, vocab, block_n, hidden)
    if n == 0:
        return parts, target_logit
    args = (
        hidden,
        weight,
        hidden if bias is None else bias,  # never read without HAS_BIAS
        ids,
        hidden if out is None else out,  # never written without WRITE
        parts[0],
        parts[1],
        parts[2],
        target_logit,
        n,
        vocab,
        width,
        hidden.stride(0),
        weight.stride(0),
        0 if out is None else out.stride(0),
        parts.shape[2],
        inv_t,
    )
    flags = dict(
        HAS_BIAS=bias is not None,
        WRITE=out is not None,
        PRECISION="ieee" if hidden.dtype == torch.float32 else "tf32",
        BLOCK_N=block_n,
        GROUP_M=GROUP_M,
    )
    if INTERPRET:
        grid = (-(-n // 16) * parts.shape[2],)
        _gemm_stats_kernel[grid](*args, **flags, BLOCK_M=16, BLOCK_K=16)
    else:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]) * parts.shape[2],)  # noqa: E731
        _gemm_stats_tuned[grid](*args, **flags)
    return parts, target_logit
