"""`probs.probs_pass` + `finish_rows(fix=...)`: the loss's one read of each chunk, against fp64 torch.

After them, -(1 / (T S)) * tile must be d(log p_target)/d(logits) = (onehot - softmax) / T, with S = exp(lse - M),
and the statistics must be `row_stats`'. The rows stress the shift M = z_target + LEAD: a target far below its
row's max (the row is left raw by the pass and repaired: one block or all), the target as the max, -inf logits, a
large shared offset, a NaN. With the shrunk tiles (32-column blocks) V = 145 gives 5 blocks, the last of 17.
"""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import probs, triton_ops

V = 145


def _rows(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """[10, V] logits, [10] targets, and the rows whose target is too far below the max for the shift."""
    g = torch.Generator().manual_seed(11)
    lead, window = probs.WINDOWS.get(dtype, probs.DEFAULT_WINDOW)
    rows = [torch.randn(V, generator=g, dtype=torch.float64) * 2 for _ in range(10)]
    targets = torch.randint(0, V, (10,), generator=g)
    far = lead + window + 3  # beyond the window
    rows[1][targets[1]] = rows[1].max() + 1  # the target is the max
    rows[2][70] = rows[2][targets[2]] + far  # one block beyond the window: repaired
    rows[3] += far * (torch.arange(V) % 3 == 0)  # blocks everywhere beyond it (a third of the columns)
    rows[3][targets[3]] -= far * (targets[3] % 3 == 0)
    rows[4] += 1e4  # a large shared offset
    rows[5][::4] = -torch.inf  # -inf columns, one block all -inf
    rows[5][96:128] = -torch.inf
    rows[5][targets[5]] = 0.5
    rows[6][targets[6]] = rows[6].max() + far + 5  # the target far above the rest: every p tiny but its own
    rows[7][144] = rows[7][targets[7]] + far  # the max alone in the last block's last column
    targets[8] = 144  # the target in the last, short block
    logits = torch.stack(rows).to(dtype)
    return logits, targets, [2, 3, 7]


def _reference(logits: torch.Tensor, targets: torch.Tensor, inv_t: float) -> tuple[torch.Tensor, ...]:
    z = logits.double() * inv_t
    lse = torch.logsumexp(z, -1)
    logp = z - lse[:, None]
    ent = -torch.where(logp > -torch.inf, logp.exp() * logp, 0.0).sum(-1)
    onehot = torch.nn.functional.one_hot(targets, logits.shape[1]).double()
    return logp.gather(1, targets[:, None]).squeeze(1), ent, lse, (onehot - logp.exp()) * inv_t


@pytest.mark.parametrize("inv_t", [1.0, 1 / 0.7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_probs_pass_against_fp64(backend, dtype, inv_t):
    logits, targets, far_rows = _rows(dtype)
    if dtype == torch.float16:
        logits[4] -= 1e4  # fp16 stops at 65504; the offset is covered in fp32
    ref_logp, ref_ent, ref_lse, ref_grad = _reference(logits, targets, inv_t)
    tile = logits.clone()
    bad = torch.zeros(12, dtype=torch.int32)  # larger than the chunk, as the loop's buffer
    parts, target_logit, shift = probs.probs_pass(tile, targets, inv_t, bad)
    assert (bad == 0).all(), "the repair leaves its scratch zero for the next chunk"
    lead, _ = probs.WINDOWS.get(dtype, probs.DEFAULT_WINDOW)
    z_t = logits.double().gather(1, targets[:, None]).squeeze(1) * inv_t
    repaired = (shift.double() - (z_t + lead)).abs() > 1e-3 * (1 + z_t.abs())
    assert repaired.nonzero().squeeze(1).tolist() == far_rows  # only those rows took the repair
    logp, ent, lse, _ = triton_ops.finish_rows(parts, target_logit, fix=(tile, targets, shift, -inv_t))
    tol = 2e-7 * ref_lse.abs() + 1e-5
    assert ((logp.double() - ref_logp).abs() <= tol).all(), (logp.double() - ref_logp).abs()
    assert ((lse.double() - ref_lse).abs() <= tol).all(), (lse.double() - ref_lse).abs()
    assert ((ent.double() - ref_ent).abs() <= 1e-5 + 2e-8 * ref_lse.abs()).all(), (ent.double() - ref_ent).abs()
    # The gradient the chunk loop forms: c * tile with c = -1 / (T S); finish_rows left 1 / S in `shift`
    grad = -tile.double() * (shift.double() * inv_t).unsqueeze(1)
    # To the tile's rounding (fp16: 11 bits) of values up to 1 / T; and scaled by 1 / T, each logit rounds at its
    # scale in fp32 (ulp 1e-3 at 1.4e4), which moves p by that relative amount (the two-pass path did the same)
    atol = (1e-6 if dtype == torch.float32 else 2e-3) * inv_t
    scale_err = (
        0.0 if inv_t == 1.0 else 4 * 2**-23 * logits.double().nan_to_num(neginf=0).abs().amax(1, keepdim=True) * inv_t
    )
    assert torch.isfinite(grad).all()
    assert ((grad - ref_grad).abs() <= atol + scale_err * ref_grad.abs()).all(), (grad - ref_grad).abs().amax(1)


def test_target_near_certain_keeps_its_gradient(backend):
    # p_target = 1 - 1e-4: its gradient (1 - p) must not vanish in the tile's rounding (written from fp32)
    logits = torch.zeros(3, V)
    targets = torch.tensor([0, 50, 144])
    logits[torch.arange(3), targets] = torch.log(torch.tensor((1 - 1e-4) / 1e-4 * (V - 1)))
    ref_grad = _reference(logits, targets, 1.0)[3]
    tile = logits.clone()
    parts, target_logit, shift = probs.probs_pass(tile, targets, 1.0, torch.zeros(3, dtype=torch.int32))
    triton_ops.finish_rows(parts, target_logit, fix=(tile, targets, shift, -1.0))
    grad = -tile.double() * shift.double().unsqueeze(1)
    at_t = grad[torch.arange(3), targets]
    torch.testing.assert_close(at_t, ref_grad[torch.arange(3), targets], rtol=1e-3, atol=0)


def test_nan_logit_reaches_the_row(backend):
    logits, targets, _ = _rows(torch.float32)
    logits[0, 70] = torch.nan
    parts, target_logit, shift = probs.probs_pass(logits, targets, 1.0, torch.zeros(10, dtype=torch.int32))
    _, ent, lse, _ = triton_ops.finish_rows(parts, target_logit, fix=(logits, targets, shift, -1.0))
    assert lse[0].isnan() and ent[0].isnan()
    assert torch.isfinite(lse[1:]).all() and torch.isfinite(ent[1:]).all()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_loss_with_improbable_targets_matches_reference(backend, make_inputs, level):
    # Logits spread over hundreds of nats and every other target the row's least likely token: those rows are
    # beyond the shift's window and go through the repair inside the loss; loss and gradients still match
    from test_numerics import FP32_GRAD_COS, FP32_LOSS_RTOL, compare

    inp = make_inputs(B=3, T=6, H=16, V=150, bias=False)
    inp["weight"] = inp["weight"] * 40
    with torch.no_grad():
        worst = torch.einsum("bth,vh->btv", inp["hidden"], inp["weight"]).argmin(-1)
    inp["ids"] = torch.where(torch.arange(6) % 2 == 0, worst, inp["ids"])
    inp["ref"] = None
    compare(
        inp, torch.float32, FP32_LOSS_RTOL, FP32_GRAD_COS, chunk_tokens=5, beta=0.0, importance_sampling_level=level
    )
