"""The value types of the preset schema: bounds with their reasons, and validators for text and numbers.

Every bound is far beyond any real run and low enough that a typo is refused at validation time.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

# ---- bounds: far beyond any real run, low enough that a typo (10**18) is refused here rather than
# after 15-30 s of start-up, or by an allocation that takes the machine down ------------------------
# Sequences per device, completions per prompt, sub-batches: no accelerator holds 65,536 sequences.
MAX_BATCH = 65_536
# Tokens in a prompt, a completion or a kernel chunk: 2**20, the longest context windows of today's models.
MAX_TOKENS = 1_048_576
# Optimizer steps (and step intervals): 10**8 is three years at one step a second.
MAX_STEPS = 100_000_000
# Processes per machine, machines per job: the largest clusters run a few thousand nodes.
MAX_PROCESSES = 4_096
# Rows taken from a data set: more than any data set on the hub.
MAX_ROWS = 1_000_000_000
# LoRA rank: no released model has a hidden size above 16,384, and the rank cannot exceed it.
MAX_LORA_RANK = 16_384
# LoRA alpha: the update is scaled by alpha / r; 65,536 is 4x the largest rank at r = 16,384 and already
# 4,096x the usual 2r at r = 8: past it the adapter's first step swamps the base weights.
MAX_LORA_ALPHA = 65_536.0
# KL coefficient beta: the KL term is beta x a per-token KL of order 0.01-1; past 100 it outweighs any
# reward (within the reward weight bound) and the policy cannot move from the reference.
MAX_BETA = 100.0
# Seeds: numpy's seed range (transformers' set_seed seeds numpy with the same value).
SEED_LIMIT = 2**32
# |reward weight|: rewards are summed in fp32; larger weights swamp every other reward.
MAX_REWARD_WEIGHT = 1e6
# Sampling temperature: logits are divided by it; past 100 sampling is uniform noise.
MAX_TEMPERATURE = 100.0
# Paths: Linux's PATH_MAX for a whole path and NAME_MAX (bytes) for one component (else ENAMETOOLONG).
MAX_PATH = 4_096
MAX_PATH_PART_BYTES = 255
# One-line text (hub ids, splits, module names, hosts) and prose (templates, system prompts).
MAX_LINE = 1_024
MAX_PROSE = 100_000


def _no_bool(value: Any) -> Any:
    # Lax ints and floats take true/false as 1/0; `max_steps = true` is a mistake. Strict mode would
    # also refuse the strings the preset editor's form sends, so only bools are refused here.
    if isinstance(value, bool):
        raise ValueError("a number, not true/false")
    return value


def _one_line(value: str) -> str:
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise ValueError(f"one printable line, found U+{ord(bad):04X}")
    return value


# Prose may hold newlines and tabs; no other control characters and no lone surrogates (not encodable).
_PROSE_BAD_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _prose(value: str) -> str:
    bad = _PROSE_BAD_RE.search(value)
    if bad:
        raise ValueError(f"text without control characters or lone surrogates, found U+{ord(bad.group()):04X}")
    return value


def _path_text(value: str) -> str:
    long_part = next((p for p in value.split("/") if len(p.encode("utf-8")) > MAX_PATH_PART_BYTES), None)
    if long_part is not None:
        raise ValueError(f"each folder or file name at most {MAX_PATH_PART_BYTES} bytes")
    return value


# A choice of numbers (Literal[1, 2]) that refuses true/false as well: Python counts True as 1.
NOT_BOOL = BeforeValidator(_no_bool)
Int = Annotated[int, BeforeValidator(_no_bool)]
Float = Annotated[float, BeforeValidator(_no_bool)]
PositiveInt = Annotated[Int, Field(ge=1)]
NonNegFloat = Annotated[Float, Field(ge=0.0)]
Count = Annotated[Int, Field(ge=1, le=MAX_BATCH)]
Steps = Annotated[Int, Field(ge=0, le=MAX_STEPS)]
Tokens = Annotated[Int, Field(ge=1, le=MAX_TOKENS)]
Line = Annotated[str, Field(max_length=MAX_LINE), AfterValidator(_one_line)]
Prose = Annotated[str, Field(max_length=MAX_PROSE), AfterValidator(_prose)]
# A local path or a hub id: not empty, within PATH_MAX and NAME_MAX.
PathText = Annotated[
    str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_one_line), AfterValidator(_path_text)
]
