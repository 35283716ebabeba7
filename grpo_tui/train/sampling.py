"""The token choice of the static-cache decoder (`generation`): transformers' warpers as fixed-shape tensor
ops a CUDA graph can capture, and TRL's cut of a completion after its first EOS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Programs a row reduction over the vocabulary aims for (`vocab_parts`): one program per row leaves most of an
# H200's 132 SMs idle at 128 rows, and each of them streams the row's 152k logits several times
ROW_REDUCTION_PROGRAMS = 1024
# Most parts a row is cut into (each part stays thousands of columns long at a 152k vocabulary)
MAX_VOCAB_PARTS = 64


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
        return split_argmax(logits)
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
    # argmax(probs / E) = argmax(logits - log E): the softmax's shift and scale are the same for a whole row
    noise = torch.empty_like(logits).exponential_()
    return split_argmax(logits - noise.log())


def vocab_parts(rows: int, vocab: int) -> int:
    """Parts to cut each row's vocabulary into for a reduction: a power of two dividing `vocab`, enough for
    ROW_REDUCTION_PROGRAMS programs over all rows (1: the row whole)."""
    parts = 1
    while parts * rows < ROW_REDUCTION_PROGRAMS and parts < MAX_VOCAB_PARTS and vocab % (2 * parts) == 0:
        parts *= 2
    return parts


def split_argmax(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) of [R, V], the first maximum as argmax takes it, reduced in `vocab_parts` parts per row then
    across the parts, so torch.compile runs it on many programs instead of one per row."""
    rows, vocab = x.shape
    parts = vocab_parts(rows, vocab)
    if parts == 1:
        return x.argmax(-1)
    width = vocab // parts
    best, where = x.view(rows, parts, width).max(-1)  # [R, P]: each part's first maximum
    part = best.argmax(-1, keepdim=True)  # [R, 1]: the first part holding the row's maximum
    return (part * width + where.gather(1, part))[:, 0]


def split_logsumexp(x: torch.Tensor) -> torch.Tensor:
    """torch.logsumexp(x, -1) of [R, V], in `vocab_parts` parts per row then across them (see `split_argmax`)."""
    rows, vocab = x.shape
    parts = vocab_parts(rows, vocab)
    return torch.logsumexp(x.view(rows, parts, vocab // parts), -1).logsumexp(-1)


def token_logps(logits: torch.Tensor, token: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / temperature) at `token` per row [R]: what the training forward scores the token with
    (TRL divides by the temperature and applies no other warper), so the two are comparable."""
    scaled = logits / temperature if temperature != 1.0 else logits
    return scaled.gather(1, token[:, None])[:, 0] - split_logsumexp(scaled)


def cut_at_eos(tokens: torch.Tensor, eos_ids: list[int]) -> list[list[int]]:
    """Each row of [R, T] up to and including its first EOS (the whole row without one), as TRL keeps them."""
    rows = []
    eos = set(eos_ids)
    for row in tokens.tolist():
        end = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
        rows.append(row[:end])
    return rows
