"""Memory-bound passes over one chunk's logits: Triton kernels, each with a torch twin of the same signature.

The chunk's logits `[n, V]` come from cuBLAS. For scoring, `row_stats` reads them once: per (row, vocab
segment) the running max, sum of exp and the entropy term, plus the target's logit. `finish_rows` (a small
kernel over rows) folds the segments into log-prob, entropy and logsumexp and, for token-level sampling, forms
d(loss)/d(log-prob) in closed form. The loss reads its logits once too, through `probs.probs_pass` (the same
statistics while it writes the unnormalised softmax), whose target column `finish_rows` then fixes up.

The twins run off CUDA (or without Triton); tests also run the Triton kernels on CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import inspect
import os

import torch

from .loss_math import token_level_grad

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - Triton ships with torch on Linux
    HAS_TRITON = False

# Read once at import, as Triton itself does when it decorates the kernels below
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Vocabulary columns per program of `row_stats` (a multiple of its block); one step per program streamed best when
# each step ended in three block reductions (`bench.py --profile`, H200: 16384-column segments in 2048-wide steps
# reached 1.4 TB/s); the lanes' steps now have none, so longer segments are worth timing again
STATS_SEGMENT = 4096
# Columns per loop step of `row_stats`
STATS_BLOCK = 4096
# Raw logits below it (-inf) and masked columns enter `row_stats` as it: its exp against any real logit is exactly
# 0, where -inf would give NaN (inf * 0, -inf + inf), and differences from it times a segment's count stay finite
LOGIT_FLOOR = -1e30
# "torch" or "triton" pins a backend (tests); None: Triton on CUDA, the torch twins elsewhere. On CPU the
# Triton kernels run only when pinned and Triton was imported under TRITON_INTERPRET=1: the interpreter is
# far too slow to be a default. The env var GRPO_KERNELS_BACKEND pins it the same way.
FORCE_BACKEND: str | None = None


def use_triton(device: torch.device) -> bool:
    """Whether to run the Triton kernels on tensors of `device`."""
    forced = FORCE_BACKEND or os.environ.get("GRPO_KERNELS_BACKEND") or None
    if not HAS_TRITON or forced == "torch":
        return False
    if device.type == "cuda":
        return True
    return forced == "triton" and INTERPRET and device.type == "cpu"


def jit(*, loose: tuple[str, ...] | str = (), loose_ints: tuple[str, ...] = ()):
    """triton.jit, compiled once per model: `loose` pointers ("*_ptr": all of them) not specialised on 16-byte
    alignment, `loose_ints` not on divisibility by 16. Both change with a chunk's offset and a last chunk's rows,
    and each new combination compiled the kernel again in a training step (~2.5 s each, `gpu_e2e.sh steps`, H200)."""

    def wrap(fn):
        if not HAS_TRITON:
            return fn
        names = [n for n in inspect.signature(fn).parameters if n.endswith("_ptr")] if loose == "*_ptr" else loose
        return triton.jit(fn, do_not_specialize=loose_ints, do_not_specialize_on_alignment=names)

    return wrap


@jit()
def floored(raw, FLOOR: tl.constexpr):
    # Raw logits in fp32, -inf at FLOOR; NaN stays NaN and reaches the row's stats
    return tl.maximum(raw.to(tl.float32), FLOOR, propagate_nan=tl.PropagateNan.ALL)


@jit()
def load_floored(ptrs, mask, FLOOR: tl.constexpr):
    # [BLOCK] raw logits in fp32, masked columns and -inf at FLOOR (`floored`)
    return floored(tl.load(ptrs, mask=mask, other=-float("inf")), FLOOR)


@jit(loose=("targets_ptr", "part_max_ptr", "part_sum_ptr", "part_xsum_ptr", "target_logit_ptr"))
def _row_stats_kernel(
    logits_ptr,
    stride,
    targets_ptr,
    part_max_ptr,
    part_sum_ptr,
    part_xsum_ptr,
    target_logit_ptr,
    n_cols,
    n_seg,
    inv_t,
    SEG: tl.constexpr,
    BLOCK: tl.constexpr,
    FLOOR: tl.constexpr,
):
    # One program per (row, vocab segment). Each of the BLOCK lanes keeps, over the raw logits z it sees, its max
    # m, s = sum e and x = sum e * (z - m) with e = exp((z - m) / T): the loop's steps need one exp per column and
    # no cross-lane reduction; the lanes are folded once at the end. exp(y / T) = exp2(y * c), c = log2(e) / T:
    # the one multiply per column that 1/T costs anyway. A lane starts with one column (s = 1, x = 0); columns at
    # FLOOR (masked, -inf) add exp2((FLOOR - m) * c) = 0 exactly, where -inf would give inf * 0 = NaN.
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    inv_t = tl.cast(inv_t, tl.float32)
    c = inv_t * 1.4426950408889634  # log2(e) / T
    row_ptr = logits_ptr + row * stride
    seg_start = seg * SEG
    seg_end = tl.minimum(seg_start + SEG, n_cols)
    cols = seg_start + tl.arange(0, BLOCK)
    m = load_floored(row_ptr + cols, cols < seg_end, FLOOR)  # [BLOCK]
    s = tl.full((BLOCK,), 1.0, tl.float32)
    x = tl.zeros((BLOCK,), tl.float32)
    if SEG > BLOCK:  # compile-time: one-step segments have no loop, and s = 1, x = 0 fold into the sums below
        for start in range(seg_start + BLOCK, seg_end, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            z = load_floored(row_ptr + cols, cols < seg_end, FLOOR)
            d = z - m
            e = tl.exp2(-tl.abs(d) * c)
            up = d > 0  # z is the lane's new max: its old sums scale by e, and x shifts by -d per column
            x = tl.where(up, e * (x - d * s), x + e * d)
            s = tl.where(up, e * s + 1.0, s + e)
            m = tl.maximum(m, z)
    top = tl.max(m, axis=0)
    d = m - top
    a = tl.exp2(d * c)
    sum_exp, sum_xexp = tl.split(tl.sum(tl.join(a * s, a * (x + d * s)), axis=0))  # one tree for both sums
    out = row * n_seg + seg
    tl.store(part_max_ptr + out, top * inv_t)
    tl.store(part_sum_ptr + out, sum_exp)
    tl.store(part_xsum_ptr + out, sum_xexp * inv_t)
    target = tl.load(targets_ptr + row)
    if (target >= seg_start) & (target < seg_end):
        tl.store(target_logit_ptr + row, tl.load(row_ptr + target).to(tl.float32) * inv_t)


if HAS_TRITON and not INTERPRET:
    # Warps per program tuned once per vocabulary width: the best count moved with each change of the kernel
    # (8 warps were best with three block reductions per step: ~2.1 TB/s on an H200, `bench.py --profile`)
    _row_stats_tuned = triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (2, 4, 8, 16)], key=["n_cols"])(
        _row_stats_kernel
    )


def _row_stats_torch(
    logits, stride, targets, part_max, part_sum, part_xsum, target_logit, n_cols, n_seg, inv_t, SEG, BLOCK, FLOOR
):
    # `_row_stats_kernel` in torch: each segment at once instead of BLOCK-wide steps
    del stride, BLOCK
    for seg in range(n_seg):
        z = logits[:, seg * SEG : min((seg + 1) * SEG, n_cols)].to(part_max.dtype).clamp(min=FLOOR) * inv_t
        m = z.amax(-1)
        d = z - m.unsqueeze(-1)
        e = torch.exp(d)
        part_max[:, seg] = m
        part_sum[:, seg] = e.sum(-1)
        part_xsum[:, seg] = (e * d).sum(-1)
    target_logit.copy_(logits.gather(1, targets.unsqueeze(1)).squeeze(1).to(target_logit.dtype) * inv_t)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton's block shapes are powers of two."""
    return 1 << max(0, (n - 1).bit_length())


@jit(loose="*_ptr", loose_ints=("n_rows",))  # one value per row, read in small tiles: alignment buys nothing
def _finish_rows_kernel(
    part_max_ptr,
    part_sum_ptr,
    part_xsum_ptr,
    target_logit_ptr,
    n_rows,
    n_seg,
    logp_ptr,
    ent_ptr,
    lse_ptr,
    grad_ptr,
    old_ptr,
    ref_ptr,
    adv_ptr,
    w_ptr,
    beta,
    lo,
    hi,
    tile_ptr,
    tile_stride,
    ids_ptr,
    shift_ptr,
    fix_scale,
    HAS_GRAD: tl.constexpr,
    FIX: tl.constexpr,
    HAS_OLD: tl.constexpr,
    HAS_REF: tl.constexpr,
    ROWS: tl.constexpr,
    SEGS: tl.constexpr,
):
    # ROWS rows per program: fold the [ROWS, n_seg] partials, then (HAS_GRAD) d(loss)/d(log-prob) in closed
    # form, the formula of `loss_math.token_level_grad`
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < n_rows
    cols = tl.arange(0, SEGS)
    mask2 = rmask[:, None] & (cols < n_seg)[None, :]
    offs = rows[:, None] * n_seg + cols[None, :]
    pm = tl.load(part_max_ptr + offs, mask=mask2, other=-float("inf"))
    ps = tl.load(part_sum_ptr + offs, mask=mask2, other=0.0)
    px = tl.load(part_xsum_ptr + offs, mask=mask2, other=0.0)
    m = tl.where(rmask, tl.max(pm, axis=1), 0.0)
    d = tl.where(mask2, pm - m[:, None], 0.0)
    a = tl.where(mask2, tl.exp(d), 0.0)
    s = tl.where(rmask, tl.sum(a * ps, axis=1), 1.0)
    xs = tl.sum(a * (px + d * ps), axis=1)
    log_s = tl.log(s)
    lse = m + log_s
    z_t = tl.load(target_logit_ptr + rows, mask=rmask, other=0.0)
    lp = z_t - lse
    tl.store(logp_ptr + rows, lp, mask=rmask)
    tl.store(ent_ptr + rows, log_s - xs / s, mask=rmask)
    tl.store(lse_ptr + rows, lse, mask=rmask)
    if HAS_GRAD:
        lo = tl.cast(lo, tl.float32)
        hi = tl.cast(hi, tl.float32)
        adv = tl.load(adv_ptr + rows, mask=rmask, other=0.0)
        if HAS_OLD:
            ratio = tl.exp(lp - tl.load(old_ptr + rows, mask=rmask, other=0.0))
        else:
            ratio = tl.exp(lp - lp)  # on-policy: exactly 1, as exp(logp - logp.detach())
        u = ratio * adv
        c = tl.minimum(tl.maximum(ratio, lo), hi) * adv
        inside = ((ratio >= lo) & (ratio <= hi)).to(tl.float32)
        tie = 0.5 * (u == c).to(tl.float32)
        take_u = (u < c).to(tl.float32) + tie
        take_c = (u > c).to(tl.float32) + tie
        g = -(take_u + take_c * inside) * adv * ratio
        if HAS_REF:
            g += tl.cast(beta, tl.float32) * (1 - tl.exp(tl.load(ref_ptr + rows, mask=rmask, other=0.0) - lp))
        g = g * tl.load(w_ptr + rows, mask=rmask, other=0.0)
        tl.store(grad_ptr + rows, g, mask=rmask)
    if FIX:  # the probs pass's target column: exp(z_t - M) - S in fp32 (S against M: exp(m - M) * s)
        up = tl.exp(m - tl.load(shift_ptr + rows, mask=rmask, other=0.0))
        at = tile_ptr + rows * tile_stride + tl.load(ids_ptr + rows, mask=rmask, other=0)
        tl.store(at, ((tl.exp(z_t - m) - s) * up).to(tile_ptr.dtype.element_ty), mask=rmask)
        coef = 1 / (s * up)  # M -> 1 / S, or with the gradient the row's coefficient c = g * scale / S
        if HAS_GRAD:
            coef = coef * g * tl.cast(fix_scale, tl.float32)
        tl.store(shift_ptr + rows, coef, mask=rmask)


def combine_stats(
    part_max: torch.Tensor, part_sum: torch.Tensor, part_xsum: torch.Tensor, target_logit: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold per-segment statistics [n, n_seg] into (log-prob, entropy, logsumexp) per row, in torch."""
    m, s, xs = _fold(part_max, part_sum, part_xsum)
    log_s = torch.log(s)
    lse = m + log_s
    return target_logit - lse, log_s - xs / s, lse


def _fold(
    part_max: torch.Tensor, part_sum: torch.Tensor, part_xsum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Per row: the max m of the segments' maxima and the sums of exp and of the entropy term against it
    m = part_max.amax(1, keepdim=True)
    a = torch.exp(part_max - m)
    return m.squeeze(1), (a * part_sum).sum(1), (a * (part_xsum + (part_max - m) * part_sum)).sum(1)


def _finish_rows_torch(*args, HAS_GRAD, FIX, HAS_OLD, HAS_REF, ROWS, SEGS):
    # `_finish_rows_kernel` in torch (its positional arguments), sharing the loss math's closed-form gradient
    part_max, part_sum, part_xsum, target_logit, _, _, logp, ent, lse, grad, old, ref, adv, w, beta, lo, hi = args[:17]
    tile, _, ids, shift, fix_scale = args[17:]
    del ROWS, SEGS
    out = combine_stats(part_max, part_sum, part_xsum, target_logit)
    for dst, src in zip((logp, ent, lse), out):
        dst.copy_(src)
    if HAS_GRAD:
        grad.copy_(
            token_level_grad(
                logp,
                old if HAS_OLD else None,
                ref if HAS_REF else None,
                adv,
                w,
                beta=beta if HAS_REF else 0.0,
                epsilon_low=1 - lo,
                epsilon_high=hi - 1,
            )
        )
    if FIX:
        m, s, _ = _fold(part_max, part_sum, part_xsum)
        up = torch.exp(m - shift)
        tile.scatter_(1, ids.unsqueeze(1), ((torch.exp(target_logit - m) - s) * up).to(tile.dtype).unsqueeze(1))
        shift.copy_(1 / (s * up) * (grad * fix_scale if HAS_GRAD else 1))


def stats_buffers(n: int, n_cols: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty `row_stats` outputs for n rows of n_cols columns ([3, n, n_seg], [n]: fp32, fp64 for fp64): one pair
    can serve a whole call, each chunk writing its rows' slices (`row_stats(..., out=...)`)."""
    kw = dict(device=device, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    return torch.empty((3, n, _stats_geometry(n_cols)[2]), **kw), torch.empty((n,), **kw)


def row_stats(
    logits: torch.Tensor,
    targets: torch.Tensor,
    inv_t: float,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(row, vocab segment) statistics of `logits * inv_t` and each row's target logit.

    Args:
        logits: [n, V] chunk of logits (row stride may exceed V).
        targets: [n] int64 target ids in [0, V).
        inv_t: 1 / temperature.
        out: ([3, n, n_seg], [n]) to write into (each parts[i] contiguous), e.g. slices of `stats_buffers`.

    Returns:
        ([3, n, n_seg] running max / sum of exp / sum of exp * (z - max), [n] scaled target logits),
        fp32 (fp64 for fp64 logits).
    """
    n, n_cols = logits.shape
    block, seg, n_seg = _stats_geometry(n_cols)
    parts, target_logit = out if out is not None else stats_buffers(n, n_cols, logits.dtype, logits.device)
    args = (logits, logits.stride(0), targets, parts[0], parts[1], parts[2], target_logit, n_cols, n_seg, inv_t)
    shape = dict(SEG=seg, BLOCK=block, FLOOR=LOGIT_FLOOR)
    if not use_triton(logits.device):
        _row_stats_torch(*args, **shape)
    elif INTERPRET:
        _row_stats_kernel[(n, n_seg)](*args, **shape)
    else:
        _row_stats_tuned[(n, n_seg)](*args, **shape)
    return parts, target_logit


def _stats_geometry(n_cols: int) -> tuple[int, int, int]:
    # (columns per loop step, columns per program, programs per row) of `row_stats` for a row of n_cols
    block = min(STATS_BLOCK, next_pow2(n_cols))
    seg = max(block, STATS_SEGMENT // block * block)
    return block, seg, -(-n_cols // seg)


def finish_rows(
    parts: torch.Tensor,
    target_logit: torch.Tensor,
    grad_inputs: dict | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    fix: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-prob, entropy, logsumexp per row and, given `grad_inputs`, d(loss)/d(log-prob).

    Args:
        parts, target_logit: from `row_stats`, or from `probs.probs_pass` with `fix`.
        grad_inputs: for token-level sampling: old (or None), ref (or None), adv, w ([n] each) and
            beta, epsilon_low, epsilon_high; None for no gradient.
        out: contiguous [n] tensors of parts' dtype for the log-probs and entropies; None: new ones.
        fix: (tile, ids, shift, scale) of `probs.probs_pass` and -1/T: tile[i, ids[i]] = exp(z_t - M_i) - S_i is
            written, and shift becomes the tile's row scale: 1 / S_i, or with `grad_inputs` c_i = -g_i / (T S_i),
            so that d(loss)/d(logits) = c * tile (from the fp32 sums: exp(M - lse) would lose the logits'
            rounding at their scale).

    Returns:
        ([n] log-probs, [n] entropies, [n] logsumexp, [n] gradient or None).
    """
    _, n, n_seg = parts.shape
    # logsumexp and, with grad_inputs, the gradient; the log-probs and entropies in `out` or new
    lse_grad = torch.empty((2 if grad_inputs else 1, n), device=parts.device, dtype=parts.dtype)
    logp, ent = out if out is not None else torch.empty((2, n), device=parts.device, dtype=parts.dtype)
    gi = grad_inputs or {}
    dummy = lse_grad[0]
    old, ref = gi.get("old"), gi.get("ref")
    beta = gi.get("beta", 0.0)
    has_ref = ref is not None and beta != 0.0
    args = (
        parts[0],
        parts[1],
        parts[2],
        target_logit,
        n,
        n_seg,
        logp,
        ent,
        lse_grad[0],
        lse_grad[1] if grad_inputs else dummy,
        dummy if old is None else old,
        ref if has_ref else dummy,
        gi.get("adv", dummy),
        gi.get("w", dummy),
        beta,
        1 - gi.get("epsilon_low", 0.2),
        1 + gi.get("epsilon_high", 0.2),
        *((fix[0], fix[0].stride(0), *fix[1:]) if fix else (dummy, 0, dummy, dummy, 0.0)),
    )
    flags = dict(HAS_GRAD=bool(grad_inputs), FIX=fix is not None, HAS_OLD=old is not None, HAS_REF=has_ref)
    segs = min(1 << 20, next_pow2(n_seg))
    # 16 rows per program: 96 programs for a 1,536-row chunk (64 rows: 24 programs, 32 us a chunk, `bench.py --profile`)
    rows = max(1, min(16, 4096 // segs))
    if use_triton(parts.device):
        _finish_rows_kernel[(-(-n // rows),)](*args, **flags, ROWS=rows, SEGS=segs, num_warps=4)
    else:
        _finish_rows_torch(*args, **flags, ROWS=rows, SEGS=segs)
    return logp, ent, lse_grad[0], (lse_grad[1] if grad_inputs else None)
