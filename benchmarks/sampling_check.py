"""The sampling check of `generation_bench.py`: the mean log-prob of sampled tokens under the model, and each
backend's means against the baseline's in units of their combined standard error."""

from __future__ import annotations

from typing import Any

import torch


def mean_logprob(
    model: Any, prompts: list[list[int]], completions: list[list[int]], pad: int, rows: int
) -> tuple[float, list[float]]:
    """Mean log-prob of the sampled tokens under the model (one teacher-forced forward per slice), and each
    completion's own mean (their spread gives the standard error of a run's mean)."""
    total, count, per_completion = 0.0, 0, []
    for start in range(0, len(prompts), rows):
        ps, cs = prompts[start : start + rows], completions[start : start + rows]
        width, length = max(map(len, ps)), max(map(len, cs))
        seqs = [[pad] * (width - len(p)) + p + c + [pad] * (length - len(c)) for p, c in zip(ps, cs, strict=True)]
        masks = [[0] * (width - len(p)) + [1] * (len(p) + len(c)) + [0] * (length - len(c)) for p, c in zip(ps, cs)]
        ids = torch.tensor(seqs, device=model.device)
        mask = torch.tensor(masks, device=model.device)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=length + 1).logits[:, :-1]
        logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, width:, None]).squeeze(-1)  # [R, T]
        keep = mask[:, width:].bool()
        total += logps[keep].sum().item()
        count += int(keep.sum())
        sums, lengths = (logps * keep).sum(-1), keep.sum(-1)
        per_completion += (sums / lengths.clamp(min=1))[lengths > 0].tolist()
    return total / max(count, 1), per_completion


def standard_error(values: list[float]) -> float:
    """The standard error of the mean: the run-to-run spread of a mean over this many independent samples."""
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5


def sampling_match(checks: list[dict[str, Any]], baseline: str = "generate") -> list[dict[str, Any]]:
    """Each backend's sampling check against the baseline's: the differences of the means in units of their
    combined standard error (|z| <= 3: within run-to-run spread)."""
    base = next((c for c in checks if c["backend"] == baseline), None)
    rows = []
    for c in checks:
        if base is None or c is base:
            continue
        row = {"backend": c["backend"], "against": baseline}
        for key in ("mean_logprob", "length_mean"):
            se = (c[f"{key}_se"] ** 2 + base[f"{key}_se"] ** 2) ** 0.5
            row[f"{key}_diff"] = c[key] - base[key]
            row[f"{key}_z"] = row[f"{key}_diff"] / se if se > 0 else float("nan")
        row["within_spread"] = all(abs(row[f"{k}_z"]) <= 3 for k in ("mean_logprob", "length_mean"))
        rows.append(row)
    return rows
