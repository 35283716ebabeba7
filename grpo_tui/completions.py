"""The completions browser's model: an incremental index over a run's `completions.jsonl`.

The trainer appends one record per sampled completion:
    {"step": int, "prompt": str, "completion": str, "rewards": {func: float}, "advantage": float}
(bounded per step). Every step is kept: the index stores only each line's byte offset per step
and parses a step's lines when it is opened, so a long run costs memory per line, not per text.
`poll()` reads what was appended since the last call (call it from a worker thread); a partial
last line waits for its newline.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# `"step": N` as a JSON key (inside a JSON string a quote is escaped, so text cannot fake it).
_STEP_RE = re.compile(rb'"step"\s*:\s*(-?\d+)')


@dataclass(frozen=True)
class Completion:
    text: str
    rewards: dict[str, float]
    advantage: float | None

    @property
    def total_reward(self) -> float:
        return sum(self.rewards.values())


@dataclass(frozen=True)
class PromptGroup:
    """The completions sampled for one prompt at one step (GRPO's group)."""

    prompt: str
    completions: list[Completion] = field(default_factory=list)

    @property
    def mean_reward(self) -> float | None:
        totals = [c.total_reward for c in self.completions]
        return sum(totals) / len(totals) if totals else None


class CompletionIndex:
    """Steps available in a completions.jsonl and, on demand, their prompt groups.

    Args:
        path: The run's completions.jsonl (it may not exist yet).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offset = 0  # bytes indexed so far (always at a line start)
        self._lines: dict[int, array] = {}  # step -> start offsets of its lines
        self._cache: tuple[int, list[PromptGroup]] | None = None

    def poll(self) -> bool:
        """Index lines appended since the last call; True when new steps or lines arrived."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return False
        end = chunk.rfind(b"\n")
        if end < 0:
            return False
        changed = False
        pos = 0
        for line in chunk[: end + 1].split(b"\n")[:-1]:
            match = _STEP_RE.search(line)
            if match and line.strip().endswith(b"}"):
                step = int(match.group(1))
                self._lines.setdefault(step, array("q")).append(self._offset + pos)
                changed = True
                if self._cache is not None and self._cache[0] == step:
                    self._cache = None
            pos += len(line) + 1
        self._offset += end + 1
        return changed

    @property
    def steps(self) -> list[int]:
        """Steps with at least one completion, ascending."""
        return sorted(self._lines)

    def __len__(self) -> int:
        return len(self._lines)

    def count(self, step: int) -> int:
        return len(self._lines.get(step, ()))

    def records(self, step: int) -> list[dict[str, Any]]:
        """The raw records of one step, in file order (malformed lines skipped)."""
        offsets = self._lines.get(step)
        if not offsets:
            return []
        out = []
        with open(self.path, "rb") as handle:
            for offset in offsets:
                handle.seek(offset)
                try:
                    record = json.loads(handle.readline())
                except (json.JSONDecodeError, UnicodeDecodeError):
                    continue
                if isinstance(record, dict):
                    out.append(record)
        return out

    def groups(self, step: int) -> list[PromptGroup]:
        """The step's completions grouped by prompt (groups in order of first appearance)."""
        if self._cache is not None and self._cache[0] == step:
            return self._cache[1]
        grouped: dict[str, list[Completion]] = {}
        for record in self.records(step):
            prompt = _text(record.get("prompt"))
            grouped.setdefault(prompt, []).append(Completion(
                text=_text(record.get("completion")),
                rewards={str(k): float(v) for k, v in (record.get("rewards") or {}).items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)},
                advantage=float(record["advantage"]) if isinstance(record.get("advantage"), (int, float)) else None,
            ))
        groups = [PromptGroup(prompt, completions) for prompt, completions in grouped.items()]
        self._cache = (step, groups)
        return groups


def _text(value: Any) -> str:
    """Prompts and completions may be plain strings or chat message lists ([{role, content}])."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in value)
    if isinstance(value, dict) and "content" in value:
        return str(value["content"])
    return "" if value is None else str(value)
