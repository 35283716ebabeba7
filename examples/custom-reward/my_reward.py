"""A reward of your own: `module:function` in a preset's [rewards], imported from the working folder.

TRL calls it by keyword with the completions and every column of the data (here `answer`), plus a
few of its own arguments (hence **kwargs). It returns one number per completion (None: no reward).
Before a run starts, grpo-tui calls it once on a sample to check exactly that.
"""


def digits_in_place(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """The share of the answer's digits the completion has in the right place (1.0: exact)."""
    rewards = []
    for completion, expected in zip(completions, answer):
        got = completion.strip()
        right = sum(1 for a, b in zip(got, expected) if a == b)
        rewards.append(right / max(len(expected), len(got), 1))
    return rewards
