"""`row_stats` lane by lane: rows built to stress its per-lane running statistics, against fp64 torch.

With the shrunk tiles (16-column steps) a 64-column segment gives each lane four columns: the max can arrive late
(each lane rescales its sums), or first (each later column only adds), and V = 145 leaves one valid column in the
row's last step. -inf logits must weigh exactly 0 (not NaN), and a large shared offset must not cancel in the
entropy (each lane keeps its sums relative to its own max).
"""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import triton_ops

V = 145  # 2 full 64-column segments + 17 columns: a step of 16 and a step holding only column 144


def _rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """[9, V] logits in `dtype`, one stressing case per row, and [9] targets at finite logits."""
    g = torch.Generator().manual_seed(7)
    cols = torch.arange(V, dtype=torch.float64)
    rows = [torch.randn(V, generator=g, dtype=torch.float64) * 2 for _ in range(9)]
    rows[1] = cols * 0.01  # rising: every column is its lane's new max
    rows[1][[63, 127]] += 8.0  # and the segment's max in its last column
    rows[2] = -cols * 0.3  # falling: the max comes first
    rows[3] += 1e4  # a large shared offset: exp and entropy must not cancel
    rows[4] -= 1e4
    rows[5][144] = 20.0  # the max alone in the last step's one valid column
    rows[6][64:128] = -torch.inf  # a whole segment of -inf
    rows[6][::5] = -torch.inf
    rows[7][::2] = -1e20  # -inf in fp16
    rows[7][1::4] = -3e4
    logits = torch.stack(rows).to(dtype)
    targets = torch.randint(0, V, (9,), generator=g)
    targets[6], targets[7] = 1, 3  # finite logits of ordinary size
    return logits, targets


def _reference(logits: torch.Tensor, targets: torch.Tensor, inv_t: float) -> tuple[torch.Tensor, ...]:
    # fp64 from the same rounded logits; p * log p is 0 where p = 0 (the -inf columns), not NaN
    z = logits.double() * inv_t
    lse = torch.logsumexp(z, -1)
    logp = z - lse[:, None]
    ent = -torch.where(logp > -torch.inf, logp.exp() * logp, 0.0).sum(-1)
    return logp.gather(1, targets[:, None]).squeeze(1), ent, lse


@pytest.mark.parametrize("inv_t", [1.0, 1 / 0.7])
@pytest.mark.parametrize("segment", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lanes_against_fp64(backend, monkeypatch, segment, dtype, inv_t):
    monkeypatch.setattr(triton_ops, "STATS_SEGMENT", segment)  # 16: one step per program, the default's shape
    logits, targets = _rows(dtype)
    parts, target_logit = triton_ops.row_stats(logits, targets, inv_t)
    logp, ent, lse = (t.double() for t in triton_ops.combine_stats(*parts, target_logit))
    ref_logp, ref_ent, ref_lse = _reference(logits, targets, inv_t)
    # fp32 outputs: log-prob and logsumexp to their rounding at the logits' scale (1e4 / 0.7 in two rows)
    tol = 2e-7 * ref_lse.abs() + 1e-5
    assert ((logp - ref_logp).abs() <= tol).all(), (logp - ref_logp).abs()
    assert ((lse - ref_lse).abs() <= tol).all(), (lse - ref_lse).abs()
    # The entropy holds 1e-5 at T = 1 (a sum not relative to the max loses 4e-4 at the 1e4 offset). Scaled by 1/T,
    # logits round at their scale (ulp 1e-3 at 1.4e4; the twin rounds each, the kernel the segment maxima): 2e-4
    # there, 1.3e-3 for a sum not relative to the max
    ent_tol = 1e-5 + (0.0 if inv_t == 1.0 else 2e-8) * ref_lse.abs()
    assert ((ent - ref_ent).abs() <= ent_tol).all(), (ent - ref_ent).abs()


def test_nan_logit_reaches_the_row(backend):
    # The -inf floor must not swallow NaN: a NaN logit makes its row's statistics NaN, the others stay exact
    logits, targets = _rows(torch.float32)
    logits[0, 70] = torch.nan
    parts, target_logit = triton_ops.row_stats(logits, targets, 1.0)
    _, ent, lse = triton_ops.combine_stats(*parts, target_logit)
    assert lse[0].isnan() and ent[0].isnan()
    assert torch.isfinite(lse[1:]).all() and torch.isfinite(ent[1:]).all()
