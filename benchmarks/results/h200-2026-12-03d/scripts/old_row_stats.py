import triton
import triton.language as tl

@triton.jit
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
):
    # One program per (row, vocab segment): online max / sum-exp / sum exp*(z - max) over the segment
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    inv_t = tl.cast(inv_t, tl.float32)
    row_ptr = logits_ptr + row * stride
    seg_start = seg * SEG
    seg_end = tl.minimum(seg_start + SEG, n_cols)
    m = tl.full((), -float("inf"), tl.float32)
    s = tl.full((), 0.0, tl.float32)
    xs = tl.full((), 0.0, tl.float32)
    # Every step has at least one valid column, so each step's max is finite
    for start in range(seg_start, seg_end, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        valid = cols < seg_end
        z = tl.load(row_ptr + cols, mask=valid, other=0.0).to(tl.float32) * inv_t
        new_m = tl.maximum(m, tl.max(tl.where(valid, z, -float("inf")), axis=0))
        d = tl.where(valid, z - new_m, 0.0)
        e = tl.where(valid, tl.exp(d), 0.0)
        alpha = tl.exp(m - new_m)
        # xs is kept relative to the running max so large logit offsets do not cancel in the entropy
        shift = tl.where(s > 0, m - new_m, 0.0) * s
        xs = alpha * (xs + shift) + tl.sum(e * d, axis=0)
        s = alpha * s + tl.sum(e, axis=0)
        m = new_m
    out = row * n_seg + seg
    tl.store(part_max_ptr + out, m)
    tl.store(part_sum_ptr + out, s)
    tl.store(part_xsum_ptr + out, xs)
    target = tl.load(targets_ptr + row)
    if (target >= seg_start) & (target < seg_end):
        tl.store(target_logit_ptr + row, tl.load(row_ptr + target).to(tl.float32) * inv_t)


