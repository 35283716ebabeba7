"""The decoder's token choice in one pass over the logits: a draw from softmax(logits / T) (or the argmax) and the
chosen token's log-prob under softmax(logits / T).

The torch path (`grpo_tui.train.sampling`) makes an fp32 copy of the [R, V] logits, a softmax, a tensor of
exponential noise and a separate logsumexp: at 128 rows and Qwen3's 151,936 tokens, 185 us of a decode step on
the H100, longer than the step's lm_head GEMM (`benchmarks/results/decode-fused-h100/`). Here each program reads
one slice of a row once, in the logits' own dtype. Every lane keeps its own running max, sum of exp and best key
(one exp2 per column, no reduction per block: a version that reduced each 1,024-column block took 131 us a step,
bound by the reductions' latency), the lanes meet once at the end of the slice, and a second small kernel merges
the slices of each row. Everything runs in base 2 (exp2, log2: the fast approximate instructions).

The draw is Gumbel-max: argmax_v (x_v - log E_v) with E_v = -log U_v ~ Exp(1), the exponential race
torch.multinomial runs for one sample (argmax p_v / E_v), so the choice follows softmax(x) exactly. U comes from
Triton's Philox counter at (seed, decode step, row, column): the seed and the step are device tensors the kernel
reads, so a CUDA graph that captured it draws anew at every replay, and one seed gives the same tokens again.
Each Philox call gives four uniforms, used for four columns a quarter of the slice apart.
"""

from __future__ import annotations

import torch

from .triton_ops import HAS_TRITON, next_pow2, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl
    from triton.language.random import uint_to_uniform_float

# Columns of one loop step of a program: four blocks of a quarter each, one Philox call for the four
QUARTER = 1024
# Slices per row: enough programs to fill the GPU at a few dozen rows
SPLITS = 8
NUM_WARPS = 8
# Rows of one step's Philox counters (2**20): with vocabularies below 2**24 the counter of step t stays below 2**64
# for t < 2**20 decode steps
ROW_BITS = 20
LOG2E = 1.4426950408889634

if HAS_TRITON:

    @triton.jit
    def _fold(base, c, bits, hi, scale, m, s, best_key, best_col, best_x, GREEDY: tl.constexpr):
        # Columns c into each lane's running state, elementwise (no reduction per block): the max m and the sum s
        # of exp2(x - m) of x = logits * log2(e) / T, and the best key so far with its column and x. A lane sees
        # its columns in increasing order, so a strict > keeps the first of equal keys.
        valid = c < hi
        raw = tl.load(base + c, mask=valid, other=-float("inf")).to(tl.float32)
        x = raw * scale
        d = x - m
        bigger = d > 0
        e = tl.where(x == -float("inf"), 0.0, tl.exp2(-tl.abs(d)))  # -inf against -inf: NaN, kept out
        s = tl.where(bigger, s * e + 1.0, s + e)
        m = tl.where(bigger, x, m)
        if GREEDY:
            key = raw  # the argmax of the logits themselves, as torch's
        else:
            # Gumbel in base 2: -log2(-log2 u) is the Gumbel draw over ln 2 plus a constant, so the argmax of
            # x + it is softmax's draw. u = 0 gives a key of -inf
            key = x - tl.log2(-tl.log2(uint_to_uniform_float(bits)))
        key = tl.where(valid, key, -float("inf"))
        better = key > best_key
        best_key = tl.where(better, key, best_key)
        best_col = tl.where(better, c, best_col)
        best_x = tl.where(better, x, best_x)
        return m, s, best_key, best_col, best_x

    @triton.jit
    def _token_slices_kernel(
        logits_ptr,
        stride_r,
        vocab,
        slice_cols,
        seed_ptr,
        step_ptr,
        scale,
        part_ptr,
        ROW_BITS: tl.constexpr,
        QUARTER: tl.constexpr,
        GREEDY: tl.constexpr,
    ):
        # Program (row, slice): columns [slice * slice_cols, ...) of the row; partials (m, s, key, col, x) per slice,
        # in base-2 units
        row = tl.program_id(0).to(tl.int64)
        part = tl.program_id(1)
        parts = tl.num_programs(1)
        lo = part * slice_cols
        hi = tl.minimum(lo + slice_cols, vocab)
        seed = tl.load(seed_ptr)
        # This row's Philox counters at this decode step: rows apart by a fixed stride, so that a step on fewer
        # rows (a compacted bucket) never reuses an earlier step's
        counter = ((tl.load(step_ptr) << ROW_BITS) + row) * vocab
        q = tl.arange(0, QUARTER)
        m = tl.full((QUARTER,), -float("inf"), tl.float32)
        s = tl.zeros((QUARTER,), tl.float32)
        best_key = tl.full((QUARTER,), -float("inf"), tl.float32)
        best_col = tl.zeros((QUARTER,), tl.int32)
        best_x = tl.full((QUARTER,), -float("inf"), tl.float32)
        base = logits_ptr + row * stride_r
        for start in range(lo, hi, 4 * QUARTER):
            c0 = start + q
            r0, r1, r2, r3 = tl.randint4x(seed, counter + c0)
            m, s, best_key, best_col, best_x = _fold(base, c0, r0, hi, scale, m, s, best_key, best_col, best_x, GREEDY)
            c1 = c0 + QUARTER
            m, s, best_key, best_col, best_x = _fold(base, c1, r1, hi, scale, m, s, best_key, best_col, best_x, GREEDY)
            c2 = c1 + QUARTER
            m, s, best_key, best_col, best_x = _fold(base, c2, r2, hi, scale, m, s, best_key, best_col, best_x, GREEDY)
            c3 = c2 + QUARTER
            m, s, best_key, best_col, best_x = _fold(base, c3, r3, hi, scale, m, s, best_key, best_col, best_x, GREEDY)
        # The lanes into the slice's partials
        top_m = tl.max(m, 0)
        safe = tl.where(top_m == -float("inf"), 0.0, top_m)
        total = tl.sum(tl.where(m > -float("inf"), s * tl.exp2(m - safe), 0.0), 0)
        top = tl.max(best_key, 0)
        col = tl.min(tl.where(best_key == top, best_col, vocab), 0)  # the first column of the best key
        x_at = tl.max(tl.where(best_col == col, best_x, -float("inf")), 0)
        out = part_ptr + (row * parts + part) * 5
        tl.store(out, top_m)
        tl.store(out + 1, total)
        tl.store(out + 2, top)
        tl.store(out + 3, col.to(tl.float32))  # exact: vocabularies stay below 2**24
        tl.store(out + 4, x_at)

    @triton.jit
    def _token_pick_kernel(part_ptr, parts, token_ptr, logp_ptr, PARTS_PAD: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        p = tl.arange(0, PARTS_PAD)
        ok = p < parts
        at = part_ptr + (row * parts + p) * 5
        m = tl.load(at, mask=ok, other=-float("inf"))
        s = tl.load(at + 1, mask=ok, other=0.0)
        key = tl.load(at + 2, mask=ok, other=-float("inf"))
        col = tl.load(at + 3, mask=ok, other=0.0)
        x = tl.load(at + 4, mask=ok, other=0.0)
        top = tl.max(m, 0)
        total = tl.sum(tl.where(m > -float("inf"), s * tl.exp2(m - top), 0.0), 0)
        best = tl.argmax(key, 0)  # the first slice holding the best key: the lowest column, as argmax keeps ties
        pick = p == best
        tl.store(token_ptr + row, tl.sum(tl.where(pick, col, 0.0), 0).to(tl.int64))
        # log_softmax at the token, back from base 2
        tl.store(logp_ptr + row, (tl.sum(tl.where(pick, x, 0.0), 0) - top - tl.log2(total)) * 0.6931471805599453)


@torch.library.custom_op("grpo_kernels::choose_tokens", mutates_args=())
def _choose_op(
    logits: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, temperature: float, greedy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, vocab = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    slice_cols = -(-vocab // SPLITS)
    parts = -(-vocab // slice_cols)
    partials = torch.empty((rows, parts, 5), device=logits.device, dtype=torch.float32)
    token = torch.empty(rows, device=logits.device, dtype=torch.long)
    logp = torch.empty(rows, device=logits.device, dtype=torch.float32)
    _token_slices_kernel[(rows, parts)](
        logits,
        logits.stride(0),
        vocab,
        slice_cols,
        seed,
        step,
        LOG2E / float(temperature),
        partials,
        ROW_BITS=ROW_BITS,
        QUARTER=QUARTER,
        GREEDY=greedy,
        num_warps=NUM_WARPS,
    )
    _token_pick_kernel[(rows,)](partials, parts, token, logp, PARTS_PAD=next_pow2(parts), num_warps=1)
    return token, logp


@_choose_op.register_fake
def _(logits, seed, step, temperature, greedy):
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.long), logits.new_empty(rows, dtype=torch.float32)


def runs_on(device: torch.device) -> bool:
    """Whether the kernel runs on tensors of `device` (CUDA, or the interpreter where forced)."""
    return HAS_TRITON and use_triton(device)


def supports(logits: torch.Tensor) -> bool:
    """Whether `choose_tokens` runs the kernel on these logits."""
    return runs_on(logits.device) and logits.dim() == 2 and logits.size(-1) < 2**24


def choose_tokens(
    logits: torch.Tensor, seed: torch.Tensor, step: torch.Tensor, temperature: float = 1.0, greedy: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [R] int64, log-prob [R] fp32) per row of logits [R, V] (any float dtype): greedy, the argmax (the
    first on ties); else a draw from softmax(logits / temperature) with the Philox counters of (seed [1] int64,
    step [1] int64). The log-prob is log_softmax(logits / temperature) at the token, in fp32."""
    if not supports(logits) or logits.size(0) > 2**ROW_BITS:
        raise ValueError(
            f"choose_tokens: [R, V] logits (R <= {2**ROW_BITS}, V < 2**24) on a device the kernel runs on, got "
            f"{tuple(logits.shape)} on {logits.device}"
        )
    if not temperature > 0:
        raise ValueError(f"choose_tokens: temperature must be > 0, got {temperature}")
    return _choose_op(logits, seed, step, float(temperature), bool(greedy))
