"""Reward functions by name, with TRL's signature `(completions, **columns) -> list[float]`.

`REWARDS` maps a preset's `rewards.functions[].name` to a function; a name of the form
`module:function` imports the user's own. Completions are strings for plain-text prompts and lists of
messages for chat prompts; both are accepted. No torch here: listing rewards must stay fast.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Collection
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


# The keywords TRL 1.16's GRPOTrainer passes to every reward function, besides the data's columns
# (`reward_func(prompts=, completions=, completion_ids=, **columns, trainer_state=, log_extra=, log_metric=)`).
TRL_REWARD_KWARGS: tuple[str, ...] = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
)
# `package.module:function`, each part a Python identifier.
REFERENCE_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


class RewardError(ValueError):
    """A reward name that cannot be resolved (one user-facing line)."""


def resolve_reward(name: str) -> RewardFunc:
    """A registered reward by name, or the user's `module:function` (imported: its top-level code runs).

    The working folder is searched too, as `python -m` does: the `grpo-tui` console script's
    sys.path starts with its own bin folder, so a reward module beside the user's files was not found.
    The trainer runs in the folder `grpo-tui run` was started in, so both find the same module.
    """
    if name in REWARDS:
        return REWARDS[name]
    if ":" not in name:
        raise RewardError(
            f"rewards.functions.name: unknown reward {name!r}; allowed: {', '.join(REWARDS)} or module:function"
        )
    if not REFERENCE_RE.fullmatch(name):
        raise RewardError(f"rewards.functions.name: got {name!r}; expected module:function (Python names)")
    module_name, _, attr = name.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)  # after installed packages: a local file must not shadow them
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way on import
        raise RewardError(
            f"rewards.functions.name: cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise RewardError(f"rewards.functions.name: module {module_name!r} has no function {attr!r}")
    return func


def signature_problem(func: Callable[..., Any], columns: Collection[str] | None = None) -> str | None:
    """Why TRL cannot call `func` as a reward (None when it can).

    TRL passes everything by keyword: `func` must take **kwargs or name each of TRL_REWARD_KWARGS (and
    each column, when `columns` is known), and must need nothing else.
    """
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature to read: TRL will tell at run time
        return None
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    passed = {*TRL_REWARD_KWARGS, *(columns or ())}
    for p in params:
        required = p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        # With the columns unknown, a required name that TRL does not pass may be a column.
        never_passed = p.name not in passed and columns is not None
        if required and (p.kind is p.POSITIONAL_ONLY or never_passed):
            what = "positional-only" if p.kind is p.POSITIONAL_ONLY else "neither a column of the data nor"
            return (
                f"its parameter {p.name!r} is {what} one TRL passes; "
                f"TRL calls f({', '.join(TRL_REWARD_KWARGS)}, **columns) by keyword"
            )
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    missing = sorted(passed - names)
    if missing:
        return f"it takes no {', '.join(missing)}; add **kwargs (TRL passes {', '.join(TRL_REWARD_KWARGS)} and every column)"
    return None
