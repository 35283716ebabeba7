"""A user's reward function called once, before launch, on a sample of completions.

A `module:function` reward that returns the wrong thing (a number, a dict, a list of the wrong length or
of text) fails TRL 15-30 s into a run with a message about tensors. Called here on a sample of
SAMPLE_SIZE completions with the arguments TRL passes (the data's first row as the columns), its
answer is checked: a list of one number (or None, "no reward") per completion.
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable, Mapping
from typing import Any

from grpo_tui.userinput import clip

# Completions in the sample: more than one, so a reward returning a list of one is caught.
SAMPLE_COMPLETIONS: tuple[str, ...] = ("42", "I don't know.")
# Seconds the sample call may take before it is given up on (its thread is left to finish).
TRIAL_TIMEOUT_S = 10.0


def sample_prompt(template: str, row: Mapping[str, Any]) -> str:
    """The prompt `template` makes of `row`, or "" when it cannot (the template check says why)."""
    try:
        return template.format(**row)
    except Exception:  # a bad template is reported on its own
        return ""


def trial_kwargs(row: Mapping[str, Any], prompt: str) -> dict[str, Any]:
    """What TRL passes a reward for SAMPLE_COMPLETIONS of `prompt`: every column of `row` once per completion."""
    n = len(SAMPLE_COMPLETIONS)
    kwargs: dict[str, Any] = {str(k): [v] * n for k, v in row.items() if k != "prompt"}
    kwargs.update(
        prompts=[prompt] * n,
        completions=list(SAMPLE_COMPLETIONS),
        completion_ids=[[ord(c) for c in text] for text in SAMPLE_COMPLETIONS],
        trainer_state=None,
        log_extra=lambda *a, **k: None,
        log_metric=lambda *a, **k: None,
    )
    return kwargs


def reward_trial_problem(func: Callable[..., Any], row: Mapping[str, Any], prompt: str) -> str | None:
    """Why `func`'s answer on the sample is not a reward per completion (None when it is)."""
    n = len(SAMPLE_COMPLETIONS)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = func(**trial_kwargs(row, prompt))
        except BaseException as exc:  # the user's code may fail in any way
            outcome["error"] = exc

    thread = threading.Thread(target=call, name="grpo-tui-reward-trial", daemon=True)
    thread.start()
    thread.join(TRIAL_TIMEOUT_S)
    if thread.is_alive():
        return f"did not return within {TRIAL_TIMEOUT_S:.0f} s on a sample of {n} completions"
    if "error" in outcome:
        exc = outcome["error"]
        return f"raised {type(exc).__name__} on a sample of {n} completions: {clip(str(exc))}"
    value = outcome.get("value")
    wanted = f"a reward returns a list of {n} numbers for {n} completions (None: no reward)"
    if not isinstance(value, (list, tuple)):
        return f"returned {clip(_repr(value))} ({type(value).__name__}); {wanted}"
    if len(value) != n:
        return f"returned a list of {len(value)} for {n} completions; {wanted}"
    bad = [v for v in value if not _is_reward(v)]
    if bad:
        return f"returned {clip(_repr(bad[0]))} ({type(bad[0]).__name__}) in its list; {wanted}"
    return None


def _is_reward(value: Any) -> bool:
    """A number TRL turns into a float (numpy scalars too), or None; not a bool (a reward is not a flag)."""
    return value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool))


def _repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception:  # a user object whose repr fails
        return f"<{type(value).__name__}>"
