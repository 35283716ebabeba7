"""Opt-in "fast_stats" / "fast_grad" variants of the two memory-bound passes (see `triton_ops`).

Multi-row tiles per program, autotuned on CUDA over (rows, block, warps, stages) once per vocabulary
width; same outputs and layouts as the default kernels in `triton_ops`, which dispatches to these when the
chunk loop's variant flags ask for them. Under TRITON_INTERPRET=1 they run with fixed small shapes (tests).
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - Triton ships with torch on Linux
    HAS_TRITON = False

# Read once at import, as Triton itself does when it decorates the kernels below (as in triton_ops)
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _jit(fn):
    return triton.jit(fn) if HAS_TRITON else fn


@_jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@_jit
def _row_stats_rows_kernel(
    logits_ptr,
    stride,
    targets_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_xsum_ptr,
    target_logit_ptr,
    n_rows,
    n_cols,
    n_seg,
    inv_t,
    SEG: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
):
    # The "fast_stats" variant of `_row_stats_kernel`: ROWS rows per program as one [ROWS, BLOCK] tile, so
    # each cross-warp reduction serves ROWS rows and more loads are in flight per program; the two sums
    # share one reduction (one shared-memory round instead of two). Same partials, same layout.
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    seg = tl.program_id(1)
    inv_t = tl.cast(inv_t, tl.float32)
    row_ptrs = logits_ptr + rows[:, None] * stride
    seg_start = seg * SEG
    seg_end = tl.minimum(seg_start + SEG, n_cols)
    # Issued before the stream so its latency overlaps it (the default kernel waits for it at the end)
    target = tl.load(targets_ptr + rows, mask=rmask, other=-1)
    m = tl.full((ROWS,), -float("inf"), tl.float32)
    s = tl.full((ROWS,), 0.0, tl.float32)
    xs = tl.full((ROWS,), 0.0, tl.float32)
    for start in range(seg_start, seg_end, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols < seg_end)[None, :]
        z = tl.load(row_ptrs + cols[None, :], mask=valid, other=0.0).to(tl.float32) * inv_t
        new_m = tl.maximum(m, tl.max(tl.where(valid, z, -float("inf")), axis=1))
        # Rows past n_rows have new_m = -inf: keep their arithmetic finite (they are never stored)
        safe_m = tl.where(rmask, new_m, 0.0)
        d = tl.where(valid, z - safe_m[:, None], 0.0)
        e = tl.where(valid, tl.exp(d), 0.0)
        alpha = tl.where(rmask, tl.exp(m - safe_m), 0.0)
        shift = tl.where(s > 0, m - safe_m, 0.0) * s
        se, sed = tl.reduce((e, e * d), 1, _add2)
        xs = alpha * (xs + shift) + sed
        s = alpha * s + se
        m = new_m
    out = rows * n_seg + seg
    tl.store(part_max_ptr + out, m, mask=rmask)
    tl.store(part_sum_ptr + out, s, mask=rmask)
    tl.store(part_xsum_ptr + out, xs, mask=rmask)
    hit = rmask & (target >= seg_start) & (target < seg_end)
    t_logit = tl.load(logits_ptr + rows * stride + target, mask=hit, other=0.0).to(tl.float32) * inv_t
    tl.store(target_logit_ptr + rows, t_logit, mask=hit)


# (ROWS, BLOCK, num_warps, num_stages) tried by the "fast_stats" autotuner once per vocabulary width: 16-byte
# loads need BLOCK / (32 * warps) >= 8 bf16 per thread; more rows per program amortise the reductions
# (the default kernel's own shapes, ROWS = 1 and BLOCK = 4096 at 2-16 warps, are among them)
FAST_STATS_CONFIGS = (
    (1, 4096, 2, 1), (1, 4096, 4, 1), (1, 4096, 8, 1), (1, 4096, 16, 1), (2, 4096, 4, 1), (2, 4096, 8, 1),
    (2, 4096, 16, 1), (4, 4096, 16, 1), (2, 2048, 8, 1), (4, 2048, 8, 1), (4, 2048, 16, 1), (8, 1024, 8, 1),
    (2, 2048, 8, 3), (4, 1024, 4, 3),
)  # fmt: skip
# Rows per program of the fast kernel under the interpreter (tests): > 1 so row masking is exercised
INTERPRET_FAST_ROWS = 2

if HAS_TRITON and not INTERPRET:
    _row_stats_rows_tuned = triton.autotune(
        configs=[
            triton.Config({"ROWS": r, "BLOCK": b}, num_warps=w, num_stages=st) for r, b, w, st in FAST_STATS_CONFIGS
        ],
        key=["n_cols"],
    )(_row_stats_rows_kernel)


@_jit
def _logits_to_grad_rows_kernel(
    logits_ptr, stride, targets_ptr, lse_ptr, grad_ptr, n_rows, n_cols, inv_t, BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
):  # fmt: skip
    # The "fast_grad" variant of `_logits_to_grad_kernel`: a [ROWS, BLOCK] tile per program
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = rmask[:, None] & (cols < n_cols)[None, :]
    inv_t = tl.cast(inv_t, tl.float32)
    ptrs = logits_ptr + rows[:, None] * stride + cols[None, :]
    z = tl.load(ptrs, mask=valid, other=0.0).to(tl.float32) * inv_t
    p = tl.exp(z - tl.load(lse_ptr + rows, mask=rmask, other=0.0)[:, None])
    g = tl.load(grad_ptr + rows, mask=rmask, other=0.0) * inv_t
    onehot = (cols[None, :] == tl.load(targets_ptr + rows, mask=rmask, other=-1)[:, None]).to(tl.float32)
    tl.store(ptrs, (g[:, None] * (onehot - p)).to(logits_ptr.dtype.element_ty), mask=valid)


# (ROWS, BLOCK, num_warps) tried by the "fast_grad" autotuner once per vocabulary width (the first is the
# default kernel's shape); the buffer is restored between trials since the pass works in place
FAST_GRAD_CONFIGS = (
    (1, 4096, 8), (1, 4096, 4), (1, 8192, 8), (1, 8192, 16), (2, 4096, 8), (2, 4096, 16), (4, 2048, 8),
    (2, 2048, 4), (4, 4096, 16),
)  # fmt: skip

if HAS_TRITON and not INTERPRET:
    _logits_to_grad_rows_tuned = triton.autotune(
        configs=[triton.Config({"ROWS": r, "BLOCK": b}, num_warps=w) for r, b, w in FAST_GRAD_CONFIGS],
        key=["n_cols"],
        restore_value=["logits_ptr"],
    )(_logits_to_grad_rows_kernel)


def row_stats_fast(args: tuple, n: int, n_seg: int, seg: int, block: int) -> None:
    """Launch the fast row-stats kernel on `triton_ops.row_stats`'s argument tuple (n rows, n_seg segments)."""
    if INTERPRET:
        rows = INTERPRET_FAST_ROWS
        _row_stats_rows_kernel[(-(-n // rows), n_seg)](*args[:7], n, *args[7:], SEG=seg, BLOCK=block, ROWS=rows)
    else:
        grid = lambda meta: (triton.cdiv(n, meta["ROWS"]), n_seg)  # noqa: E731
        _row_stats_rows_tuned[grid](*args[:7], n, *args[7:], SEG=seg)


def logits_to_grad_fast(logits, targets, lse, grad_logps, inv_t: float, block: int) -> None:
    """Launch the fast in-place gradient kernel (`block`: columns per program under the interpreter)."""
    n, n_cols = logits.shape
    if INTERPRET:
        rows = INTERPRET_FAST_ROWS
        _logits_to_grad_rows_kernel[(-(-n // rows), -(-n_cols // block))](
            logits, logits.stride(0), targets, lse, grad_logps, n, n_cols, inv_t, BLOCK=block, ROWS=rows
        )
    else:
        grid = lambda meta: (triton.cdiv(n, meta["ROWS"]), triton.cdiv(n_cols, meta["BLOCK"]))  # noqa: E731
        _logits_to_grad_rows_tuned[grid](logits, logits.stride(0), targets, lse, grad_logps, n, n_cols, inv_t)
