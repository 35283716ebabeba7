"""Sampled completions per step and prompt group: each completion's reward per function and its
advantage. Every logged step stays browsable ([ / ] step back / forward, Home / End)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static

from grpo_tui.runs.completions import PromptGroup


def render_groups(step: int, groups: Sequence[PromptGroup]) -> Group | Text:
    """One table per prompt group: completion, each reward function, total and advantage."""
    if not groups:
        return Text(f"step {step}: no completions recorded", "dim")
    parts: list[Any] = []
    for gi, group in enumerate(groups):
        prompt = group.prompt
        items = group.completions
        funcs: list[str] = []
        for item in items:
            for name in item.rewards:
                if name not in funcs:
                    funcs.append(name)
        table = Table(box=None, expand=True, pad_edge=False, header_style="bold dim")
        table.add_column("#", justify="right", style="dim", width=3)
        table.add_column("completion", ratio=3, overflow="fold")
        for name in funcs:
            table.add_column(name, justify="right")
        table.add_column("advantage", justify="right")
        for i, item in enumerate(items):
            rewards = item.rewards
            adv = item.advantage
            adv_text = Text(
                "n/a" if adv is None else f"{adv:+.3f}",
                "green" if (adv or 0) > 0 else "red" if (adv or 0) < 0 else "dim",
            )
            cells = [str(i), item.text.replace("\n", "\\n")]
            cells += [_reward_cell(rewards.get(name)) for name in funcs]
            table.add_row(*cells, adv_text)
        head = Text.assemble(
            (f"group {gi + 1}/{len(groups)} ", "bold"),
            ("prompt: ", "dim"),
            (prompt.replace("\n", "\\n")[:200], "italic"),
        )
        parts.extend([head, table, Text("")])
    return Group(*parts)


def _reward_cell(value: Any) -> Text:
    if value is None:
        return Text("—", "dim")
    return Text(f"{value:.2f}", "green" if value >= 0.999 else "yellow" if value > 0 else "dim")


class CompletionsBrowser(VerticalScroll):
    """Shows one step's groups; `steps` grows as the run logs; follows the newest step until moved."""

    DEFAULT_CSS = """
    CompletionsBrowser { height: 1fr; }
    CompletionsBrowser > #completions-head { height: 1; background: $boost; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.steps: tuple[int, ...] = ()
        self.step: int | None = None
        self.follow = True

    def compose(self):  # type: ignore[no-untyped-def]
        yield Static(id="completions-head")
        yield Static(Text("no completions yet (the trainer writes completions.jsonl)", "dim"), id="completions-body")

    @dataclass
    class StepChosen(Message):
        """The browser wants this step's groups (the screen loads them in a worker)."""

        step: int

    def set_steps(self, steps: Sequence[int]) -> None:
        """New list of steps with completions; asks for the newest when following it."""
        if tuple(steps) == self.steps:
            return
        self.steps = tuple(steps)
        if not self.visible_now:  # nothing to draw behind another tab; catch up when shown
            return
        if self.steps and (self.follow or self.step is None):
            self.show_step(self.steps[-1])
        else:
            self._head()

    visible_now = False

    def shown(self) -> None:
        """Its tab became active: draw the step it follows (or keeps)."""
        self.visible_now = True
        if self.steps:
            self.show_step(self.steps[-1] if self.follow or self.step is None else self.step)

    def hidden(self) -> None:
        self.visible_now = False

    def move(self, delta: int) -> None:
        """Step back (-1) / forward (+1); big deltas jump to the ends."""
        if not self.steps:
            return
        index = self.steps.index(self.step) if self.step in self.steps else len(self.steps) - 1
        index = min(len(self.steps) - 1, max(0, index + delta))
        self.follow = index == len(self.steps) - 1
        self.show_step(self.steps[index])

    def show_step(self, step: int) -> None:
        self.step = step
        self._head()
        self.post_message(self.StepChosen(step))

    def show_groups(self, step: int, groups: Sequence[PromptGroup]) -> None:
        """Draw a step's groups (ignored when the user has moved on to another step meanwhile)."""
        if step != self.step:
            return
        self.query_one("#completions-body", Static).update(render_groups(step, groups))

    def _head(self) -> None:
        where = f"step {self.step}" if self.step is not None else "—"
        follow = "following newest" if self.follow else "[End] follow newest"
        self.query_one("#completions-head", Static).update(
            Text.assemble(
                (f" {where} ", "bold reverse"),
                f"  {len(self.steps)} steps logged  ",
                ("[ ] step  Home/End  ", "dim"),
                (follow, "dim"),
            )
        )
