"""The completions browser's model: an incremental index over a run's `completions.jsonl`.

The trainer appends one record per sampled completion:
    {"step": int, "prompt": str, "completion": str, "rewards": {func: float}, "advantage": float}
(bounded per step). Every step is kept: the index stores only each line's byte offset per step
and parses a step's lines when it is opened, so a long run costs memory per line, not per text.
`poll()` reads what was appended since the last call (call it from a worker thread; the UI may
read `steps` and `groups` meanwhile); a partial last line waits for its newline.
"""

from __future__ import annotations

import json
import os
import re
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Bytes indexed per poll (new lines, and older history, each): ~80,000 lines, a fraction of a second.
POLL_BUDGET_BYTES = 16 * 1024 * 1024
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

    Each `poll()` indexes at most `budget_bytes` of new lines and as much of the older history: a
    huge file is indexed newest-first over a few polls (the steps a user opens first are the
    recent ones), and no poll stalls its worker for long. `complete` says when all is indexed.

    Args:
        path: The run's completions.jsonl (it may not exist yet).
        budget_bytes: Bytes indexed per poll, for new lines and for the older history each.
    """

    def __init__(self, path: str | os.PathLike[str], budget_bytes: int = POLL_BUDGET_BYTES) -> None:
        self.path = Path(path)
        self.budget = budget_bytes
        self._end = 0  # everything from _back to _end (a line start) is indexed
        self._back: int | None = None  # None until the first poll finds the file
        self._lines: dict[int, array] = {}  # step -> start offsets of its lines, in file order
        self._steps: tuple[int, ...] | None = ()
        self._cache: tuple[int, list[PromptGroup]] | None = None

    def poll(self) -> bool:
        """Index lines appended since the last call (and some older history); True when anything was added."""
        try:
            handle = open(self.path, "rb")  # closed below
        except FileNotFoundError:
            return False
        with handle:
            size = os.fstat(handle.fileno()).st_size
            if self._back is None:  # first look: start near the end, newest steps first
                self._back = self._end = self._line_start(handle, max(0, size - self.budget))
            handle.seek(self._end)
            chunk = handle.read(min(self.budget, size - self._end))
            cut = chunk.rfind(b"\n") + 1  # a partial last line waits for its newline
            changed = self._index(chunk[:cut], self._end, prepend=False)
            self._end += cut
            if self._back > 0:
                lo = self._line_start(handle, max(0, self._back - self.budget))
                if lo == self._back:  # one line longer than the budget: take it whole
                    lo = self._line_start(handle, 0, before=self._back)
                handle.seek(lo)
                changed |= self._index(handle.read(self._back - lo), lo, prepend=True)
                self._back = lo
        return changed

    @property
    def complete(self) -> bool:
        """True once the whole file (up to its last complete line) has been indexed."""
        return self._back == 0

    @staticmethod
    def _line_start(handle: Any, pos: int, before: int | None = None) -> int:
        """The first line start at or after `pos` (or, with `before`, the last one before it)."""
        if before is not None:
            handle.seek(0)
            head = handle.read(before - 1) if before > 1 else b""
            return head.rfind(b"\n") + 1
        if pos == 0:
            return 0
        handle.seek(pos - 1)
        while block := handle.read(64 * 1024):
            nl = block.find(b"\n")
            if nl >= 0:
                return pos + nl
            pos += len(block)
        return pos

    def _index(self, data: bytes, base: int, *, prepend: bool) -> bool:
        found: dict[int, array] = {}
        pos = 0
        for line in data.split(b"\n")[:-1]:
            match = _STEP_RE.search(line)
            if match and line.rstrip().endswith(b"}"):
                found.setdefault(int(match.group(1)), array("q")).append(base + pos)
            pos += len(line) + 1
        for step, offsets in found.items():
            current = self._lines.get(step)
            if current is None:
                self._lines[step] = offsets
                self._steps = None
            elif prepend:
                self._lines[step] = offsets + current
            else:
                current.extend(offsets)
            if self._cache is not None and self._cache[0] == step:
                self._cache = None
        return bool(found)

    @property
    def steps(self) -> tuple[int, ...]:
        """Steps with at least one completion, ascending (cached between new steps)."""
        if self._steps is None:
            self._steps = tuple(sorted(self._lines))
        return self._steps

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
            grouped.setdefault(prompt, []).append(
                Completion(
                    text=_text(record.get("completion")),
                    rewards={
                        str(k): float(v)
                        for k, v in (record.get("rewards") or {}).items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)
                    },
                    advantage=float(record["advantage"]) if isinstance(record.get("advantage"), (int, float)) else None,
                )
            )
        groups = [PromptGroup(prompt, completions) for prompt, completions in grouped.items()]
        self._cache = (step, groups)
        return groups


def _text(value: Any) -> str:
    """Prompts and completions may be plain strings or chat message lists ([{role, content}])."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(
            f"{m.get('role', '')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in value
        )
    if isinstance(value, dict) and "content" in value:
        return str(value["content"])
    return "" if value is None else str(value)
