"""The token choice of the static-cache decoder (`generation`): transformers' warpers as fixed-shape tensor
ops a CUDA graph can capture, and TRL's cut of a completion after its first EOS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Sampling:
    """The token choice GRPOConfig asks of `model.generate`, in transformers' order."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    greedy: bool = False

    @classmethod
    def of_trainer(cls, trainer: Any) -> Sampling:
        return cls(trainer.temperature, trainer.top_k, trainer.top_p, trainer.min_p, trainer.repetition_penalty)


def seen_tokens(history: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, V + 1] bool: True where a row's `history` [R, S] holds the token (-1 = not a token, collected in column V)."""
    seen = torch.zeros(history.size(0), vocab + 1, dtype=torch.bool, device=history.device)
    return seen.scatter_(1, history.masked_fill(history < 0, vocab), True)


def choose_tokens(logits: torch.Tensor, sampling: Sampling, seen: torch.Tensor | None = None) -> torch.Tensor:
    """Next token per row from fp32 logits [R, V]; `seen` (`seen_tokens` of each row's history) feeds the repetition
    penalty. No host sync and fixed shapes, so the graph captures it with the decode step; a draw is
    torch.multinomial's own for one sample (an exponential race), written out because multinomial's argument
    check may wait for the device."""
    if sampling.repetition_penalty != 1.0 and seen is not None:
        vocab = logits.size(-1)
        penalised = torch.where(logits < 0, logits * sampling.repetition_penalty, logits / sampling.repetition_penalty)
        logits = torch.where(seen[:, :vocab], penalised, logits)
    if sampling.greedy:
        return logits.argmax(-1)
    if sampling.temperature != 1.0:
        logits = logits / sampling.temperature
    if sampling.top_k:
        kth = torch.topk(logits, min(sampling.top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(logits)  # ascending: the tail to drop comes first
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - sampling.top_p
        drop[:, -1] = False  # the most likely token always stays
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    if sampling.min_p is not None:
        probs = logits.softmax(-1)
        low = probs < sampling.min_p * probs.amax(-1, keepdim=True)  # the top token is never below it
        logits = logits.masked_fill(low, float("-inf"))
    probs = logits.softmax(-1)
    return (probs / torch.empty_like(probs).exponential_()).argmax(-1)


def token_logps(logits: torch.Tensor, token: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) at `token` per row [R]: what the training forward scores the token with
    (TRL divides by the temperature and applies no other warper), so the two are comparable."""
    scaled = logits / temperature if temperature != 1.0 else logits
    return scaled.gather(1, token[:, None])[:, 0] - torch.logsumexp(scaled, -1)


def cut_at_eos(tokens: torch.Tensor, eos_ids: list[int]) -> list[list[int]]:
    """Each row of [R, T] up to and including its first EOS (the whole row without one), as TRL keeps them."""
    rows = []
    eos = set(eos_ids)
    for row in tokens.tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
        rows.append(row[:end])
    return rows
