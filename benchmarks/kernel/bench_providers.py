"""The benchmark's providers: the same GRPO head computed by each implementation, on the same inputs.

floor (the 3 GEMMs over the valid tokens), naive (materialised logits + autograd), trl (TRL 1.16's
ChunkedLogProbFunction on the valid rows, as its trainer calls it, + the GRPO loss math), liger
(LigerFusedLinearGRPOLoss), chunked (ours) and chunked-lean; `loss_fn` for loss + backward, `score_fn` for scoring.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grpo_kernels.functional import fused_linear_grpo_loss, selective_logprobs
from grpo_kernels.loss_math import per_token_loss, token_weights
from grpo_kernels.reference import reference_grpo_loss, reference_logprobs

PROVIDERS = ("floor", "naive", "trl", "liger", "chunked", "chunked-lean")
MIB = 2**20


def make_inputs(batch: int, seq: int, hidden: int, vocab: int, seed: int = 0, device: str = "cuda") -> dict:
    """bf16 GRPO inputs (on CUDA unless `device`) with a Qwen3-0.6B-like head scale (random, never zeros)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(batch, seq, hidden, device=device, generator=g).bfloat16()
    w = (torch.randn(vocab, hidden, device=device, generator=g) * 0.05).bfloat16()
    ids = torch.randint(0, vocab, (batch, seq), device=device, generator=g)
    mask = torch.ones(batch, seq, device=device, dtype=torch.int64)
    adv = torch.randn(batch, device=device, generator=g)
    ref = -torch.rand(batch, seq, device=device, generator=g) * 5 - 8  # near log(1/V)
    return dict(hidden=h.requires_grad_(), weight=w.requires_grad_(), ids=ids, mask=mask, adv=adv, ref=ref)


def _trl_head(inp: dict) -> tuple[torch.Tensor, ...]:
    # What TRL 1.16's fused head does in its trainer (`add_fused_lm_head`): labels -100 at padding, only the
    # valid rows (`hidden[mask]`, a host sync) through ChunkedLogProbFunction, outputs scattered back
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    labels = inp["ids"].masked_fill(inp["mask"] == 0, -100)
    valid = labels != -100
    per_token = ChunkedLogProbFunction.apply(
        inp["hidden"][valid],
        inp["weight"],
        None,
        labels[valid],
        1.0,
        _CHUNKED_LOGPROB_CHUNK_SIZE,
        None,
        1.0,
        ("entropy",),
    )
    return tuple(None if x is None else x.new_zeros(valid.shape).masked_scatter(valid, x) for x in per_token[:2])


def _trl_fn(inp: dict, beta: float) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        logps, _ent = _trl_head(inp)
        loss_tok, _ = per_token_loss(
            logps,
            None,
            inp["ref"],
            inp["adv"].unsqueeze(1),
            inp["mask"],
            beta=beta,
            epsilon_low=0.2,
            epsilon_high=0.2,
            importance_sampling_level="token",
        )
        w = token_weights(inp["mask"], "dapo", max_completion_length=None, num_items_in_batch=None, dtype=logps.dtype)
        return (loss_tok * w).sum()

    return run


def _liger_fn(inp: dict, beta: float) -> Callable[[], torch.Tensor]:
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

    torch._dynamo.reset()  # Liger's compiled chunk fails its guards on a new shape otherwise
    mod = LigerFusedLinearGRPOLoss(beta=beta, loss_type="dapo", use_ref_model=True)

    def run() -> torch.Tensor:
        out = mod(inp["hidden"], inp["weight"], inp["ids"], inp["mask"], inp["adv"], ref_per_token_logps=inp["ref"])
        return out[0] if isinstance(out, tuple) else out

    return run


def _floor_fn(inp: dict, scoring: bool = False) -> Callable[[], None]:
    # The GEMMs any head must run, over the valid tokens only: logits, and for the loss dH and dW
    valid = inp["mask"].reshape(-1) != 0
    h = inp["hidden"].detach().reshape(-1, inp["hidden"].shape[-1])[valid]  # [n_valid, H], outside the timing
    w = inp["weight"].detach()

    def run() -> None:
        logits = h @ w.t()  # [N, V]
        if not scoring:
            _dh = logits @ w  # [N, H]
            _dw = logits.t() @ h  # [V, H]

    return run


def loss_fn(provider: str, inp: dict, beta: float, chunk_tokens: int | None = None) -> Callable[[], object]:
    """A closure computing the scalar loss of `provider` on `inp` (call .backward() on it); floor: the GEMMs."""
    if provider == "floor":
        return _floor_fn(inp)
    if provider == "trl":
        return _trl_fn(inp, beta)
    if provider == "liger":
        return _liger_fn(inp, beta)
    fn = reference_grpo_loss if provider == "naive" else fused_linear_grpo_loss
    kw = {} if provider == "naive" else {"chunk_tokens": chunk_tokens, "lean": provider == "chunked-lean"}
    args = (inp["hidden"], inp["weight"], inp["ids"], inp["mask"], inp["adv"])
    return lambda: fn(*args, ref_logps=inp["ref"], beta=beta, loss_type="dapo", **kw)[0]


def score_fn(provider: str, inp: dict, chunk_tokens: int | None = None) -> Callable[[], tuple]:
    """A closure scoring `inp` without autograd (old/ref log-probs): (log-probs, entropies); floor: the GEMM."""
    if provider == "floor":
        return _floor_fn(inp, scoring=True)
    h, w, ids, mask = inp["hidden"].detach(), inp["weight"].detach(), inp["ids"], inp["mask"]

    @torch.no_grad()
    def run() -> tuple:
        if provider == "trl":
            return _trl_head({**inp, "hidden": h, "weight": w})
        if provider == "naive":
            return reference_logprobs(h, w, ids)
        return selective_logprobs(h, w, ids, mask=mask, return_entropy=True, chunk_tokens=chunk_tokens)

    return run
