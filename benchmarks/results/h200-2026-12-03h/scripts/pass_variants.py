"""Variants of probs._probs_kernel measured in calls T, U and V (see probs_sweep6.py and interleave.py): each is the
committed kernel with one change, kept as the record of what was timed; none is used by the package."""
import triton.language as tl
from grpo_kernels.triton_ops import floored, jit

LOOSE = ("targets_ptr", "part_max_ptr", "part_sum_ptr", "part_xsum_ptr", "target_logit_ptr", "shift_ptr", "bad_ptr")


@jit(loose=LOOSE)
def _rawfirst_kernel(logits_ptr, stride, targets_ptr, part_max_ptr, part_sum_ptr, part_xsum_ptr, target_logit_ptr,
                     shift_ptr, bad_ptr, n_cols, n_blk, inv_t, BLOCK: tl.constexpr, LEAD: tl.constexpr,
                     WINDOW: tl.constexpr, FLOOR: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_blk
    blk = (pid % n_blk).to(tl.int32)
    row_ptr = logits_ptr + row * stride
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    raw = tl.load(row_ptr + cols, mask=inside, other=-float("inf"))
    inv_t = tl.cast(inv_t, tl.float32)
    target = tl.load(targets_ptr + row)
    z_t = tl.load(row_ptr + target).to(tl.float32) * inv_t
    target = target.to(tl.int32)
    shift = z_t + LEAD
    z = floored(raw, FLOOR) * inv_t
    top = tl.max(z, axis=0)
    good = top - shift <= WINDOW
    ref = tl.where(good, shift, top)
    d = z - ref
    e = tl.exp(d)
    s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
    out = row * n_blk + blk
    tl.store(part_max_ptr + out, ref)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_xsum_ptr + out, x)
    if good:
        tl.store(row_ptr + cols, tl.where(cols == target, raw, e.to(raw.dtype)), mask=inside)
    else:
        tl.store(bad_ptr + row, 1)
    if blk == 0:
        tl.store(target_logit_ptr + row, z_t)
        tl.store(shift_ptr + row, shift)


@jit(loose=LOOSE)
def _given_kernel(logits_ptr, stride, targets_ptr, part_max_ptr, part_sum_ptr, part_xsum_ptr, target_logit_ptr,
                  shift_ptr, bad_ptr, n_cols, n_blk, inv_t, BLOCK: tl.constexpr, LEAD: tl.constexpr,
                  WINDOW: tl.constexpr, FLOOR: tl.constexpr):
    # shift_ptr holds M already (gathered before the launch)
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_blk
    blk = (pid % n_blk).to(tl.int32)
    row_ptr = logits_ptr + row * stride
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    raw = tl.load(row_ptr + cols, mask=inside, other=-float("inf"))
    shift = tl.load(shift_ptr + row)
    target = tl.load(targets_ptr + row).to(tl.int32)
    inv_t = tl.cast(inv_t, tl.float32)
    z = floored(raw, FLOOR) * inv_t
    top = tl.max(z, axis=0)
    good = top - shift <= WINDOW
    ref = tl.where(good, shift, top)
    d = z - ref
    e = tl.exp(d)
    s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
    out = row * n_blk + blk
    tl.store(part_max_ptr + out, ref)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_xsum_ptr + out, x)
    if good:
        tl.store(row_ptr + cols, tl.where(cols == target, raw, e.to(raw.dtype)), mask=inside)
    else:
        tl.store(bad_ptr + row, 1)


@jit(loose=LOOSE)
def _two_kernel(logits_ptr, stride, targets_ptr, part_max_ptr, part_sum_ptr, part_xsum_ptr, target_logit_ptr,
                shift_ptr, bad_ptr, n_cols, n_blk, n_pair, inv_t, BLOCK: tl.constexpr, LEAD: tl.constexpr,
                WINDOW: tl.constexpr, FLOOR: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_pair
    b0 = ((pid % n_pair) * 2).to(tl.int32)
    row_ptr = logits_ptr + row * stride
    c0 = b0 * BLOCK + tl.arange(0, BLOCK)
    c1 = c0 + BLOCK
    in0 = c0 < n_cols
    in1 = c1 < n_cols
    r0 = tl.load(row_ptr + c0, mask=in0, other=-float("inf"))
    r1 = tl.load(row_ptr + c1, mask=in1, other=-float("inf"))
    inv_t = tl.cast(inv_t, tl.float32)
    target = tl.load(targets_ptr + row)
    z_t = tl.load(row_ptr + target).to(tl.float32) * inv_t
    target = target.to(tl.int32)
    shift = z_t + LEAD
    for j in tl.static_range(2):
        raw = r0 if j == 0 else r1
        cols = c0 if j == 0 else c1
        inside = in0 if j == 0 else in1
        blk = b0 + j
        z = floored(raw, FLOOR) * inv_t
        top = tl.max(z, axis=0)
        good = top - shift <= WINDOW
        ref = tl.where(good, shift, top)
        d = z - ref
        e = tl.exp(d)
        s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
        out = row * n_blk + blk
        live = blk < n_blk
        tl.store(part_max_ptr + out, ref, mask=live)
        tl.store(part_sum_ptr + out, s, mask=live)
        tl.store(part_xsum_ptr + out, x, mask=live)
        if good:
            tl.store(row_ptr + cols, tl.where(cols == target, raw, e.to(raw.dtype)), mask=inside)
        else:
            tl.store(bad_ptr + row, 1)
    if b0 == 0:
        tl.store(target_logit_ptr + row, z_t)
        tl.store(shift_ptr + row, shift)


@jit()
def _ls_kernel(logits_ptr, stride, n_cols, n_blk, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_blk
    blk = (pid % n_blk).to(tl.int32)
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    p = logits_ptr + row * stride + cols
    tl.store(p, tl.load(p, mask=inside), mask=inside)




@jit(loose=LOOSE)
def _opt_kernel(logits_ptr, stride, targets_ptr, part_max_ptr, part_sum_ptr, part_xsum_ptr, target_logit_ptr,
                shift_ptr, bad_ptr, n_cols, n_blk, inv_t, BLOCK: tl.constexpr, LEAD: tl.constexpr,
                WINDOW: tl.constexpr, FLOOR: tl.constexpr):
    # Optimistic: exp(z - M) and its sums first, the block max beside them; a block beyond the window (rare) is
    # done again against its own max from a fresh (volatile) load, so no fp32 copy of the block must stay live
    pid = tl.program_id(0).to(tl.int64)
    row = pid // n_blk
    blk = (pid % n_blk).to(tl.int32)
    inv_t = tl.cast(inv_t, tl.float32)
    row_ptr = logits_ptr + row * stride
    target = tl.load(targets_ptr + row)
    z_t = tl.load(row_ptr + target).to(tl.float32) * inv_t
    target = target.to(tl.int32)
    shift = z_t + LEAD
    cols = blk * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    raw = tl.load(row_ptr + cols, mask=inside, other=-float("inf"))
    z = floored(raw, FLOOR) * inv_t
    d = z - shift
    e = tl.exp(d)
    top = tl.max(z, axis=0)
    s, x = tl.split(tl.sum(tl.join(e, e * d), axis=0))
    out = row * n_blk + blk
    good = top - shift <= WINDOW
    if good:
        tl.store(part_max_ptr + out, shift)
        tl.store(part_sum_ptr + out, s)
        tl.store(part_xsum_ptr + out, x)
        tl.store(row_ptr + cols, tl.where(cols == target, raw, e.to(raw.dtype)), mask=inside)
    else:
        z2 = floored(tl.load(row_ptr + cols, mask=inside, other=-float("inf"), volatile=True), FLOOR) * inv_t
        d2 = z2 - top
        e2 = tl.exp(d2)
        s2, x2 = tl.split(tl.sum(tl.join(e2, e2 * d2), axis=0))
        tl.store(part_max_ptr + out, top)
        tl.store(part_sum_ptr + out, s2)
        tl.store(part_xsum_ptr + out, x2)
        tl.store(bad_ptr + row, 1)
    if blk == 0:
        tl.store(target_logit_ptr + row, z_t)
        tl.store(shift_ptr + row, shift)


class Capped:
    """A kernel whose launches carry maxnreg (a register cap: more programs resident per SM)."""

    def __init__(self, kernel, maxnreg):
        self.kernel, self.maxnreg, self.fn = kernel, maxnreg, getattr(kernel, "fn", kernel)

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *a, **k: launch(*a, maxnreg=self.maxnreg, **k)


class Paired:
    """`_two_kernel` behind `_probs_kernel`'s launch: two neighbouring blocks per program (grid and n_pair derived)."""

    def __init__(self, maxnreg=None):
        self.maxnreg = maxnreg

    def __getitem__(self, grid):
        def launch(*a, **k):
            n_blk = a[10]
            n = grid[0] // n_blk
            n_pair = -(-n_blk // 2)
            if self.maxnreg is not None:
                k["maxnreg"] = self.maxnreg
            return _two_kernel[(n * n_pair,)](*a[:11], n_pair, *a[11:], **k)
        return launch
