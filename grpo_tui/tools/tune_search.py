"""The search behind `grpo-tui tune`, apart from how a trial runs (so it is tested with a fake runner).

Bounded by a time budget (a trial starts only when the mean trial so far still fits in what is left):

1. batch: the largest per-device batch (a multiple of num_generations) that fits with the preset's
   own settings, doubling then bisecting (as `grpo-tui max-batch` does);
2. options: at that batch and at 2x and 4x it, each memory option the schema has (loss_sub_batch,
   activation_offload, generation_sub_batch, scoring_sub_batch, loss.lean) alone, then the helpful
   ones combined: those faster than the plain trial where it fits, else those that fit alone, else all;
3. accumulation: the fastest trial again with twice the gradient accumulation (the same memory,
   fewer optimizer steps per completion).

The fastest trial that fits wins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from grpo_tui.config.schema import Preset, walk_fields

STATUS_FIT, STATUS_OOM, STATUS_OVER, STATUS_ERROR = "fit", "OOM", "over cap", "error"
BATCH_LIMIT = 4096  # the largest per-device batch tried


class MemoryOption(NamedTuple):
    """A setting that trades speed for memory: its dotted path and the value tried at a per-device batch."""

    path: str
    value: Callable[[int], Any]


def _quarter(batch: int) -> int:
    return max(1, batch // 4)


# The options searched, in the order tried; those missing from the schema are skipped.
MEMORY_OPTIONS = (
    MemoryOption("grpo.loss_sub_batch", _quarter),
    MemoryOption("grpo.activation_offload", lambda batch: True),
    MemoryOption("grpo.generation_sub_batch", _quarter),
    MemoryOption("grpo.scoring_sub_batch", _quarter),
    MemoryOption("loss.lean", lambda batch: True),
)
BATCH, ACCUM = "grpo.per_device_batch_size", "grpo.gradient_accumulation_steps"


class Measurement(NamedTuple):
    """What one trial run reports; the search judges the fit from it."""

    ok: bool
    oom: bool = False
    peak_gib: float | None = None
    step_s: float | None = None
    tokens_per_s: float | None = None
    reason: str = ""
    wall_s: float = 0.0


@dataclass
class TuneTrial:
    """One trial: its settings (dotted path -> value), what it measured and whether it fits."""

    index: int
    phase: str
    settings: dict[str, Any]
    status: str
    peak_gib: float | None = None
    step_s: float | None = None
    tokens_per_s: float | None = None
    reason: str = ""
    wall_s: float = 0.0

    @property
    def fits(self) -> bool:
        return self.status == STATUS_FIT


@dataclass
class TuneResult:
    trials: list[TuneTrial] = field(default_factory=list)
    best: TuneTrial | None = None
    out_of_budget: bool = False


TrialRunner = Callable[[dict[str, Any], float], Measurement]  # (settings, seconds left) -> measurement


def available_options(fields: set[str] | None = None) -> list[MemoryOption]:
    """The memory options this schema has (fields being added elsewhere may not exist yet)."""
    known = fields if fields is not None else {f.path for f in walk_fields()}
    return [option for option in MEMORY_OPTIONS if option.path in known]


def preset_value(preset: Preset, path: str) -> Any:
    section, name = path.split(".", 1)
    return getattr(getattr(preset, section), name, None)


class TuneSearch:
    """The search (see the module docstring); `runner` runs one trial, `clock` measures the budget."""

    def __init__(
        self,
        runner: TrialRunner,
        *,
        cap_gib: float,
        budget_s: float,
        batch_step: int,
        base: dict[str, Any],
        options: list[MemoryOption],
        limit: int = BATCH_LIMIT,
        clock: Callable[[], float] = time.monotonic,
        on_trial: Callable[[TuneTrial], None] | None = None,
        on_start: Callable[[int, dict[str, Any]], None] | None = None,
    ) -> None:
        self.runner, self.cap_gib, self.budget_s, self.step = runner, cap_gib, budget_s, batch_step
        self.base, self.options, self.limit, self.clock = base, options, limit, clock
        self.on_trial, self.on_start = on_trial, on_start
        self.result = TuneResult()
        self._start = 0.0
        self._seen: dict[str, TuneTrial] = {}

    def elapsed(self) -> float:
        return self.clock() - self._start

    def run(self) -> TuneResult:
        self._start = self.clock()
        try:
            self._search()
        except _OutOfBudget:
            self.result.out_of_budget = True
        self.result.best = max((t for t in self.result.trials if t.fits), key=_speed, default=None)
        return self.result

    def _search(self) -> None:
        from grpo_tui.tools.max_batch import find_max_batch

        start = min(self.limit, max(self.step, self.base.get(BATCH) or self.step))
        best_batch, _ = find_max_batch(lambda b: self.trial("batch", {BATCH: b}).fits, self.step, start, self.limit)
        batches = [best_batch, 2 * best_batch, 4 * best_batch] if best_batch else [self.step]
        for batch in (b for b in batches if b <= self.limit):
            if not self._options_at(batch) and batch > best_batch:
                break  # nothing fits at this batch: a larger one will not either
        fastest = max((t for t in self.result.trials if t.fits), key=_speed, default=None)
        if fastest is not None:
            accum = fastest.settings.get(ACCUM, self.base.get(ACCUM) or 1)
            self.trial("accumulation", {**fastest.settings, ACCUM: 2 * accum})

    def _options_at(self, batch: int) -> bool:
        """Each option alone at `batch`, then the helpful ones together; True when anything fit there."""
        plain = self.trial("batch", {BATCH: batch})
        singles: list[tuple[MemoryOption, TuneTrial]] = []
        for option in self.options:
            value = option.value(batch)
            if value != self.base.get(option.path):  # the preset already has it: the plain trial covers it
                singles.append((option, self.trial("option", {BATCH: batch, option.path: value})))
        fitting = [(option, t) for option, t in singles if t.fits]
        if plain.fits:
            # Worth combining: the options that made the step faster on their own.
            chosen = [option for option, t in fitting if _speed(t) > _speed(plain)]
        else:
            # Worth combining: those that fit alone; when none does, all of them may fit together.
            chosen = [option for option, _ in fitting] or [option for option, _ in singles]
        tried = [plain, *(t for _, t in singles)]
        if len(chosen) >= 2:
            tried.append(self.trial("combined", {BATCH: batch, **{o.path: o.value(batch) for o in chosen}}))
        return any(t.fits for t in tried)

    def trial(self, phase: str, settings: dict[str, Any]) -> TuneTrial:
        """Run one trial (or return the earlier one with the same settings); raises when out of budget."""
        key = json.dumps(settings, sort_keys=True)
        if key in self._seen:
            return self._seen[key]
        walls = [t.wall_s for t in self.result.trials]
        estimate = sum(walls) / len(walls) if walls else 0.0
        left = self.budget_s - self.elapsed()
        if left <= 0 or (walls and estimate > left):
            raise _OutOfBudget
        index = len(self.result.trials) + 1
        if self.on_start is not None:
            self.on_start(index, settings)
        got = self.runner(settings, left)
        trial = TuneTrial(index, phase, settings, self._judge(got), got.peak_gib, got.step_s, got.tokens_per_s)
        trial.reason, trial.wall_s = got.reason, got.wall_s
        self.result.trials.append(trial)
        self._seen[key] = trial
        if self.on_trial is not None:
            self.on_trial(trial)
        return trial

    def _judge(self, got: Measurement) -> str:
        if got.oom:
            return STATUS_OOM
        if not got.ok or got.tokens_per_s is None:  # a run without a measurable step cannot win
            return STATUS_ERROR
        if got.peak_gib is None or got.peak_gib > self.cap_gib:
            return STATUS_OVER
        return STATUS_FIT


def _speed(trial: TuneTrial) -> float:
    return trial.tokens_per_s or 0.0


class _OutOfBudget(Exception):
    """The next trial would not finish inside the time budget."""
