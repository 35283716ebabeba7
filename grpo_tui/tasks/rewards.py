"""Reward functions by name, with TRL's signature `(completions, **columns) -> list[float]`.

`REWARDS` maps a preset's `rewards.functions[].name` to a function; a name of the form
`module:function` imports the user's own. Completions are strings for plain-text prompts and lists of
messages for chat prompts; both are accepted. No torch here: listing rewards must stay fast.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

RewardFunc = Callable[..., list[float]]

# A number as people write it: optional sign and $, thousands commas, decimals ("-1,234.50").
_NUMBER = r"-?\$?\s?\d[\d,]*(?:\.\d+)?|-?\$?\s?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
# Tried in order: the first pattern that matches wins (the last match of that pattern is taken).
_ANSWER_PATTERNS = (
    re.compile(r"####\s*(" + _NUMBER + ")"),
    re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}"),
    re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(" + _NUMBER + ")", re.IGNORECASE),
    re.compile(r"(?:^|\n)\s*A\s*:\s*(" + _NUMBER + ")"),
)
# Characters beyond which `length_penalty` starts to bite, and where it reaches -1 (twice that).
LENGTH_BUDGET = 1000


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, or the content of the last message of a chat completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        return content if isinstance(content, str) else str(content)
    return str(completion)


def normalize_number(text: str) -> Decimal | None:
    """`$1,234` -> 1234, `42.0` -> 42, `-3.50` -> -3.5; None when it is not a number."""
    cleaned = text.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value.normalize() if value == value.to_integral_value() else value


def extract_final_answer(text: str) -> Decimal | None:
    """The final numeric answer of a solution: `#### N`, `\\boxed{N}`, `The answer is N`, `A: N`, else the last number."""
    for pattern in _ANSWER_PATTERNS:
        matches = pattern.findall(text)
        if matches:
            return normalize_number(matches[-1])
    numbers = _NUMBER_RE.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def gsm8k_gold(answer: str) -> Decimal | None:
    """The gold answer of a GSM8K `answer` field (the number after `####`)."""
    _, sep, tail = answer.rpartition("####")
    return normalize_number(tail.strip().split()[0]) if sep and tail.strip() else extract_final_answer(answer)


def gsm8k_correct(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the completion's final answer equals the gold `#### N`, else 0.0."""
    scores = []
    for completion, gold_text in zip(completions, answer, strict=True):
        gold = gsm8k_gold(gold_text)
        predicted = extract_final_answer(completion_text(completion))
        scores.append(1.0 if gold is not None and predicted is not None and predicted == gold else 0.0)
    return scores


_FORMAT_RE = re.compile(r"####\s*(" + _NUMBER + r")\s*$")


def gsm8k_format(completions: list[Any], **_: Any) -> list[float]:
    """1.0 when the completion ends with `#### <number>` (the format the GSM8K presets ask for), else 0.0."""
    return [1.0 if _FORMAT_RE.search(completion_text(c).strip()) else 0.0 for c in completions]


def length_penalty(completions: list[Any], **_: Any) -> list[float]:
    """0 up to LENGTH_BUDGET characters, then linearly down to -1 at twice the budget."""
    scores = []
    for completion in completions:
        excess = max(0, len(completion_text(completion)) - LENGTH_BUDGET)
        scores.append(-min(1.0, excess / LENGTH_BUDGET))
    return scores


def addition_partial(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """Share of the answer's digits right in place: matches / max(len(answer), len(completion)).

    Extra or missing characters lower the score, so the only 1.0 is the exact answer; a near miss
    ("45" for 46) still earns credit, which gives a barely trained model a gradient to follow.
    """
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        predicted = completion_text(completion).strip()
        gold = str(gold).strip()
        matches = sum(p == g for p, g in zip(predicted, gold))
        scores.append(matches / max(len(gold), len(predicted), 1))
    return scores


def addition_exact(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """1.0 for exactly the sum, else 0.0."""
    return [
        1.0 if completion_text(c).strip() == str(g).strip() else 0.0 for c, g in zip(completions, answer, strict=True)
    ]


REWARDS: dict[str, RewardFunc] = {
    "gsm8k_correct": gsm8k_correct,
    "gsm8k_format": gsm8k_format,
    "length_penalty": length_penalty,
    "addition_partial": addition_partial,
    "addition_exact": addition_exact,
}


class RewardError(ValueError):
    """A reward name that cannot be resolved (one user-facing line)."""


def resolve_reward(name: str) -> RewardFunc:
    """A registered reward by name, or the user's `module:function`."""
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        raise RewardError(
            f"rewards.functions.name: unknown reward {name!r}; allowed: {', '.join(REWARDS)} or module:function"
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardError(f"rewards.functions.name: cannot import module {module_name!r} for {name!r}: {exc}") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise RewardError(f"rewards.functions.name: {module_name!r} has no function {attr!r}")
    return func
