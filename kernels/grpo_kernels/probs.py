"""One pass over a chunk's logits for the loss: the row statistics and the softmax, in place, in one read.

The loss used to read each chunk's logits twice: `triton_ops.row_stats` (the statistics, for the logsumexp)
and then `logits_to_grad` (read and write: the softmax needs the logsumexp). Here one read does both, since
the softmax is written *unnormalised*, against a per-row shift M known before the pass:

    tile[i, j] = exp(z_ij - M_i),  z = logits / T,  M_i = z_i,target + LEAD

The row's sum S_i = sum_j exp(z_ij - M_i) comes out of the same pass, and p_ij = tile[i, j] / S_i, so the
normalisation is a per-row scale that the chunk loop applies to the small side of each gradient GEMM:

    d(loss)/d(logits) = g (onehot - p) / T = c * tile',  c_i = -g_i / (T S_i),  tile'[i, t_i] = tile[i, t_i] - S_i
    dH_c = c * (tile' @ W),   dW += tile'^T @ (c * h_c),   db += tile'^T @ c

The target column stays the raw logit during the pass (every program of the row reads it for M) and gets
tile[i, t] - S_i (computed in fp32: no cancellation in bf16 when p_t is near 1) from `triton_ops.finish_rows`.

Why the target: a sampled token's logit is close to its row's max (z_max - z_t = its log-prob gap), so the
stored values stay in a range where bf16 (fp32's exponent) keeps every probability that matters. A block
whose max exceeds M by more than WINDOW is left raw and its statistics taken against its own max; such rows
are then repaired by `repair` (rows whose target is improbable beyond exp(-WINDOW): rare in GRPO, where the
targets were sampled from the policy), which rescales them against the row's max. Either way the partial
statistics have `row_stats`' layout, so `finish_rows` folds them unchanged.

Times in this file's comments: one chunk's stages, `benchmarks/kernel/bench.py --profile` on an H200, and
the loss per call, `benchmarks/kernel/bench.py` (results in `benchmarks/results/kernel-*`).
"""

from __future__ import annotations

import torch

from . import triton_ops
from .triton_ops import HAS_TRITON, LOGIT_FLOOR, floored, jit, load_floored, next_pow2

if HAS_TRITON:
    import triton.language as tl

# Columns per program of the pass, and its warps: 2,048 x 4 since a row's blocks run as neighbouring programs
# (H200, one run, 32k-token loss alternated twice: 53.2 / 55.3 ms at 0 / 75% padding against 53.5 / 55.9 for
# 4,096 x 8; the pass alone 0.282 vs 0.310 ms per 1,536-row chunk)
PROBS_BLOCK = 2048
PROBS_WARPS = 4
# (LEAD, WINDOW) per logits dtype: M_i = the target's logit / T + LEAD; the stored values are at most
# exp(WINDOW) (blocks beyond are left raw and repaired) and the target's own is exp(-LEAD), so S_i >= exp(-LEAD)
# and |c_i| <= |g| exp(LEAD) / T. bf16, fp32, fp64 share fp32's exponent range: values from exp(-87) to
# exp(88) are normal, so exp(-8) .. exp(32) leaves room on both sides. fp16 holds only exp(-9.7) .. exp(11):
# M at the target itself, a narrow window, and the chunk loop scales the tile's rows by c in place (c * h_c
# and tile @ W would leave fp16's range), which makes it the two-pass path's traffic again
WINDOWS = {torch.float16: (0.0, 10.0)}
DEFAULT_WINDOW = (8.0, 32.0)


@jit(loose=("targets_ptr", "part_max_ptr", "part_sum_ptr", "part_xsum_ptr", "target_logit_ptr", "shift_ptr", "bad_ptr"))
def _probs_kernel(
    logits_ptr,
    stride,
    targets_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_xsum_ptr,
    target_logit_ptr,
    shift_ptr,
    bad_ptr,
    n_cols,
    n_blk,
    inv_t,
    BLOCK: tl.constexpr,
    LEAD: tl.constexpr,
    WINDOW: tl.constexpr,
    FLOOR: tl.constexpr,
):
    # One program per (row, block of columns): statistics of z = logits / T against M, and exp(z - M) in place.
    # A row's blocks are neighbouring programs, so the programs in flight stream contiguous memory (rows
    # fastest took 6% longer on an H200: 0.301 vs 0.283 ms a chunk, with the int32 column compare below)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_blk
    blk = (pid % n_blk).to(tl.int32)
    inv_t = tl.cast(inv_t, tl.float32)
    row_ptr = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    z_t = tl.load(row_ptr + target).to(tl.float32) * inv_t  # never written by the pass: every program reads it
    target = target.to(tl.int32)  # the per-column compare in 32 bits
    shift = z_t + LEAD
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    raw = tl.load(row_ptr + cols, mask=inside, other=-float("inf"))
    z = floored(raw, FLOOR) * inv_t
    top = tl.max(z, axis=0)
    # Beyond the window the block is left raw, its statistics against its own max (NaN lands there too, and
    # reaches the row's stats)
    good = top - shift <= WINDOW
    ref = tl.where(good, shift, top)
    d = z - ref
    e = tl.exp(d)  # masked and -inf columns (at FLOOR): exactly 0
    s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
    out = row * n_blk + blk
    tl.store(part_max_ptr + out, ref)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_xsum_ptr + out, x)
    if good:
        # The target column gets its own raw bits back (a select, not a mask: the store stays vectorised; a
        # mask of `cols != target` made it one 2-byte store per column: 0.94 vs 0.28 ms a chunk on an H200)
        tl.store(row_ptr + cols, tl.where(cols == target, raw, e.to(raw.dtype)), mask=inside)
    else:
        tl.store(bad_ptr + row, 1)
    if blk == 0:
        tl.store(target_logit_ptr + row, z_t)
        tl.store(shift_ptr + row, shift)


def _probs_torch(
    logits,
    stride,
    targets,
    part_max,
    part_sum,
    part_xsum,
    target_logit,
    shift,
    bad,
    n_cols,
    n_blk,
    inv_t,
    BLOCK,
    LEAD,
    WINDOW,
    FLOOR,
):
    # `_probs_kernel` in torch: block by block over all rows at once
    del stride, n_blk
    dt = part_max.dtype
    raw_t = logits.gather(1, targets.unsqueeze(1))  # [n, 1]: restored after the blocks are written
    z_t = raw_t.squeeze(1).to(dt) * inv_t
    m = z_t + LEAD
    for blk, start in enumerate(range(0, n_cols, BLOCK)):
        view = logits[:, start : start + BLOCK]
        z = view.to(dt).clamp(min=FLOOR) * inv_t
        top = z.amax(1)
        good = top - m <= WINDOW  # NaN: not good, as in the kernel
        ref = torch.where(good, m, top)
        d = z - ref.unsqueeze(1)
        e = torch.exp(d)
        part_max[:, blk] = ref
        part_sum[:, blk] = e.sum(1)
        part_xsum[:, blk] = (e * d).sum(1)
        view.copy_(torch.where(good.unsqueeze(1), e.to(view.dtype), view))
        bad |= ~good
    logits.scatter_(1, targets.unsqueeze(1), raw_t)
    target_logit.copy_(z_t)
    shift.copy_(m)


@jit(loose=("targets_ptr", "part_max_ptr", "shift_ptr", "bad_ptr"), loose_ints=("n_blk",))
def _repair_kernel(
    logits_ptr,
    stride,
    targets_ptr,
    part_max_ptr,
    shift_ptr,
    bad_ptr,
    n_cols,
    n_blk,
    inv_t,
    BLOCK: tl.constexpr,
    BLKS: tl.constexpr,
    FLOOR: tl.constexpr,
):
    # One program per row; rows the pass flagged: every block against the row's max instead of M (converted
    # blocks rescaled, raw ones converted; the target column left raw), M replaced, the flag cleared
    row = tl.program_id(0).to(tl.int64)
    if tl.load(bad_ptr + row) != 0:
        inv_t = tl.cast(inv_t, tl.float32)
        row_ptr = logits_ptr + row * stride
        pm = tl.load(
            part_max_ptr + row * n_blk + tl.arange(0, BLKS), mask=tl.arange(0, BLKS) < n_blk, other=-float("inf")
        )
        new = tl.max(pm, axis=0)
        old = tl.load(shift_ptr + row)
        target = tl.load(targets_ptr + row)
        for blk in range(0, n_blk):
            cols = blk * BLOCK + tl.arange(0, BLOCK)
            keep = (cols < n_cols) & (cols != target)
            if tl.load(part_max_ptr + row * n_blk + blk) == old:  # converted by the pass: exp(z - old)
                v = tl.load(row_ptr + cols, mask=keep, other=0.0).to(tl.float32) * tl.exp(old - new)
            else:
                v = tl.exp(load_floored(row_ptr + cols, keep, FLOOR) * inv_t - new)
            tl.store(row_ptr + cols, v.to(logits_ptr.dtype.element_ty), mask=keep)
        tl.store(shift_ptr + row, new)
        tl.store(bad_ptr + row, 0)


def _repair_torch(logits, stride, targets, part_max, shift, bad, n_cols, n_blk, inv_t, BLOCK, BLKS, FLOOR):
    # `_repair_kernel` in torch (off CUDA: the host sync of finding the rows costs nothing there)
    del stride, n_blk, BLKS
    rows = bad.nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    dt = part_max.dtype
    tile = logits[rows]  # [r, V] copy
    raw_t = tile.gather(1, targets[rows].unsqueeze(1))
    new = part_max[rows].amax(1, keepdim=True)
    old = shift[rows].unsqueeze(1)
    for blk, start in enumerate(range(0, n_cols, BLOCK)):
        view = tile[:, start : start + BLOCK]
        z = view.to(dt)
        converted = part_max[rows, blk].unsqueeze(1) == old
        view.copy_(torch.where(converted, z * torch.exp(old - new), torch.exp(z.clamp(min=FLOOR) * inv_t - new)))
    tile.scatter_(1, targets[rows].unsqueeze(1), raw_t)
    logits[rows] = tile
    shift[rows] = new.squeeze(1)
    bad[rows] = 0


def probs_pass(
    logits: torch.Tensor, targets: torch.Tensor, inv_t: float, bad: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Overwrite `logits` [n, V] with exp(logits / T - M) (target column raw) and return its statistics.

    Args:
        logits: one chunk's logits, rewritten in place.
        targets: [n] int64 target ids in [0, V).
        inv_t: 1 / temperature.
        bad: [>= n] int32 zeros, scratch for the rows to repair; left zero again.

    Returns:
        ([3, n, n_blk] partial statistics in `row_stats`' layout, [n] target logits / T, [n] the shifts M),
        fp32 (fp64 for fp64 logits), for `triton_ops.finish_rows(parts, target_logit, ..., fix=...)`.
    """
    n, n_cols = logits.shape
    stats_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    block = min(PROBS_BLOCK, next_pow2(n_cols))
    n_blk = -(-n_cols // block)
    parts = torch.empty((3, n, n_blk), device=logits.device, dtype=stats_dtype)
    target_logit, shift = torch.empty((2, n), device=logits.device, dtype=stats_dtype)
    bad = bad[:n]
    lead, window = WINDOWS.get(logits.dtype, DEFAULT_WINDOW)
    stats = (parts[0], parts[1], parts[2], target_logit, shift, bad)
    fixed = (logits, logits.stride(0), targets)
    if triton_ops.use_triton(logits.device):
        _probs_kernel[(n * n_blk,)](
            *fixed,
            *stats,
            n_cols,
            n_blk,
            inv_t,
            BLOCK=block,
            LEAD=lead,
            WINDOW=window,
            FLOOR=LOGIT_FLOOR,
            num_warps=PROBS_WARPS,
        )
        _repair_kernel[(n,)](
            *fixed, parts[0], shift, bad, n_cols, n_blk, inv_t, BLOCK=block, BLKS=next_pow2(n_blk), FLOOR=LOGIT_FLOOR
        )
    else:
        _probs_torch(*fixed, *stats, n_cols, n_blk, inv_t, BLOCK=block, LEAD=lead, WINDOW=window, FLOOR=LOGIT_FLOOR)
        _repair_torch(*fixed, parts[0], shift, bad, n_cols, n_blk, inv_t, BLOCK=block, BLKS=0, FLOOR=LOGIT_FLOOR)
    return parts, target_logit, shift
